package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// TestPipelineAtomic: a batch written in one round trip, without BEGIN
// and COMMIT statements (PostgreSQL's implicit transaction, up to the
// pipeline's Sync), is one transaction: when a later op fails, what the
// earlier ops wrote (a transition, its event) is rolled back with it,
// and the connection is left idle, outside any transaction.
func TestPipelineAtomic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openStore(ctx, t)
	at := time.Unix(1700000000, 0).UTC()
	l := api.Lease{ID: "lease-a", State: api.LeaseReserved, Kind: api.KindBlock, Mode: api.ModeShared, Tenant: "t1", CreatedAt: at, UpdatedAt: at}
	nl := store.NewLease{Lease: l, Event: api.Event{Type: "lease.reserved", Subject: l.ID, At: at}}
	if _, errs, err := s.LeaseOps(ctx, []store.LeaseOp{{Create: &nl}}); err != nil || errs[0] != nil {
		t.Fatalf("create: %v, %v", err, errs)
	}
	ops := []store.LeaseOp{
		{Transition: store.Transition{ID: l.ID, Event: api.Event{Type: "test.activated", Subject: l.ID, At: at},
			Change: store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseActive, At: at}}},
		// The lease has no part 5: its parts become NULL, a NOT NULL
		// violation, after the first op wrote.
		{Transition: store.Transition{ID: l.ID, Event: api.Event{Type: "test.lost", Subject: l.ID, At: at},
			Change: store.LeaseChange{From: []api.LeaseState{api.LeaseActive}, To: api.LeaseActive, LostParts: []int{5}, At: at}}},
	}
	var idle byte
	err := s.onConn(ctx, "connection", func(c *pgx.Conn) error {
		_, _, err := s.pipeline(ctx, c, ops, s.OpTexts(ops), nil, nil, false)
		idle = c.PgConn().TxStatus()
		return err
	})
	if !errors.Is(err, errSequential) {
		t.Fatalf("the batch: %v; want its NOT NULL violation (errSequential)", err)
	}
	if idle != 'I' {
		t.Errorf("after the failed batch the connection's transaction status is %q; want idle", idle)
	}
	got, err := s.Lease(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.LeaseReserved {
		t.Errorf("after the failed batch the lease is %s: its first op was committed alone", got.State)
	}
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM events WHERE type LIKE 'test.%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("after the failed batch %d of its events are in the log", n)
	}

	// The same batch less its failing op commits.
	if _, errs, err := s.LeaseOps(ctx, ops[:1]); err != nil || errs[0] != nil {
		t.Fatalf("activate: %v, %v", err, errs)
	}
	if got, err := s.Lease(ctx, l.ID); err != nil || got.State != api.LeaseActive {
		t.Fatalf("after the batch the lease is %s, %v; want active", got.State, err)
	}
}

// TestLockDevicesAndEvents: the devices' lock of a batch written in one
// round trip also takes the event log's lock in shared mode (the batch's
// events are appended under it: doc.go), after locking the devices.
func TestLockDevicesAndEvents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openStore(ctx, t)
	err := s.onConn(ctx, "connection", func(c *pgx.Conn) error {
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		var n int
		if err := tx.QueryRow(ctx, lockDevicesSQL(2, true), "dev-a", "dev-b", lockClass, lockEvents).Scan(&n, nil); err != nil {
			return err
		}
		var mode string
		if err := tx.QueryRow(ctx, `SELECT mode FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
			AND classid = $1 AND objid = $2 AND objsubid = 2 AND granted`, lockClass, lockEvents).Scan(&mode); err != nil {
			return fmt.Errorf("the event log's lock is not held: %w", err)
		}
		if mode != "ShareLock" {
			return fmt.Errorf("the event log's lock is held in %s; want ShareLock", mode)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
