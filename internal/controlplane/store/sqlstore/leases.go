package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// LeaseCols are the columns ScanLease reads: the plan comes from
// lease_plans (migrations 6 and 7: keyed by creation time, so that new
// plans are appended), so that the lease row, rewritten on every
// transition, stays small.
const LeaseCols = `id, state, kind, mode, tenant, borrower, size, stripe_unit, bandwidth_cap, iops_cap, uri, credential, ttl_seconds, expires_at, created_at, updated_at, reason, idempotency_key, ` +
	`COALESCE((SELECT plan FROM lease_plans WHERE lease_plans.created_at = leases.created_at AND lease_plans.lease_id = leases.id), ''), parts`

// LeaseInsertCols are the columns of leases a creation writes
// (Dialect.InsertLease), but for the demand's (demand_bps, work_bytes,
// deadline_at, gateway).
const LeaseInsertCols = `id, state, kind, mode, tenant, borrower, size, stripe_unit, bandwidth_cap, iops_cap, uri, credential, ttl_seconds, expires_at, created_at, updated_at, reason, idempotency_key, parts`

// ScanLease reads a lease from a row of LeaseCols.
func (s *Core) ScanLease(sc interface{ Scan(...any) error }) (api.Lease, error) {
	var l api.Lease
	var exp, created, updated int64
	var plan, parts string
	if err := sc.Scan(&l.ID, &l.State, &l.Kind, &l.Mode, &l.Tenant, &l.Borrower, &l.Size, &l.StripeUnit, &l.BandwidthCap, &l.IOPSCap, &l.URI,
		&l.Credential, &l.TTLSeconds, &exp, &created, &updated, &l.Reason, &l.IdempotencyKey, &plan, &parts); err != nil {
		return l, err
	}
	l.ExpiresAt, l.CreatedAt, l.UpdatedAt = tm(exp), tm(created), tm(updated)
	if plan != "" {
		p, err := s.DecodePlan(plan)
		if err != nil {
			return l, err
		}
		l.Plan = p
	}
	ps, err := s.DecodeParts(parts)
	if err != nil {
		return l, err
	}
	l.Parts = ps
	FillDerived(&l)
	return l, nil
}

