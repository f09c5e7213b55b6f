package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

func pruner(t *testing.T, s store.Store) store.Pruner {
	t.Helper()
	p, ok := s.(store.Pruner)
	if !ok {
		t.Fatalf("%T does not implement store.Pruner", s)
	}
	return p
}

// testPrune: ended leases and old events go; live leases, leases still
// tearing down and leases a move still refers to stay; event IDs keep
// growing.
func testPrune(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	p, mv := pruner(t, s), mover(t, s)
	nodes, devs := twoNodes(t, s, 1000)
	t0 := time.Now().UTC()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	part := func(off int64) api.Part {
		return api.Part{NodeID: nodes[0], DeviceID: devs[0], Offset: off, Length: 10}
	}
	create := func(id string, off int64, idem *store.Idempotency) {
		t.Helper()
		l := lease(id, "t", nodes[0], devs[0], off, 10)
		l.CreatedAt, l.UpdatedAt = at(time.Duration(off)), at(time.Duration(off))
		if _, err := s.CreateLease(ctx, l, store.Demand{}, idem, api.Event{At: at(time.Minute), Type: "lease.reserved", Subject: id}); err != nil {
			t.Fatal(err)
		}
	}
	move := func(id string, from, to api.LeaseState, when time.Duration) {
		t.Helper()
		if _, err := s.TransitionLease(ctx, id, store.LeaseChange{From: []api.LeaseState{from}, To: to, At: at(when)},
			api.Event{At: at(when), Type: "lease." + string(to), Subject: id}); err != nil {
			t.Fatalf("%s → %s: %v", id, to, err)
		}
	}
	create("released-old", 0, &store.Idempotency{Tenant: "t", Key: "k1", RequestHash: "h"})
	move("released-old", api.LeaseReserved, api.LeaseReleased, 10*time.Minute)
	create("expired-old", 10, nil)
	move("expired-old", api.LeaseReserved, api.LeaseExpired, 10*time.Minute)
	create("releasing-old", 20, nil) // its lender has not torn it down (wiped) yet
	move("releasing-old", api.LeaseReserved, api.LeaseReleasing, 10*time.Minute)
	create("active-old", 30, nil)
	move("active-old", api.LeaseReserved, api.LeaseActive, 10*time.Minute)
	create("released-new", 40, nil)
	// A lease lost while one of its parts moves: the open move (and its
	// destination range) still refer to it.
	create("moving", 50, nil)
	move("moving", api.LeaseReserved, api.LeaseActive, time.Minute)
	m := api.Move{ID: "mv1", LeaseID: "moving", Part: 0, Kind: api.KindBlock, State: api.MoveCopying, From: part(50),
		To: api.Part{NodeID: nodes[1], DeviceID: devs[1], Offset: 0, Length: 10}, Size: 10, StartedAt: at(2 * time.Minute)}
	if err := mv.BeginMove(ctx, m, api.Event{At: at(2 * time.Minute), Type: "lease.move.started", Subject: "moving"}); err != nil {
		t.Fatal(err)
	}
	move("moving", api.LeaseActive, api.LeaseLost, 10*time.Minute)
	// The log is appended in time order, as the server does.
	move("released-new", api.LeaseReserved, api.LeaseReleased, 2*time.Hour)
	late, err := s.AppendEvent(ctx, api.Event{At: at(3 * time.Hour), Type: "profile.stored", Subject: "p"})
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.Events(ctx, 0, 1000, "")
	if err != nil {
		t.Fatal(err)
	}

	// Nothing is old enough yet.
	got, err := p.Prune(ctx, t0.Add(-time.Hour), 1000)
	if err != nil || got.Leases != 0 || got.Events != 0 || got.EventsThrough != 0 {
		t.Fatalf("prune before anything ended: %+v %v", got, err)
	}

	got, err = p.Prune(ctx, at(time.Hour), 1000)
	if err != nil {
		t.Fatal(err)
	}
	if got.Leases != 2 {
		t.Errorf("pruned %d leases, want 2 (released-old, expired-old)", got.Leases)
	}
	var old []api.Event
	for _, e := range before {
		if e.At.Before(at(time.Hour)) {
			old = append(old, e)
		}
	}
	if len(old) == 0 || got.Events != len(old) || got.EventsThrough != old[len(old)-1].ID {
		t.Errorf("pruned %d events through %d, want %d through the last of %+v", got.Events, got.EventsThrough, len(old), old)
	}
	if through, err := p.PrunedEvents(ctx); err != nil || through != got.EventsThrough {
		t.Errorf("PrunedEvents = %d, %v; want %d", through, err, got.EventsThrough)
	}
	for _, id := range []string{"released-old", "expired-old"} {
		if _, err := s.Lease(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("pruned lease %s: %v", id, err)
		}
	}
	for _, id := range []string{"releasing-old", "active-old", "released-new", "moving"} {
		if _, err := s.Lease(ctx, id); err != nil {
			t.Errorf("lease %s should stay: %v", id, err)
		}
	}
	if _, _, err := s.LeaseByIdempotencyKey(ctx, "t", "k1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the pruned lease's idempotency key: %v", err)
	}
	// The key may be used again.
	create("again", 60, &store.Idempotency{Tenant: "t", Key: "k1", RequestHash: "h2"})
	evs, err := s.Events(ctx, 0, 1000, "")
	if err != nil || len(evs) == 0 || evs[0].ID <= got.EventsThrough {
		t.Fatalf("events after the prune: %v %+v", err, evs)
	}
	for _, e := range evs {
		if e.At.Before(at(time.Hour)) && e.ID <= got.EventsThrough {
			t.Errorf("event %+v survived", e)
		}
	}

	// The move ends: the lost lease no longer refers to anything.
	if err := mv.EndMove(ctx, "mv1", api.MoveFailed, "lost", 0, at(11*time.Minute), nil); err != nil {
		t.Fatal(err)
	}
	// Far in the future: every ended lease goes, every event but the
	// newest (the IDs only grow).
	lastBefore := evs[len(evs)-1]
	got, err = p.Prune(ctx, at(1000*time.Hour), 1000)
	if err != nil {
		t.Fatal(err)
	}
	if got.Leases != 2 { // released-new, moving
		t.Errorf("second prune: %d leases, want 2", got.Leases)
	}
	ls, err := s.Leases(ctx, store.LeaseFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range ls {
		ids = append(ids, l.ID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"active-old", "again", "releasing-old"}) {
		t.Errorf("leases left: %v", ids)
	}
	evs, _ = s.Events(ctx, 0, 1000, "")
	if len(evs) != 1 || evs[0].ID != lastBefore.ID {
		t.Fatalf("events left: %+v (want only %d)", evs, lastBefore.ID)
	}
	next, err := s.AppendEvent(ctx, api.Event{Type: "profile.stored", Subject: "p"})
	if err != nil || next.ID <= lastBefore.ID || next.ID <= late.ID {
		t.Fatalf("an event appended after the prune: %+v %v", next, err)
	}
	// The parts of the leases that stay are intact: a new lease cannot
	// take their ranges.
	if _, err := s.CreateLease(ctx, lease("overlap", "t", nodes[0], devs[0], 25, 10), store.Demand{}, nil, api.Event{}); !errors.Is(err, store.ErrCapacity) {
		t.Errorf("a lease over a kept lease's range: %v", err)
	}
}

