package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// Options describe the store under test.
type Options struct {
	// Open returns a new, empty store.
	Open func(t *testing.T) store.Store
	// Reopen, when set, returns another Store on the same database as s
	// (another replica); tests of concurrent writers use it.
	Reopen func(t *testing.T, s store.Store) store.Store
	// Limits: the store re-checks NewLease.Limit.
	Limits bool
	// Only, when set, names the tests to run (all otherwise).
	Only []string
}

// Run runs the suite.
func Run(t *testing.T, o Options) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Options)
	}{
		{"Capacity", testCapacity},
		{"BatchRefusals", testBatchRefusals},
		{"Transitions", testTransitions},
		{"ExpiredBy", testExpiredBy},
		{"LostPartsAndCaps", testLostPartsAndCaps},
		{"Idempotency", testIdempotency},
		{"Events", testEvents},
		{"Heartbeats", testHeartbeats},
		{"Limits", testLimits},
		{"ConcurrentWriters", testConcurrentWriters},
		{"ConcurrentIdempotencyKey", testConcurrentKey},
		{"Moves", testMoves},
		{"AdoptPart", testAdoptPart},
		{"FinishMoveToGoneNode", testFinishMoveToGoneNode},
		{"Cordon", testCordon},
		{"ConcurrentMoves", testConcurrentMoves},
		{"ReplaceTokens", testReplaceTokens},
		{"RemoveNode", testRemoveNode},
		{"RemovalRevoked", testRemovalRevoked},
		{"UnrecordedRemovalRevoked", testUnrecordedRemovalRevoked},
		{"UnrevokedRemoved", testUnrevokedRemoved},
		{"Revocations", testRevocations},
		{"HeartbeatAfterRemove", testHeartbeatAfterRemove},
		{"JoinTakeover", testJoinTakeover},
		{"JoinPrevCredential", testJoinPrevCredential},
		{"JoinEarlierCredential", testJoinEarlierCredential},
		{"ReplaceParts", testReplaceParts},
		{"GatewayKey", testGatewayKey},
		{"Prune", testPrune},
		{"LeasePages", testLeasePages},
	} {
		if o.Only != nil && !slices.Contains(o.Only, tc.name) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) { tc.f(t, o) })
	}
}

func open(t *testing.T, o Options) store.Store {
	s := o.Open(t)
	t.Cleanup(func() { s.Close() })
	return s
}

// oneNode joins a node with one block device of capacity bytes.
func oneNode(t *testing.T, s store.Store, capacity int64) (nodeID, devID string) {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	n, _, err := s.JoinNode(ctx, store.JoinNode{
		Node:           api.Node{ID: "node-1", Name: "n1", State: api.NodeReady, Fingerprint: api.Fingerprint{MachineID: "m1"}, LastHeartbeat: now, JoinedAt: now},
		CredentialHash: "h1", AgentKey: "k1", Devices: []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: capacity}},
	}, api.Event{Type: "node.joined"})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := s.Devices(ctx)
	if err != nil || len(devs) != 1 {
		t.Fatalf("devices %v %v", devs, err)
	}
	return n.ID, devs[0].ID
}

func lease(id, tenant, node, dev string, off, length int64) api.Lease {
	now := time.Now().UTC()
	return api.Lease{ID: id, State: api.LeaseReserved, Kind: api.KindBlock, Mode: api.ModeShared, Tenant: tenant, CreatedAt: now, UpdatedAt: now,
		ExpiresAt: now.Add(time.Hour), Parts: []api.Part{{NodeID: node, DeviceID: dev, Offset: off, Length: length}}}
}