// GetLease reads lease id (store.ErrNotFound if there is none).
func (s *Core) GetLease(ctx context.Context, q Execer, id string) (api.Lease, error) {
	l, err := s.ScanLease(q.QueryRowContext(ctx, `SELECT `+LeaseCols+` FROM leases WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return l, fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return l, s.wrap("lease", err)
	}
	return l, nil
}

// FillDerived sets what a lease's row does not store but its parts say:
// its first part's node and device, and its count and held (api.Holding:
// they change as the lease is placed again or loses a part).
func FillDerived(l *api.Lease) {
	l.Count, l.Held = api.Holding(l.Parts)
	l.NodeID, l.DeviceID = "", ""
	if len(l.Parts) > 0 {
		l.NodeID, l.DeviceID = l.Parts[0].NodeID, l.Parts[0].DeviceID
	}
}

// CreateLease inserts a lease and reserves its parts atomically.
func (s *Core) CreateLease(ctx context.Context, l api.Lease, d store.Demand, idem *store.Idempotency, ev api.Event) (api.Lease, error) {
	return s.one(ctx, store.LeaseOp{Create: &store.NewLease{Lease: l, Demand: d, Idem: idem, Event: ev}})
}

// TransitionLease moves a lease between states (compare-and-set).
func (s *Core) TransitionLease(ctx context.Context, id string, ch store.LeaseChange, ev api.Event) (api.Lease, error) {
	return s.one(ctx, store.LeaseOp{Transition: store.Transition{ID: id, Change: ch, Event: ev}})
}

func (s *Core) one(ctx context.Context, op store.LeaseOp) (api.Lease, error) {
	out, errs, err := s.d.LeaseOps(ctx, []store.LeaseOp{op})
	if err != nil {
		return api.Lease{}, err
	}
	return out[0], errs[0]
}

// OpText is what an op stores as JSON (its plan, a creation's parts),
// encoded before the transaction.
type OpText struct{ Plan, Parts string }

// Late marks an error that happened after an op of a batch wrote: the
// batch must be rolled back, or the op rolled back to its savepoint. An
// op's refusals (ErrConflict, ErrCapacity, ...) come before it writes.
type Late struct{ Err error }

func (l Late) Error() string { return l.Err.Error() }
func (l Late) Unwrap() error { return l.Err }

// createTx is CreateLease's work inside a transaction. Refusals
// (ErrDuplicate, ErrCapacity) come before anything is written.
func (s *Core) createTx(ctx context.Context, tx Execer, n store.NewLease, text OpText) (api.Lease, error) {
	l, d, idem := n.Lease, n.Demand, n.Idem
	if idem != nil {
		if err := s.checkIdempotencyKey(ctx, tx, *idem); err != nil {
			return api.Lease{}, err
		}
	}
	if err := s.checkParts(ctx, tx, l.Kind, l.Parts); err != nil {
		return api.Lease{}, err
	}
	if n.Limit != nil {
		if err := s.checkLimit(ctx, tx, l, d, *n.Limit); err != nil {
			return api.Lease{}, err
		}
	}
	if err := s.d.InsertLease(ctx, tx, n, text); err != nil {
		var lt Late
		if errors.As(err, &lt) {
			return api.Lease{}, err
		}
		return api.Lease{}, Late{err}
	}
	if idem != nil {
		if err := s.putIdempotencyKey(ctx, tx, *idem, l.ID, l.CreatedAt); err != nil {
			return api.Lease{}, Late{err} // ErrDuplicate: another replica's request with the key committed first
		}
	}
	return CreatedLease(l), nil
}

// CreatedLease is what GetLease would read back right after CreateLease
// stored l, without the reads.
func CreatedLease(l api.Lease) api.Lease {
	l.ExpiresAt, l.CreatedAt, l.UpdatedAt = tm(ns(l.ExpiresAt)), tm(ns(l.CreatedAt)), tm(ns(l.UpdatedAt))
	parts := make([]api.Part, len(l.Parts))
	for i, p := range l.Parts {
		parts[i] = api.Part{NodeID: p.NodeID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length}
	}
	l.Parts = parts
	if l.Plan != nil {
		l.Plan = ClonePlan(l.Plan)
	}
	FillDerived(&l)
	return l
}

// ReplaceParts swaps a non-terminal lease's parts for new ones.
func (s *Core) ReplaceParts(ctx context.Context, id string, parts []api.Part, plan *api.Plan, at time.Time, ev api.Event) (api.Lease, error) {
	var out api.Lease
	partsText := s.PartsJSON(StoredParts(parts))
	err := s.tx(ctx, func(tx Execer) error {
		if err := s.d.LockParts(ctx, tx, nil, parts); err != nil {
			return err
		}
		var state api.LeaseState
		var kind api.Kind
		if err := tx.QueryRowContext(ctx, `SELECT state, kind FROM leases WHERE id = ?`+s.d.ForUpdate(), id).Scan(&state, &kind); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
			}
			return s.wrap("replace parts", err)
		}
		if state != api.LeaseRequested && state != api.LeaseReserved {
			return fmt.Errorf("lease %s is %s: %w", id, state, store.ErrConflict)
		}
		if err := s.Free(ctx, tx, id, true); err != nil {
			return err
		}
		if err := s.reserve(ctx, tx, id, kind, parts); err != nil {
			return err
		}
		q := `UPDATE leases SET state = 'reserved', updated_at = ?, parts = ?`
		args := []any{ns(at), partsText}
		if plan != nil {
			q += `, mode = ?`
			args = append(args, plan.Mode)
		}
		if _, err := tx.ExecContext(ctx, q+` WHERE id = ?`, append(args, id)...); err != nil {
			return s.wrap("replace parts", err)
		}
		if plan != nil {
			if err := s.ReplacePlan(ctx, tx, id, s.PlanJSON(plan)); err != nil {
				return err
			}
		}
		var err error
		if out, err = s.GetLease(ctx, tx, id); err != nil {
			return err
		}
		return s.appendEvents(ctx, tx, []api.Event{ev})
	})
	return out, err
}

// TransitionLeases applies several transitions in one write transaction
// (group commit), as LeaseOps does.
func (s *Core) TransitionLeases(ctx context.Context, ts []store.Transition) (out []api.Lease, errs []error, err error) {
	ops := make([]store.LeaseOp, len(ts))
	for i, t := range ts {
		ops[i].Transition = t
	}
	return s.d.LeaseOps(ctx, ops)
}

// errSavepoints makes WriteOps write a batch again, one savepoint per op.
var errSavepoints = errors.New("sqlstore: an op failed after writing")

// OpTexts are what ops store as JSON, encoded before their transaction.
func (s *Core) OpTexts(ops []store.LeaseOp) []OpText {
	texts := make([]OpText, len(ops))
	for i, op := range ops {
		switch {
		case op.Create != nil:
			texts[i] = OpText{Plan: s.PlanJSON(op.Create.Lease.Plan), Parts: s.PartsJSON(StoredParts(op.Create.Lease.Parts))}
		case op.Transition.Change.Plan != nil:
			texts[i].Plan = s.PlanJSON(op.Transition.Change.Plan)
		}
	}
	return texts
}

// WriteOps applies lease creations and transitions in one write
// transaction (group commit), statement by statement, each as CreateLease
// or TransitionLease would and independently of the others: errs[i] is op
// i's refusal, and a refused op left nothing behind. err is set, and
// nothing committed, when the batch itself fails. texts are OpTexts(ops).
//
// The batch first locks what its creations re-check (Dialect.LockParts:
// the tenants in tenants, the devices of parts); every op refuses before
// it writes, so a batch needs no savepoints; the events of the ops that
// succeeded are appended together at the end. In the unexpected case of
// an op failing after it wrote (PostgreSQL aborts the transaction at a
// failed statement), the batch is rolled back and written again with a
// savepoint around each op.
//
// The leases returned are shared with nothing but the caller's caches:
// CopyLease them before handing them out.
func (s *Core) WriteOps(ctx context.Context, ops []store.LeaseOp, texts []OpText, tenants []string, parts []api.Part) (out []api.Lease, errs []error, err error) {
	var staged []api.Lease // values written by the batch's earlier ops
	for _, savepoints := range []bool{false, true} {
		err = s.tx(ctx, func(tx Execer) error {
			out, errs = make([]api.Lease, len(ops)), make([]error, len(ops))
			evs := make([]api.Event, 0, len(ops))
			staged = staged[:0]
			if err := s.d.LockParts(ctx, tx, tenants, parts); err != nil {
				return err
			}
			for i, op := range ops {
				if savepoints {
					if _, err := tx.ExecContext(ctx, `SAVEPOINT op`); err != nil {
						return s.wrap("savepoint", err)
					}
				}
				ev := op.Transition.Event
				if op.Create != nil {
					out[i], errs[i] = s.createTx(ctx, tx, *op.Create, texts[i])
					ev = op.Create.Event
				} else {
					t := op.Transition
					if len(t.Change.From) == 0 {
						errs[i] = fmt.Errorf("lease %s: no source state: %w", t.ID, store.ErrConflict)
					} else {
						out[i], errs[i] = s.d.TransitionTx(ctx, tx, t.ID, t.Change, texts[i].Plan, staged)
					}
				}
				var lt Late
				if errors.As(errs[i], &lt) {
					if !savepoints || s.d.Fatal(lt.Err) {
						if savepoints {
							return lt.Err
						}
						return errSavepoints
					}
					errs[i] = lt.Err
				}
				if savepoints {
					if errs[i] != nil {
						if _, err := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT op`); err != nil {
							return s.wrap("rollback to savepoint", err)
						}
					}
					if _, err := tx.ExecContext(ctx, `RELEASE SAVEPOINT op`); err != nil {
						return s.wrap("release savepoint", err)
					}
				}
				if errs[i] == nil {
					staged = append(staged, out[i])
					if ev.Type != "" {
						evs = append(evs, ev)
					}
				}
			}
			return s.appendEvents(ctx, tx, evs)
		})
		if !errors.Is(err, errSavepoints) {
			break
		}
	}
	if err != nil {
		return nil, nil, err
	}
	return out, errs, nil
}

