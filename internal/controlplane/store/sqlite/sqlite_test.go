package sqlite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

func TestMigrationsOnExistingDB(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	// A database created by a binary that knew only migration 1.
	old, err := open(ctx, path, 1)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := old.SchemaVersion(ctx); v != 1 {
		t.Fatalf("version %d, want 1", v)
	}
	now := time.Unix(1700000000, 0).UTC()
	// A node that binary joined, in its schema's columns (this binary's
	// JoinNode reads columns later migrations added).
	n := api.Node{ID: "node-1"}
	if _, err := old.w.ExecContext(ctx, `INSERT INTO nodes (id, machine_id, name, state, credential_hash, agent_key, last_heartbeat, joined_at) VALUES (?, 'm1', 'n1', 'ready', 'h1', 'k1', ?, ?)`,
		n.ID, now.UnixNano(), now.UnixNano()); err != nil {
		t.Fatal(err)
	}
	if _, err := old.w.ExecContext(ctx, `INSERT INTO devices (id, node_id, name, kind, state, capacity) VALUES ('dev-1', ?, 'disk0', 'block', 'available', ?)`, n.ID, 1<<30); err != nil {
		t.Fatal(err)
	}
	if _, err := old.w.ExecContext(ctx, `INSERT INTO events (at, type, subject, state) VALUES (?, 'node.joined', ?, 'ready')`, now.UnixNano(), n.ID); err != nil {
		t.Fatal(err)
	}
	// A lease written by that binary, parts in lease_parts only.
	if _, err := old.w.ExecContext(ctx, `INSERT INTO leases (id, state, kind, mode, tenant, expires_at, created_at, updated_at, plan) VALUES ('old', 'active', 'block', 'shared', 't', 1, 1, 1, '{"state":"feasible","explanation":["old plan"]}')`); err != nil {
		t.Fatal(err)
	}
	var dev string
	old.w.QueryRowContext(ctx, `SELECT id FROM devices`).Scan(&dev)
	if _, err := old.w.ExecContext(ctx, `INSERT INTO lease_parts (lease_id, idx, node_id, device_id, off, length, uri, live) VALUES ('old', 1, ?, ?, 4096, 4096, 'nbd://b', 1), ('old', 0, ?, ?, 0, 4096, 'nbd://a', 1)`,
		n.ID, dev, n.ID, dev); err != nil {
		t.Fatal(err)
	}
	old.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ms, _ := migrations()
	if v, _ := s.SchemaVersion(ctx); v != len(ms) || v < 2 {
		t.Fatalf("version %d after migrating, want %d", v, len(ms))
	}
	got, err := s.Node(ctx, n.ID)
	if err != nil || got.Name != "n1" || got.AgentKey != "k1" || !got.JoinedAt.Equal(now) {
		t.Fatalf("node after migration: %v %+v", err, got)
	}
	var idx int
	s.w.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'nodes_by_state'`).Scan(&idx)
	if idx != 1 {
		t.Fatal("migration 2 did not run")
	}
	// Migration 4: parts move onto the lease row, in order.
	ol, err := s.Lease(ctx, "old")
	if want := []api.Part{{NodeID: n.ID, DeviceID: dev, Length: 4096, URI: "nbd://a"}, {NodeID: n.ID, DeviceID: dev, Offset: 4096, Length: 4096, URI: "nbd://b"}}; err != nil || !reflect.DeepEqual(ol.Parts, want) {
		t.Fatalf("parts after migration: %v %+v", err, ol.Parts)
	}
	// Migrations 6 and 7: plans move to lease_plans.
	if ol.Plan == nil || !reflect.DeepEqual(ol.Plan.Explanation, []string{"old plan"}) {
		t.Fatalf("plan after migration: %+v", ol.Plan)
	}
	var rowPlan string
	s.w.QueryRowContext(ctx, `SELECT plan FROM leases WHERE id = 'old'`).Scan(&rowPlan)
	if rowPlan != "" {
		t.Fatalf("plan left on the lease row: %q", rowPlan)
	}
	if _, err := s.TransitionLease(ctx, "old", store.LeaseChange{From: []api.LeaseState{api.LeaseActive}, To: api.LeaseReleased, At: now}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	// Migration 3: leases keep their request's demand for placement.
	devs, _ := s.Devices(ctx)
	dl := now.Add(time.Hour)
	if _, err := s.CreateLease(ctx, api.Lease{ID: "l1", State: api.LeaseReserved, Kind: api.KindBlock, Mode: api.ModeShared, Tenant: "t",
		Parts: []api.Part{{NodeID: n.ID, DeviceID: devs[0].ID, Length: 1 << 20}}}, store.Demand{Bandwidth: 477e6, Work: 150e9, Deadline: dl}, nil, api.Event{At: now}); err != nil {
		t.Fatal(err)
	}
	inv, err := s.Inventory(ctx)
	if err != nil || len(inv.Parts) != 1 || inv.Parts[0].Demand.Bandwidth != 477e6 || inv.Parts[0].Demand.Work != 150e9 || !inv.Parts[0].Demand.Deadline.Equal(dl) {
		t.Fatalf("demand after migration: %v %+v", err, inv.Parts)
	}
	// Migration 9: a lease keeps its request's caps; older leases have none.
	if ol.BandwidthCap != 0 || ol.IOPSCap != 0 {
		t.Fatalf("caps of a lease from before migration 9: %+v", ol)
	}
	if _, err := s.CreateLease(ctx, api.Lease{ID: "l2", State: api.LeaseReserved, Kind: api.KindBlock, Mode: api.ModeShared, Tenant: "t",
		BandwidthCap: 50 << 20, IOPSCap: 2000, Parts: []api.Part{{NodeID: n.ID, DeviceID: devs[0].ID, Offset: 1 << 20, Length: 1 << 20}}},
		store.Demand{}, nil, api.Event{At: now}); err != nil {
		t.Fatal(err)
	}
	if l2, err := s.Lease(ctx, "l2"); err != nil || l2.BandwidthCap != 50<<20 || l2.IOPSCap != 2000 {
		t.Fatalf("caps after migration 9: %v %+v", err, l2)
	}
	if _, err := s.PutProfile(ctx, api.Profile{Model: "m", WriteBps: []float64{1e9}}, api.Event{At: now}); err != nil {
		t.Fatal(err)
	}
	if inv, err := s.Inventory(ctx); err != nil || len(inv.Profiles) != 1 || inv.Profiles[0].Model != "m" {
		t.Fatalf("profiles in the inventory: %v %+v", err, inv.Profiles)
	}
	// Reopening applies nothing and keeps the data.
	s.Close()
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if devs, _ := s.Devices(ctx); len(devs) != 1 || devs[0].Allocated != 2<<20 {
		t.Fatalf("devices %+v", devs)
	}
	// Events are never rewritten (only pruned, migration 12).
	if _, err := s.w.ExecContext(ctx, `UPDATE events SET message = 'x'`); err == nil {
		t.Fatal("events could be updated")
	}
	// Migration 5: events keep their ids, and new ones still only grow.
	evs, err := s.Events(ctx, 0, 1000, "")
	if err != nil || len(evs) < 1 {
		t.Fatalf("events after migration: %v %+v", err, evs)
	}
	if err := (dialect{s}).AppendEvents(ctx, s.w, []api.Event{{At: now, Type: "test.after"}}); err != nil {
		t.Fatal(err)
	}
	all, err := s.Events(ctx, 0, 1000, "")
	if err != nil || len(all) != len(evs)+1 || all[0].ID != evs[0].ID {
		t.Fatalf("events after an append: %v %+v", err, all)
	}
	for i := 1; i < len(all); i++ {
		if all[i].ID <= all[i-1].ID {
			t.Fatalf("event ids do not grow: %+v", all)
		}
	}
	var seq int
	s.w.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_master WHERE name = 'events' AND sql LIKE '%AUTOINCREMENT%'`).Scan(&seq)
	if seq != 0 {
		t.Fatal("events still AUTOINCREMENT")
	}
}