func testCapacity(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 100)
	for _, c := range []struct {
		id       string
		off, len int64
		ok       bool
	}{
		{"a", 0, 50, true}, {"b", 40, 20, false}, {"c", 50, 50, true}, {"d", 99, 2, false}, {"e", -1, 1, false}, {"f", 100, 1, false},
	} {
		_, err := s.CreateLease(ctx, lease(c.id, "t", node, dev, c.off, c.len), store.Demand{}, nil, api.Event{})
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, store.ErrCapacity)) {
			t.Fatalf("%s %d+%d: %v", c.id, c.off, c.len, err)
		}
	}
	if _, err := s.Lease(ctx, "b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("refused lease was stored: %v", err)
	}
	if _, err := s.TransitionLease(ctx, "a", store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseReleased}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateLease(ctx, lease("g", "t", node, dev, 10, 30), store.Demand{}, nil, api.Event{}); err != nil {
		t.Fatalf("freed range not reusable: %v", err)
	}
	devs, _ := s.Devices(ctx)
	if devs[0].Allocated != 80 {
		t.Fatalf("allocated %d, want 80", devs[0].Allocated)
	}
	// A down node takes no reservation.
	if err := s.SetNodeState(ctx, node, api.NodeReady, api.NodeDown, api.Event{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateLease(ctx, lease("h", "t", node, dev, 90, 10), store.Demand{}, nil, api.Event{}); !errors.Is(err, store.ErrCapacity) {
		t.Fatalf("reserved on a down node: %v", err)
	}
}

// testBatchRefusals: creations refused within one batch (a range an
// earlier creation of the batch took, a range past the capacity, a used
// idempotency key) leave nothing behind and do not stop the others.
func testBatchRefusals(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	lb, ok := s.(store.LeaseBatcher)
	if !ok {
		t.Skip("not a LeaseBatcher")
	}
	node, dev := oneNode(t, s, 100)
	if _, err := s.CreateLease(ctx, lease("k", "t", node, dev, 90, 10), store.Demand{}, &store.Idempotency{Tenant: "t", Key: "used", RequestHash: "h"}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	create := func(id string, off, length int64, key string) store.LeaseOp {
		n := &store.NewLease{Lease: lease(id, "t", node, dev, off, length), Event: api.Event{Type: "lease.reserved", Subject: id}}
		if key != "" {
			n.Idem = &store.Idempotency{Tenant: "t", Key: key, RequestHash: "h"}
		}
		return store.LeaseOp{Create: n}
	}
	ops := []store.LeaseOp{create("a", 0, 50, ""), create("b", 40, 20, ""), create("c", 50, 30, "fresh"), create("d", 85, 10, ""), create("e", 80, 5, "used")}
	want := []error{nil, store.ErrCapacity, nil, store.ErrCapacity, store.ErrDuplicate}
	out, errs, err := lb.LeaseOps(ctx, ops)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		id := ops[i].Create.Lease.ID
		if (w == nil) != (errs[i] == nil) || (w != nil && !errors.Is(errs[i], w)) {
			t.Fatalf("%s: %v, want %v", id, errs[i], w)
		}
		_, gerr := s.Lease(ctx, id)
		if w == nil && (gerr != nil || out[i].State != api.LeaseReserved) {
			t.Fatalf("%s: %+v, read back: %v", id, out[i], gerr)
		}
		if w != nil && !errors.Is(gerr, store.ErrNotFound) {
			t.Fatalf("refused %s was stored: %v", id, gerr)
		}
	}
	if devs, _ := s.Devices(ctx); devs[0].Allocated != 90 {
		t.Fatalf("allocated %d, want 90", devs[0].Allocated)
	}
}

// testGatewayKey: a lease's gateway key (a shared accel lease's) comes
// back with its live parts, for placement.
func testGatewayKey(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 100)
	for _, l := range []struct {
		id, key string
		off     int64
	}{{"k1", "digest-a", 0}, {"k2", "", 10}} {
		if _, err := s.CreateLease(ctx, lease(l.id, "t", node, dev, l.off, 10), store.Demand{Gateway: l.key}, nil, api.Event{}); err != nil {
			t.Fatal(err)
		}
	}
	inv, err := s.Inventory(ctx)
	if err != nil || len(inv.Parts) != 2 {
		t.Fatalf("inventory %+v %v", inv.Parts, err)
	}
	for _, p := range inv.Parts {
		if want := map[string]string{"k1": "digest-a", "k2": ""}[p.LeaseID]; p.Demand.Gateway != want {
			t.Fatalf("lease %s: gateway key %q, want %q", p.LeaseID, p.Demand.Gateway, want)
		}
	}
}