// CopyLease copies what a caller could change in place.
func CopyLease(l api.Lease) api.Lease {
	l.Parts = slices.Clone(l.Parts)
	if l.Parts == nil {
		l.Parts = []api.Part{}
	}
	if l.Plan != nil {
		l.Plan = ClonePlan(l.Plan)
	}
	return l
}

// Lease returns one lease.
func (s *Core) Lease(ctx context.Context, id string) (api.Lease, error) {
	return s.GetLease(ctx, s.rd(), id)
}

// Leases lists leases matching f, oldest first.
func (s *Core) Leases(ctx context.Context, f store.LeaseFilter) ([]api.Lease, error) {
	var where []string
	var args []any
	if f.Tenant != "" {
		where = append(where, `tenant = ?`)
		args = append(args, f.Tenant)
	}
	if f.Kind != "" {
		where = append(where, `kind = ?`)
		args = append(args, string(f.Kind))
	}
	if f.NodeID != "" {
		where = append(where, `id IN (SELECT lease_id FROM lease_parts WHERE node_id = ? AND live = 1)`)
		args = append(args, f.NodeID)
	}
	if len(f.NodeStates) > 0 {
		where = append(where, `id IN (SELECT lp.lease_id FROM lease_parts lp JOIN nodes n ON n.id = lp.node_id
			WHERE lp.live = 1 AND n.state IN (`+Placeholders(len(f.NodeStates))+`))`)
		for _, st := range f.NodeStates {
			args = append(args, string(st))
		}
	}
	if f.States != nil {
		where = append(where, `state IN (`+Placeholders(len(f.States))+`)`)
		for _, st := range f.States {
			args = append(args, st)
		}
		if len(f.States) == 0 {
			return []api.Lease{}, nil
		}
	}
	if f.IDs != nil {
		if len(f.IDs) == 0 {
			return []api.Lease{}, nil
		}
		where = append(where, `id IN (`+Placeholders(len(f.IDs))+`)`)
		for _, id := range f.IDs {
			args = append(args, id)
		}
	}
	if !f.ExpiresBefore.IsZero() {
		where = append(where, `expires_at < ?`)
		args = append(args, ns(f.ExpiresBefore))
	}
	if !f.After.IsZero() {
		at := ns(f.After.CreatedAt)
		where = append(where, `(created_at > ? OR (created_at = ? AND id > ?))`)
		args = append(args, at, at, f.After.ID)
	}
	cond := ""
	if len(where) > 0 {
		cond = ` WHERE ` + strings.Join(where, ` AND `)
	}
	if f.Limit > 0 {
		cond += ` ORDER BY created_at, id LIMIT ?`
		args = append(args, f.Limit)
	} else {
		cond += ` ORDER BY created_at, id`
	}
	// One statement: the parts are on the lease rows.
	rows, err := s.rd().QueryContext(ctx, `SELECT `+LeaseCols+` FROM leases`+cond, args...)
	if err != nil {
		return nil, s.wrap("leases", err)
	}
	defer rows.Close()
	out := []api.Lease{}
	for rows.Next() {
		l, err := s.ScanLease(rows)
		if err != nil {
			return nil, s.wrap("leases", err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("leases", err)
	}
	return out, nil
}

// ChangeSet is the SET clause of a transition's UPDATE of its lease's row
// but for the parts: the state, the time and the fields ch sets, their
// arguments appended to args.
func ChangeSet(ch store.LeaseChange, args []any) (string, []any) {
	set := `state = ?, updated_at = ?`
	args = append(args, string(ch.To), ns(ch.At))
	if ch.Reason != "" {
		set += `, reason = ?`
		args = append(args, ch.Reason)
	}
	if ch.URI != "" {
		set += `, uri = ?`
		args = append(args, ch.URI)
	}
	if !ch.ExpiresAt.IsZero() {
		set += `, expires_at = ?`
		args = append(args, ns(ch.ExpiresAt))
	}
	if ch.TTL != 0 {
		set += `, ttl_seconds = ?`
		args = append(args, ch.TTL)
	}
	return set, args
}

// ChangeWhere is the WHERE clause of a transition's compare-and-set of
// lease id (from one of ch.From, of ch.Tenant if set), its arguments
// appended to args.
func ChangeWhere(id string, ch store.LeaseChange, args []any) (string, []any) {
	where := ` WHERE id = ? AND state IN (` + Placeholders(len(ch.From)) + `)`
	args = append(args, id)
	for _, f := range ch.From {
		args = append(args, string(f))
	}
	if ch.Tenant != "" {
		where += ` AND tenant = ?`
		args = append(args, ch.Tenant)
	}
	if !ch.ExpiredBy.IsZero() {
		where += ` AND expires_at < ?`
		args = append(args, ns(ch.ExpiredBy))
	}
	return where, args
}

// TransitionRefusal is the refusal of a transition of lease id whose
// compare-and-set matched no row: store.ErrNotFound (no such lease, or
// another tenant's) or store.ErrConflict (in another state); a Late error
// if the lease cannot be read.
func (s *Core) TransitionRefusal(ctx context.Context, tx Execer, id string, ch store.LeaseChange) error {
	var state api.LeaseState
	var tenant string
	if err := tx.QueryRowContext(ctx, `SELECT state, tenant FROM leases WHERE id = ?`, id).Scan(&state, &tenant); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
		}
		return Late{Err: s.wrap("transition", err)}
	}
	if ch.Tenant != "" && tenant != ch.Tenant {
		return fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
	}
	if !ch.ExpiredBy.IsZero() && slices.Contains(ch.From, state) {
		return fmt.Errorf("lease %s was renewed: %w", id, store.ErrConflict)
	}
	return fmt.Errorf("lease %s is %s, not %v: %w", id, state, ch.From, store.ErrConflict)
}