func TestCapacityChecks(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	n := joinNode(t, s, now, []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 100}})
	devs, _ := s.Devices(ctx)
	dev := devs[0].ID
	mk := func(id string, off, length int64) error {
		_, err := s.CreateLease(ctx, api.Lease{ID: id, State: api.LeaseReserved, Kind: api.KindBlock, Tenant: "t",
			Parts: []api.Part{{NodeID: n.ID, DeviceID: dev, Offset: off, Length: length}}}, store.Demand{}, nil, api.Event{})
		return err
	}
	for _, c := range []struct {
		id       string
		off, len int64
		ok       bool
	}{
		{"a", 0, 50, true}, {"b", 40, 20, false}, {"c", 50, 50, true}, {"d", 99, 2, false}, {"e", -1, 1, false}, {"f", 100, 1, false},
	} {
		err := mk(c.id, c.off, c.len)
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
	if err := mk("g", 10, 30); err != nil {
		t.Fatalf("freed range not reusable: %v", err)
	}
	devs, _ = s.Devices(ctx)
	if devs[0].Allocated != 80 {
		t.Fatalf("allocated %d, want 80", devs[0].Allocated)
	}
}

// TestTransitionLeases: a batch applies each transition independently; a
// refused one is rolled back alone and reported in its slot.
func TestTransitionLeases(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	n := joinNode(t, s, now, []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 100}})
	devs, _ := s.Devices(ctx)
	for i, id := range []string{"a", "b"} {
		if _, err := s.CreateLease(ctx, api.Lease{ID: id, State: api.LeaseReserved, Kind: api.KindBlock, Tenant: "t",
			Parts: []api.Part{{NodeID: n.ID, DeviceID: devs[0].ID, Offset: int64(i) * 50, Length: 50}}}, store.Demand{}, nil, api.Event{}); err != nil {
			t.Fatal(err)
		}
	}
	ch := func(from, to api.LeaseState) store.LeaseChange {
		return store.LeaseChange{From: []api.LeaseState{from}, To: to, At: now}
	}
	ts := []store.Transition{
		{ID: "a", Change: ch(api.LeaseReserved, api.LeaseActive)},
		{ID: "b", Change: ch(api.LeaseActive, api.LeaseReleasing)}, // b is reserved: refused
		{ID: "zz", Change: ch(api.LeaseReserved, api.LeaseActive)},
		{ID: "a", Change: ch(api.LeaseActive, api.LeaseReleased)}, // sees the first
		{ID: "b", Change: ch(api.LeaseReserved, api.LeaseFailed)},
	}
	out, errs, err := s.TransitionLeases(ctx, ts)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, store.ErrConflict, store.ErrNotFound, nil, nil} {
		if (want == nil) != (errs[i] == nil) || (want != nil && !errors.Is(errs[i], want)) {
			t.Fatalf("transition %d: %v, want %v", i, errs[i], want)
		}
		if want == nil && out[i].State != ts[i].Change.To {
			t.Fatalf("transition %d: state %s", i, out[i].State)
		}
	}
	for id, want := range map[string]api.LeaseState{"a": api.LeaseReleased, "b": api.LeaseFailed} {
		if l, err := s.Lease(ctx, id); err != nil || l.State != want {
			t.Fatalf("%s: %s %v, want %s", id, l.State, err, want)
		}
	}
	if devs, _ := s.Devices(ctx); devs[0].Allocated != 0 {
		t.Fatalf("allocated %d after both ended", devs[0].Allocated)
	}
}