func testTransitions(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 100)
	for i, id := range []string{"a", "b"} {
		if _, err := s.CreateLease(ctx, lease(id, "t", node, dev, int64(i)*50, 50), store.Demand{}, nil, api.Event{}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	ch := func(from, to api.LeaseState) store.LeaseChange {
		return store.LeaseChange{From: []api.LeaseState{from}, To: to, At: now}
	}
	act := ch(api.LeaseReserved, api.LeaseActive)
	act.URIs, act.URI, act.ExpiresAt, act.TTL = []string{"nbd://x/a"}, "nbd://x/a", now.Add(2*time.Hour), 7200
	ops := []store.LeaseOp{
		{Transition: store.Transition{ID: "a", Change: act, Event: api.Event{Type: "lease.active", Subject: "a"}}},
		{Transition: store.Transition{ID: "b", Change: ch(api.LeaseActive, api.LeaseReleasing)}}, // b is reserved: refused
		{Transition: store.Transition{ID: "zz", Change: ch(api.LeaseReserved, api.LeaseActive)}},
		{Transition: store.Transition{ID: "a", Change: ch(api.LeaseActive, api.LeaseReleased), Event: api.Event{Type: "lease.released", Subject: "a"}}}, // sees the first
		{Transition: store.Transition{ID: "b", Change: ch(api.LeaseReserved, api.LeaseFailed)}},
	}
	lb, ok := s.(store.LeaseBatcher)
	if !ok {
		t.Skip("not a LeaseBatcher")
	}
	out, errs, err := lb.LeaseOps(ctx, ops)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, store.ErrConflict, store.ErrNotFound, nil, nil} {
		if (want == nil) != (errs[i] == nil) || (want != nil && !errors.Is(errs[i], want)) {
			t.Fatalf("op %d: %v, want %v", i, errs[i], want)
		}
		if want == nil && out[i].State != ops[i].Transition.Change.To {
			t.Fatalf("op %d: state %s", i, out[i].State)
		}
	}
	if out[0].Parts[0].URI != "nbd://x/a" || out[0].TTLSeconds != 7200 || !out[0].ExpiresAt.Equal(now.Add(2*time.Hour)) {
		t.Fatalf("activation not applied: %+v", out[0])
	}
	got, err := s.Lease(ctx, "a")
	if err != nil || !reflect.DeepEqual(got, out[3]) {
		t.Fatalf("read back\n%+v\nreturned\n%+v (%v)", got, out[3], err)
	}
	if l, _ := s.Lease(ctx, "b"); l.State != api.LeaseFailed {
		t.Fatalf("b is %s", l.State)
	}
	if devs, _ := s.Devices(ctx); devs[0].Allocated != 0 {
		t.Fatalf("allocated %d after both ended", devs[0].Allocated)
	}
	if _, err := s.TransitionLease(ctx, "a", store.LeaseChange{From: []api.LeaseState{api.LeaseReleased}, To: api.LeaseReleased, Tenant: "other"}, api.Event{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant's lease: %v", err)
	}
}

// testExpiredBy: a transition with ExpiredBy applies only to a lease whose
// expires_at is before it (an expiry that a renewal did not overtake),
// through TransitionLease and through LeaseOps.
func testExpiredBy(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 100)
	l := lease("a", "t", node, dev, 0, 50) // expires in an hour
	if _, err := s.CreateLease(ctx, l, store.Demand{}, nil, api.Event{}); err != nil {
		t.Fatal(err)
	}
	expire := func(by time.Time) store.LeaseChange {
		return store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseExpired, At: time.Now().UTC(), ExpiredBy: by}
	}
	if _, err := s.TransitionLease(ctx, "a", expire(l.ExpiresAt), api.Event{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("expiry of a lease that runs until then: %v, want ErrConflict", err)
	}
	if lb, ok := s.(store.LeaseBatcher); ok {
		_, errs, err := lb.LeaseOps(ctx, []store.LeaseOp{{Transition: store.Transition{ID: "a", Change: expire(l.ExpiresAt.Add(-time.Second))}}})
		if err != nil || !errors.Is(errs[0], store.ErrConflict) {
			t.Fatalf("batched expiry of a lease that runs past it: %v %v, want ErrConflict", errs, err)
		}
	}
	if got, _ := s.Lease(ctx, "a"); got.State != api.LeaseReserved {
		t.Fatalf("a is %s", got.State)
	}
	got, err := s.TransitionLease(ctx, "a", expire(l.ExpiresAt.Add(time.Second)), api.Event{})
	if err != nil || got.State != api.LeaseExpired {
		t.Fatalf("expiry after expires_at: %v %+v", err, got)
	}
}

