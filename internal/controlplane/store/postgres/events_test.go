package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestEventLogLateCommit: writers append events under the event log's
// lock in shared mode, so two writers do not wait for each other; a
// reader waits for every writer still holding an event ID, so an event
// whose ID is lower than one already committed, but committed later, is
// never skipped by a follower reading "ID > last seen".
func TestEventLogLateCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openStore(ctx, t)

	// The early writer takes the lower ID and does not commit yet.
	early, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Rollback()
	e1, err := s.AppendEventTx(ctx, rebound{early}, api.Event{Type: "test.early", Subject: "a"})
	if err != nil {
		t.Fatal(err)
	}
	// The late writer appends and commits meanwhile: it does not wait for
	// the early one (a deadline would end it if it did).
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	late, err := s.db.BeginTx(wctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	e2, err := s.AppendEventTx(wctx, rebound{late}, api.Event{Type: "test.late", Subject: "b"})
	if err != nil {
		t.Fatalf("a second writer waited for the first: %v", err)
	}
	if err := late.Commit(); err != nil {
		t.Fatal(err)
	}
	wcancel()
	if e2.ID <= e1.ID {
		t.Fatalf("event IDs %d then %d: want increasing", e1.ID, e2.ID)
	}

	// A reader waits for the early writer: it must not see e2 without e1.
	type read struct {
		evs []api.Event
		err error
	}
	got := make(chan read, 1)
	go func() {
		evs, err := s.Events(ctx, 0, 100, "")
		got <- read{evs, err}
	}()
	waiting := func() bool {
		var n int
		if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			AND classid = $1 AND objid = $2 AND objsubid = 2 AND NOT granted`, lockClass, lockEvents).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !waiting() {
		select {
		case r := <-got:
			t.Fatalf("the reader did not wait for the uncommitted writer: got %+v, %v", r.evs, r.err)
		case <-ctx.Done():
			t.Fatal("the reader never waited for the event log's lock")
		case <-tick.C:
		}
	}
	select {
	case r := <-got:
		t.Fatalf("the reader returned while a writer held an event ID: %+v, %v", r.evs, r.err)
	default:
	}
	if err := early.Commit(); err != nil {
		t.Fatal(err)
	}
	var r read
	select {
	case r = <-got:
	case <-ctx.Done():
		t.Fatal("the reader did not finish after the writer committed")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	var ids []int64
	for _, ev := range r.evs {
		ids = append(ids, ev.ID)
	}
	if len(ids) < 2 || ids[len(ids)-2] != e1.ID || ids[len(ids)-1] != e2.ID {
		t.Fatalf("events %v: want ... %d, %d", ids, e1.ID, e2.ID)
	}
	last, err := s.LastEventID(ctx)
	if err != nil || last != e2.ID {
		t.Fatalf("LastEventID = %d, %v; want %d", last, err, e2.ID)
	}
}