// testLeasePages: paging with After and Limit returns every lease once,
// in the listing's order.
func testLeasePages(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 1000)
	t0 := time.Now().UTC()
	var want []string
	for i := range 11 {
		l := lease(string(rune('k'-i%3))+string(rune('a'+i)), "t", node, dev, int64(i)*10, 10)
		// Some share a creation time: the ID breaks the tie.
		l.CreatedAt = t0.Add(time.Duration(i/3) * time.Second)
		if _, err := s.CreateLease(ctx, l, store.Demand{}, nil, api.Event{}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.Leases(ctx, store.LeaseFilter{})
	if err != nil || len(all) != 11 {
		t.Fatalf("all: %d %v", len(all), err)
	}
	for _, l := range all {
		want = append(want, l.ID)
	}
	var got []string
	var after api.Cursor
	for pages := 0; ; pages++ {
		if pages > 11 {
			t.Fatal("paging does not end")
		}
		ls, err := s.Leases(ctx, store.LeaseFilter{After: after, Limit: 4})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			got = append(got, l.ID)
		}
		if len(ls) < 4 {
			break
		}
		after = api.LeaseCursor(ls[len(ls)-1])
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages %v, want %v", got, want)
	}
	// The kind filter applies before the limit.
	for kind, n := range map[api.Kind]int{all[0].Kind: 4, api.KindNIC: 0} {
		if ls, err := s.Leases(ctx, store.LeaseFilter{Kind: kind, Limit: 4}); err != nil || len(ls) != n {
			t.Errorf("kind %s, limit 4: %d leases, %v; want %d", kind, len(ls), err, n)
		}
	}
	c, err := api.ParseCursor(api.LeaseCursor(all[3]).String())
	if err != nil || !c.CreatedAt.Equal(all[3].CreatedAt) || c.ID != all[3].ID {
		t.Fatalf("cursor round trip: %+v %v", c, err)
	}
}