// testLostPartsAndCaps: a lease keeps its caps; a transition that marks
// a part lost keeps the others and frees that part's range, through
// TransitionLease and through LeaseOps.
func testLostPartsAndCaps(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 100)
	now := time.Now().UTC()
	for i, id := range []string{"a", "b"} {
		l := lease(id, "t", node, dev, int64(i)*50, 25)
		l.Parts = append(l.Parts, api.Part{NodeID: node, DeviceID: dev, Offset: int64(i)*50 + 25, Length: 25})
		l.Count, l.BandwidthCap, l.IOPSCap = 2, 50<<20, 2000
		if _, err := s.CreateLease(ctx, l, store.Demand{}, nil, api.Event{}); err != nil {
			t.Fatal(err)
		}
		act := store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseActive, At: now, URIs: []string{"nbd://x/" + id + "0", "nbd://x/" + id + "1"}}
		if _, err := s.TransitionLease(ctx, id, act, api.Event{}); err != nil {
			t.Fatal(err)
		}
	}
	lose := store.LeaseChange{From: []api.LeaseState{api.LeaseActive}, To: api.LeaseActive, At: now, LostParts: []int{1}}
	if _, err := s.TransitionLease(ctx, "a", lose, api.Event{}); err != nil {
		t.Fatal(err)
	}
	if lb, ok := s.(store.LeaseBatcher); ok {
		_, errs, err := lb.LeaseOps(ctx, []store.LeaseOp{{Transition: store.Transition{ID: "b", Change: lose}}})
		if err != nil || errs[0] != nil {
			t.Fatalf("LeaseOps: %v %v", err, errs)
		}
	} else if _, err := s.TransitionLease(ctx, "b", lose, api.Event{}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		l, err := s.Lease(ctx, id)
		if err != nil || l.State != api.LeaseActive || l.BandwidthCap != 50<<20 || l.IOPSCap != 2000 || len(l.Parts) != 2 ||
			l.Parts[0].Lost() || !l.Parts[1].Lost() || l.Parts[0].URI != "nbd://x/"+id+"0" {
			t.Fatalf("lease %s after losing part 1: %+v %v", id, l, err)
		}
		if l.Count != 1 || l.Held != 25 {
			t.Fatalf("lease %s after losing part 1: count %d, held %d; want what its part left holds (1, 25)", id, l.Count, l.Held)
		}
	}
	if devs, _ := s.Devices(ctx); devs[0].Allocated != 50 {
		t.Fatalf("allocated %d, want the two parts left (50)", devs[0].Allocated)
	}
}

func testIdempotency(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 100)
	idem := &store.Idempotency{Tenant: "t", Key: "k1", RequestHash: "h"}
	if _, err := s.CreateLease(ctx, lease("a", "t", node, dev, 0, 10), store.Demand{}, idem, api.Event{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateLease(ctx, lease("b", "t", node, dev, 10, 10), store.Demand{}, idem, api.Event{}); !errors.Is(err, store.ErrDuplicate) {
		t.Fatalf("reused key: %v", err)
	}
	l, hash, err := s.LeaseByIdempotencyKey(ctx, "t", "k1")
	if err != nil || l.ID != "a" || hash != "h" {
		t.Fatalf("by key: %v %q %v", l.ID, hash, err)
	}
	if _, _, err := s.LeaseByIdempotencyKey(ctx, "u", "k1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant's key: %v", err)
	}
}