// TestLeaseOpsReadBack: what a batch returns for each write is what reading
// the lease back gives, whether the store knew the lease's value (no read
// back) or not (a fresh Store on the same file), and events are appended
// for the writes that succeeded only.
func TestLeaseOpsReadBack(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "rb.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1700000000, 123).UTC()
	n := joinNode(t, s, now, []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30}, {Name: "disk1", Kind: api.KindBlock, Capacity: 1 << 30}})
	devs, _ := s.Devices(ctx)
	parts := []api.Part{{NodeID: n.ID, DeviceID: devs[0].ID, Length: 1 << 20}, {NodeID: n.ID, DeviceID: devs[1].ID, Offset: 1 << 20, Length: 1 << 20}}
	plan := &api.Plan{ID: "l1", At: now, State: "feasible", Mode: api.ModeComposed, Parts: parts, Explanation: []string{"two parts"}}
	ev := func(typ string) api.Event { return api.Event{At: now, Type: typ, Subject: "l1"} }
	check := func(s *Store, got api.Lease, what string) {
		t.Helper()
		want, err := s.Lease(ctx, got.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: returned\n%+v\nread back\n%+v", what, got, want)
		}
	}
	out, errs, err := s.LeaseOps(ctx, []store.LeaseOp{
		{Create: &store.NewLease{Lease: api.Lease{ID: "l1", State: api.LeaseReserved, Kind: api.KindBlock, Mode: api.ModeComposed, Tenant: "t", Count: 2,
			Size: 2 << 20, Credential: "c", TTLSeconds: 60, ExpiresAt: now.Add(time.Minute), CreatedAt: now, UpdatedAt: now, Parts: parts, Plan: plan}, Event: ev("lease.reserved")}},
		// Overlaps l1's first part: refused, leaves nothing.
		{Create: &store.NewLease{Lease: api.Lease{ID: "l2", State: api.LeaseReserved, Kind: api.KindBlock, Tenant: "t", CreatedAt: now, UpdatedAt: now,
			Parts: parts[:1]}, Event: ev("lease.reserved")}},
	})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], store.ErrCapacity) {
		t.Fatalf("create: %v %v", err, errs)
	}
	check(s, out[0], "create")
	steps := []store.LeaseChange{
		{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseActive, URIs: []string{"nbd://a/0", "nbd://a/1"}, URI: "nbd://a/0", At: now.Add(time.Second)},
		{From: []api.LeaseState{api.LeaseActive}, To: api.LeaseActive, ExpiresAt: now.Add(time.Hour), TTL: 3600, At: now.Add(2 * time.Second),
			Plan: &api.Plan{ID: "l1", State: "feasible", Explanation: []string{"renewed"}}},
		{From: []api.LeaseState{api.LeaseActive}, To: api.LeaseReleasing, Tenant: "t", At: now.Add(3 * time.Second)},
	}
	for i, ch := range steps {
		st := s
		if i == 1 {
			// A fresh Store does not know the lease: it reads the row back.
			s.Close()
			if st, err = Open(ctx, path); err != nil {
				t.Fatal(err)
			}
			s = st
		}
		l, err := st.TransitionLease(ctx, "l1", ch, ev("lease."+string(ch.To)))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		check(st, l, fmt.Sprintf("step %d", i))
		// Again from a state it has left: refused.
		if _, err := st.TransitionLease(ctx, "l1", store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseFailed, At: now}, ev("x")); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("step %d: stale transition: %v", i, err)
		}
	}
	if _, err := s.TransitionLease(ctx, "l1", store.LeaseChange{From: []api.LeaseState{api.LeaseReleasing}, To: api.LeaseReleased, Tenant: "u", At: now}, ev("x")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant's lease: %v", err)
	}
	l, err := s.TransitionLease(ctx, "l1", store.LeaseChange{From: []api.LeaseState{api.LeaseReleasing}, To: api.LeaseReleased, At: now.Add(4 * time.Second)}, ev("lease.released"))
	if err != nil {
		t.Fatal(err)
	}
	check(s, l, "released")
	if devs, _ := s.Devices(ctx); devs[0].Allocated != 0 || devs[1].Allocated != 0 {
		t.Fatalf("allocated after release: %+v", devs)
	}
	evs, _ := s.Events(ctx, 0, 100, "")
	var types []string
	for _, e := range evs {
		if e.Subject == "l1" {
			types = append(types, e.Type)
		}
	}
	if want := []string{"lease.reserved", "lease.active", "lease.active", "lease.releasing", "lease.released"}; !reflect.DeepEqual(types, want) {
		t.Fatalf("events %v, want %v", types, want)
	}
	s.Close()
}

