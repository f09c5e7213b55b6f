package postgres

import (
	"context"
	"database/sql"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

// dialect is PostgreSQL's sqlstore.Dialect for s: several replicas write
// at once, so the writes lock what they re-check (doc.go); the other
// methods are in the files of what they write (events.go, leases.go,
// nodes.go).
type dialect struct{ s *Store }

func (dialect) Wrap(what string, err error) error { return wrap(what, err) }

func (d dialect) Tx(ctx context.Context, f func(tx sqlstore.Execer) error) error {
	return d.s.tx(ctx, f)
}

func (d dialect) Read() sqlstore.Execer { return d.s.rd() }

// ReadTx is a REPEATABLE READ transaction: its statements share one
// snapshot.
func (d dialect) ReadTx(ctx context.Context) (sqlstore.Execer, func(), error) {
	tx, err := d.s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return nil, nil, err
	}
	return rebound{tx}, func() { tx.Rollback() }, nil
}

func (dialect) ForUpdate() string { return ` FOR UPDATE` }

func (dialect) UniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// Fatal: PostgreSQL's own retries and lost connections abort the batch.
func (dialect) Fatal(err error) bool { return unavailable(err) || retryable(err) }

func (d dialect) LeaseOps(ctx context.Context, ops []store.LeaseOp) ([]api.Lease, []error, error) {
	return d.s.LeaseOps(ctx, ops)
}

func (d dialect) Heartbeats(ctx context.Context, beats []store.Beat) ([]api.NodeState, []error, error) {
	return d.s.Heartbeats(ctx, beats)
}

// LockParts locks, in the order doc.go gives, what creations and
// re-placements re-check: the tenants whose limits they check (a
// transaction-scoped advisory lock each) and the parts' devices (FOR
// UPDATE: one reservation on a device at a time), each in ID order.
// Nodes are not locked: a reservation that races a node's move to
// suspect or down may commit on it, and the sweep, which looks for the
// leases of a down node on every pass, marks it lost like the others.
// The checks then read what the previous holders committed.
func (dialect) LockParts(ctx context.Context, tx sqlstore.Execer, tenants []string, parts []api.Part) error {
	tenants = slices.Clone(tenants)
	slices.Sort(tenants)
	for _, t := range slices.Compact(tenants) {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?, hashtext(?))`, lockTenantNS, t); err != nil {
			return wrap("lock tenant", err)
		}
	}
	if len(parts) == 0 {
		return nil
	}
	devs := make([]string, 0, len(parts))
	for _, p := range parts {
		devs = append(devs, p.DeviceID)
	}
	slices.Sort(devs)
	if _, err := tx.ExecContext(ctx, `SELECT id FROM devices WHERE id = ANY(?) ORDER BY id FOR UPDATE`, slices.Compact(devs)); err != nil {
		return wrap("lock devices", err)
	}
	return nil
}