func testEvents(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 100)
	if _, err := s.CreateLease(ctx, lease("a", "t", node, dev, 0, 10), store.Demand{}, nil, api.Event{Type: "lease.reserved", Subject: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateLease(ctx, lease("b", "u", node, dev, 10, 10), store.Demand{}, nil, api.Event{Type: "lease.reserved", Subject: "b"}); err != nil {
		t.Fatal(err)
	}
	ev, err := s.AppendEvent(ctx, api.Event{Type: "profile.stored", Subject: "p"})
	if err != nil || ev.ID == 0 {
		t.Fatalf("append: %+v %v", ev, err)
	}
	all, err := s.Events(ctx, 0, 100, "")
	if err != nil || len(all) != 4 {
		t.Fatalf("events %+v %v", all, err)
	}
	for i := 1; i < len(all); i++ {
		if all[i].ID <= all[i-1].ID {
			t.Fatalf("ids not growing: %+v", all)
		}
	}
	if all[3].ID != ev.ID {
		t.Fatalf("returned id %d, stored %d", ev.ID, all[3].ID)
	}
	mine, _ := s.Events(ctx, 0, 100, "t")
	var subj []string
	for _, e := range mine {
		subj = append(subj, e.Subject)
	}
	if !reflect.DeepEqual(subj, []string{node, "a", "p"}) {
		t.Fatalf("tenant t sees %v", subj)
	}
	if tail, _ := s.Events(ctx, all[1].ID, 1, ""); len(tail) != 1 || tail[0].ID != all[2].ID {
		t.Fatalf("since/limit: %+v", tail)
	}
}

func testHeartbeats(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, _ := oneNode(t, s, 100)
	if err := s.SetNodeState(ctx, node, api.NodeReady, api.NodeSuspect, api.Event{}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeState(ctx, node, api.NodeReady, api.NodeDown, api.Event{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale set: %v", err)
	}
	at := time.Now().UTC().Truncate(time.Microsecond)
	link := func(rtt float64) []api.Link {
		return []api.Link{{From: node, To: "controlplane", Kind: "ethernet", RTTMicros: rtt, Status: "up", MeasuredAt: at}}
	}
	prev, errs, err := s.Heartbeats(ctx, []store.Beat{{NodeID: node, At: at, Health: "ok", Links: link(5)}, {NodeID: "nope", At: at, Links: link(7)},
		{NodeID: node, At: at, Health: "ok2", Links: link(9)}})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], store.ErrNotFound) || errs[2] != nil {
		t.Fatalf("heartbeats: %v %v", errs, err)
	}
	if prev[0] != api.NodeSuspect || prev[2] != api.NodeReady {
		t.Fatalf("prev %v", prev)
	}
	n, err := s.Node(ctx, node)
	if err != nil || n.State != api.NodeReady || n.Health != "ok2" || !n.LastHeartbeat.Equal(at) || n.AgentKey != "k1" {
		t.Fatalf("node %+v %v", n, err)
	}
	ls, err := s.Links(ctx)
	if err != nil || len(ls) != 1 || ls[0].RTTMicros != 9 || ls[0].From != node {
		t.Fatalf("links %+v %v", ls, err)
	}
	evs, _ := s.Events(ctx, 0, 100, "")
	if last := evs[len(evs)-1]; last.Type != "node.ready" {
		t.Fatalf("last event %+v", last)
	}
}

func testLimits(t *testing.T, o Options) {
	if !o.Limits {
		t.Skip("the store leaves limits to placement")
	}
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 100)
	lim := &store.Limit{Leases: 2, Bytes: 30}
	mk := func(id string, off, n int64, mode api.Mode) error {
		l := lease(id, "t", node, dev, off, n)
		l.Mode = mode
		lb := s.(store.LeaseBatcher)
		_, errs, err := lb.LeaseOps(ctx, []store.LeaseOp{{Create: &store.NewLease{Lease: l, Limit: lim}}})
		if err != nil {
			return err
		}
		return errs[0]
	}
	if err := mk("a", 0, 10, api.ModeShared); err != nil {
		t.Fatal(err)
	}
	if err := mk("b", 10, 30, api.ModeShared); !errors.Is(err, store.ErrQuota) {
		t.Fatalf("bytes over quota: %v", err)
	}
	if err := mk("c", 10, 10, api.ModeDedicated); !errors.Is(err, store.ErrQuota) {
		t.Fatalf("a dedicated part charges its device's capacity: %v", err)
	}
	if err := mk("d", 10, 20, api.ModeShared); err != nil {
		t.Fatal(err)
	}
	lim.Bytes = 0
	if err := mk("e", 30, 1, api.ModeShared); !errors.Is(err, store.ErrQuota) {
		t.Fatalf("leases over quota: %v", err)
	}
	if _, err := s.TransitionLease(ctx, "a", store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseReleased}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	if err := mk("e", 30, 1, api.ModeShared); err != nil {
		t.Fatalf("after a release: %v", err)
	}
}