// TestBackgroundCheckpoints: the background checkpointer copies the WAL
// into the database file, long before the WAL reaches the size at which
// the writer would.
func TestBackgroundCheckpoints(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ck.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	size := func() int64 {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	before := size()
	for i := 0; i < 200; i++ {
		if _, err := s.AppendEvent(ctx, api.Event{Type: "test", Subject: strings.Repeat("x", 2000)}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for size() <= before+200*2000 {
		if time.Now().After(deadline) {
			t.Fatalf("database file still %d bytes (was %d): no checkpoint", size(), before)
		}
		<-tick.C
	}
}

// TestWALBounded: under writes that never pause, the WAL still starts
// over: it stays near walAutocheckpoint pages.
func TestWALBounded(t *testing.T) {
	defer func(n int) { walAutocheckpoint = n }(walAutocheckpoint)
	walAutocheckpoint = 64
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "wal.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 2000; i++ {
		if _, err := s.AppendEvent(ctx, api.Event{Type: "test", Subject: strings.Repeat("x", 2000)}); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	// Without starting over, the WAL would hold all 2000 commits (about 25
	// MB); with it, the 64-page limit plus what is written while a
	// background checkpoint holds the checkpoint lock (at most ~2 MB seen).
	if max := int64(8 << 20); fi.Size() > max {
		t.Fatalf("WAL is %d bytes after 2000 writes, want at most %d", fi.Size(), max)
	}
}

// joinNode joins node-1 (machine m1) with devs to s at now; ev is the event
// recorded with the join, if any.
func joinNode(t *testing.T, s *Store, now time.Time, devs []api.DeviceSpec, ev ...api.Event) api.Node {
	t.Helper()
	e := api.Event{}
	if len(ev) > 0 {
		e = ev[0]
	}
	n, _, err := s.JoinNode(context.Background(), store.JoinNode{
		Node:           api.Node{ID: "node-1", Name: "n1", State: api.NodeReady, Fingerprint: api.Fingerprint{MachineID: "m1"}, LastHeartbeat: now, JoinedAt: now},
		CredentialHash: "h1", AgentKey: "k1", Devices: devs,
	}, e)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
