package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// TestLeaseHotUpdates: a lease's transitions between states that have not
// ended (reserved → active → releasing) change no indexed column of
// leases (migration 0011), so PostgreSQL writes them as heap-only tuple
// updates, without new index entries; the transition into an ended
// state changes leases.ongoing and is not one. The sweep's lookup of
// leases that have not ended still finds them, and only them.
func TestLeaseHotUpdates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openStore(ctx, t)
	at := time.Unix(1700000000, 0).UTC()
	var ops []store.LeaseOp
	for _, id := range []string{"lease-a", "lease-b"} {
		l := api.Lease{ID: id, State: api.LeaseReserved, Kind: api.KindBlock, Mode: api.ModeShared, Tenant: "t1",
			CreatedAt: at, UpdatedAt: at, ExpiresAt: at.Add(time.Hour)}
		ops = append(ops, store.LeaseOp{Create: &store.NewLease{Lease: l, Event: api.Event{Type: "lease.reserved", Subject: id, At: at}}})
	}
	if _, errs, err := s.LeaseOps(ctx, ops); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("create: %v, %v", err, errs)
	}
	steps := [][2]api.LeaseState{{api.LeaseReserved, api.LeaseActive}, {api.LeaseActive, api.LeaseReleasing}, {api.LeaseReleasing, api.LeaseReleased}}
	for _, st := range steps {
		op := store.LeaseOp{Transition: store.Transition{ID: "lease-a", Event: api.Event{Type: "lease." + string(st[1]), Subject: "lease-a", At: at},
			Change: store.LeaseChange{From: []api.LeaseState{st[0]}, To: st[1], At: at}}}
		if _, errs, err := s.LeaseOps(ctx, []store.LeaseOp{op}); err != nil || errs[0] != nil {
			t.Fatalf("%s → %s: %v, %v", st[0], st[1], err, errs)
		}
	}

	// The backends report their counts within a second or so of going
	// idle: poll with a deadline.
	var upd, hot int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := s.db.QueryRowContext(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'leases'`).Scan(&upd, &hot); err != nil {
			t.Fatal(err)
		}
		if upd >= int64(len(steps)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling with a deadline
	}
	if upd != int64(len(steps)) {
		t.Fatalf("leases: %d updates counted; want %d", upd, len(steps))
	}
	if hot != 2 {
		t.Errorf("leases: %d of %d updates were heap-only tuple updates; want 2 (the transitions between states that have not ended)", hot, upd)
	}

	for _, c := range []struct {
		states []api.LeaseState
		want   []string
	}{
		{[]api.LeaseState{api.LeaseReserved, api.LeaseActive}, []string{"lease-b"}},
		{[]api.LeaseState{api.LeaseReleasing, api.LeaseReserved}, []string{"lease-b"}},
		{[]api.LeaseState{api.LeaseReleased}, []string{"lease-a"}},
		{[]api.LeaseState{api.LeaseReleased, api.LeaseReserved}, []string{"lease-a", "lease-b"}},
	} {
		ls, err := s.Leases(ctx, store.LeaseFilter{States: c.states, ExpiresBefore: at.Add(2 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, l := range ls {
			got = append(got, l.ID)
		}
		if len(got) != len(c.want) || (len(got) > 0 && (got[0] != c.want[0] || got[len(got)-1] != c.want[len(c.want)-1])) {
			t.Errorf("leases in %v: %v; want %v", c.states, got, c.want)
		}
	}
}
