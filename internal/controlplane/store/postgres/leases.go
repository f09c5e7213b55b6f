package postgres

import (
	"context"
	"database/sql"
	"errors"
	"slices"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

// LeaseOps applies lease creations and transitions in one write
// transaction (group commit), each as CreateLease or TransitionLease would
// and independently of the others: errs[i] is op i's refusal, and a
// refused op left nothing behind. err is set, and nothing committed, when
// the batch itself fails.
//
// A batch is written in one round trip, its creations checking
// themselves in their write statements, or in two when one of them was
// refused or cannot check itself (it carries a limit: pipeline.go); one that needs more (an op failed after writing)
// is written again statement by statement (sqlstore.Core.WriteOps),
// which first locks what its creations re-check (their tenants and
// devices, each in ID order: see doc.go).
func (s *Store) LeaseOps(ctx context.Context, ops []store.LeaseOp) (out []api.Lease, errs []error, err error) {
	texts := s.OpTexts(ops)
	var devs []string
	var tenants []string
	var parts []api.Part
	for _, op := range ops {
		if op.Create == nil {
			continue
		}
		parts = append(parts, op.Create.Lease.Parts...)
		for _, p := range op.Create.Lease.Parts {
			devs = append(devs, p.DeviceID)
		}
		if op.Create.Limit != nil {
			tenants = append(tenants, op.Create.Lease.Tenant)
		}
	}
	slices.Sort(tenants)
	tenants = slices.Compact(tenants)
	slices.Sort(devs)
	devs = slices.Compact(devs)
	err = errSequential
	careful := s.twoTrips
	for attempt := 0; attempt < maxTxAttempts && !s.sequential; attempt++ {
		out, errs, err = s.pipelined(ctx, ops, texts, tenants, devs, careful)
		if errors.Is(err, errRecheck) && !careful {
			careful = true // a creation was refused: judge them first
			out, errs, err = s.pipelined(ctx, ops, texts, tenants, devs, careful)
		}
		if err == nil {
			break
		}
		if errors.Is(err, errSequential) || !retryable(err) {
			break
		}
	}
	if errors.Is(err, errSequential) {
		out, errs, err = s.WriteOps(ctx, ops, texts, tenants, parts)
	}
	if err != nil {
		return nil, nil, err
	}
	for i := range out {
		out[i] = sqlstore.CopyLease(out[i])
	}
	return out, errs, nil
}

// InsertLease writes a new lease, its plan and its parts in one statement
// (a round trip each would be most of a creation's cost): the pipeline's
// (createSQL), without the idempotency key and the event, which the
// caller writes.
func (dialect) InsertLease(ctx context.Context, tx sqlstore.Execer, n store.NewLease, text sqlstore.OpText) error {
	n.Idem, n.Event = nil, api.Event{}
	q, args := createSQL(n, text, false)
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return wrap("create lease", err)
	}
	return nil
}

// TransitionTx is TransitionLease's work inside a transaction, but for
// the event: one statement (the pipeline's, transitionSQL) does the
// compare-and-set, records the parts' URIs, frees the parts of a lease
// that ends or the parts it lost, replaces its plan, and reads the row
// back. A refusal (ErrConflict, ErrNotFound) comes before anything is
// written.
func (d dialect) TransitionTx(ctx context.Context, tx sqlstore.Execer, id string, ch store.LeaseChange, plan string, _ []api.Lease) (api.Lease, error) {
	s := d.s
	q, args := transitionSQL(store.Transition{ID: id, Change: ch}, plan)
	l, err := s.ScanLease(tx.QueryRowContext(ctx, q, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return api.Lease{}, s.TransitionRefusal(ctx, tx, id, ch)
	}
	if err != nil {
		// A NOT NULL violation: more URIs than parts.
		return api.Lease{}, sqlstore.Late{Err: wrap("transition", err)}
	}
	if ch.Plan != nil { // the row was read back before the plan was written
		p, err := s.DecodePlan(plan)
		if err != nil {
			return api.Lease{}, sqlstore.Late{Err: err}
		}
		l.Plan = p
	}
	return l, nil
}
