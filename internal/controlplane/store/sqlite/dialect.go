package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

// Times as stored (sqlstore.NS).
var (
	ns = sqlstore.NS
	tm = sqlstore.Time
)

// dialect is SQLite's sqlstore.Dialect for s: one writer connection runs
// every write transaction (BEGIN IMMEDIATE), so nothing needs a lock of
// its own; the other methods are in the files of what they write
// (events.go, leases.go, nodes.go).
type dialect struct{ s *Store }

func (dialect) Wrap(what string, err error) error {
	return corrupt(fmt.Errorf("sqlite: %s: %w", what, err))
}

func (d dialect) Tx(ctx context.Context, f func(tx sqlstore.Execer) error) error {
	return d.s.tx(ctx, f)
}

func (d dialect) Read() sqlstore.Execer { return d.s.rd() }

// ReadTx is a transaction on a read-only connection (the writer for
// :memory:): its statements share one snapshot.
func (d dialect) ReadTx(ctx context.Context) (sqlstore.Execer, func(), error) {
	s := d.s
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: s.r != s.w})
	if err != nil {
		return nil, nil, err
	}
	return cachedTx{tx, s.rs}, func() {
		tx.Rollback()
		s.rs.flush(ctx)
	}, nil
}

// ForUpdate: the writer is serial; a transaction's reads see what the
// last one committed.
func (dialect) ForUpdate() string { return "" }

// UniqueViolation: the checks run before the writes, on the one writer.
func (dialect) UniqueViolation(error) bool { return false }

func (dialect) LockParts(context.Context, sqlstore.Execer, []string, []api.Part) error { return nil }

func (dialect) LockEventLog(context.Context, sqlstore.Execer) error { return nil }

func (dialect) Fatal(error) bool { return false }

func (d dialect) LeaseOps(ctx context.Context, ops []store.LeaseOp) ([]api.Lease, []error, error) {
	return d.s.LeaseOps(ctx, ops)
}

func (d dialect) Heartbeats(ctx context.Context, beats []store.Beat) ([]api.NodeState, []error, error) {
	return d.s.Heartbeats(ctx, beats)
}