// testConcurrentWriters: writers on several Stores of one database race
// for the same ranges of one device; the store lets exactly one win each
// range and keeps every tenant within its limit.
func testConcurrentWriters(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 64)
	stores := []store.Store{s}
	if o.Reopen != nil {
		for i := 0; i < 2; i++ {
			r := o.Reopen(t, s)
			t.Cleanup(func() { r.Close() })
			stores = append(stores, r)
		}
	}
	const writers = 6
	var mu sync.Mutex
	won := map[int64][]string{}
	quota := 0
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := stores[w%len(stores)]
			for off := int64(0); off < 64; off += 4 {
				l := lease(fmt.Sprintf("w%d-%d", w, off), fmt.Sprintf("tenant%d", w%2), node, dev, off, 4)
				var err error
				if lb, ok := st.(store.LeaseBatcher); ok && o.Limits {
					var errs []error
					_, errs, err = lb.LeaseOps(ctx, []store.LeaseOp{{Create: &store.NewLease{Lease: l, Limit: &store.Limit{Leases: 5}}}})
					if err == nil {
						err = errs[0]
					}
				} else {
					_, err = st.CreateLease(ctx, l, store.Demand{}, nil, api.Event{Type: "lease.reserved", Subject: l.ID})
				}
				mu.Lock()
				switch {
				case err == nil:
					won[off] = append(won[off], l.ID)
				case errors.Is(err, store.ErrQuota):
					quota++
				case !errors.Is(err, store.ErrCapacity):
					t.Errorf("%s: %v", l.ID, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for off, ids := range won {
		if len(ids) != 1 {
			t.Errorf("range %d+4 held by %v", off, ids)
		}
	}
	if o.Limits {
		for _, tenant := range []string{"tenant0", "tenant1"} {
			ls, _ := s.Leases(ctx, store.LeaseFilter{Tenant: tenant})
			if len(ls) > 5 {
				t.Errorf("%s holds %d leases, limit 5", tenant, len(ls))
			}
		}
	} else if len(won) != 16 {
		t.Errorf("%d of 16 ranges taken", len(won))
	}
	evs, _ := s.Events(ctx, 0, 10000, "")
	for i := 1; i < len(evs); i++ {
		if evs[i].ID <= evs[i-1].ID {
			t.Fatalf("event ids out of order at %d", i)
		}
	}
}

// testConcurrentKey: creations with one idempotency key on several Stores
// of one database at once: exactly one lease is created, the others are
// told the key was used (ErrDuplicate), and the key names the winner.
func testConcurrentKey(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 64)
	stores := []store.Store{s}
	if o.Reopen != nil {
		for i := 0; i < 3; i++ {
			r := o.Reopen(t, s)
			t.Cleanup(func() { r.Close() })
			stores = append(stores, r)
		}
	}
	for round := 0; round < 5; round++ {
		key := fmt.Sprintf("k%d", round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var won []string
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("r%d-w%d", round, w)
				l := lease(id, "t", node, dev, int64(round*8+w*2), 2)
				_, err := stores[w%len(stores)].CreateLease(ctx, l, store.Demand{}, &store.Idempotency{Tenant: "t", Key: key, RequestHash: "h"}, api.Event{Type: "lease.reserved", Subject: id})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					won = append(won, id)
				case !errors.Is(err, store.ErrDuplicate):
					t.Errorf("%s: %v", id, err)
				}
			}()
		}
		wg.Wait()
		if len(won) != 1 {
			t.Fatalf("round %d: created %v", round, won)
		}
		if l, _, err := s.LeaseByIdempotencyKey(ctx, "t", key); err != nil || l.ID != won[0] {
			t.Fatalf("round %d: key names %s (%v), created %s", round, l.ID, err, won[0])
		}
	}
}
