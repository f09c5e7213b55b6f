package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// leaseCols are the columns scanLease reads: the plan comes from
// lease_plans (migrations 6 and 7: keyed by creation time, so that new
// plans are appended), so that the lease row, rewritten on every
// transition, stays small.
const leaseCols = `id, state, kind, mode, tenant, borrower, size, count, stripe_unit, bandwidth_cap, iops_cap, uri, credential, ttl_seconds, expires_at, created_at, updated_at, reason, idempotency_key, ` +
	`COALESCE((SELECT plan FROM lease_plans WHERE lease_plans.created_at = leases.created_at AND lease_plans.lease_id = leases.id), ''), parts`

// leaseInsertCols are the columns createTx writes.
const leaseInsertCols = `id, state, kind, mode, tenant, borrower, size, count, stripe_unit, bandwidth_cap, iops_cap, uri, credential, ttl_seconds, expires_at, created_at, updated_at, reason, idempotency_key, parts`

func (s *Store) scanLease(sc interface{ Scan(...any) error }) (api.Lease, error) {
	var l api.Lease
	var exp, created, updated int64
	var plan, parts string
	if err := sc.Scan(&l.ID, &l.State, &l.Kind, &l.Mode, &l.Tenant, &l.Borrower, &l.Size, &l.Count, &l.StripeUnit, &l.BandwidthCap, &l.IOPSCap, &l.URI,
		&l.Credential, &l.TTLSeconds, &exp, &created, &updated, &l.Reason, &l.IdempotencyKey, &plan, &parts); err != nil {
		return l, err
	}
	l.ExpiresAt, l.CreatedAt, l.UpdatedAt = tm(exp), tm(created), tm(updated)
	if plan != "" {
		p, err := s.decodePlan(plan)
		if err != nil {
			return l, err
		}
		l.Plan = p
	}
	ps, err := s.decodeParts(parts)
	if err != nil {
		return l, err
	}
	l.Parts = ps
	fillFirst(&l)
	return l, nil
}

func (s *Store) getLease(ctx context.Context, q execer, id string) (api.Lease, error) {
	l, err := s.scanLease(q.QueryRowContext(ctx, `SELECT `+leaseCols+` FROM leases WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return l, fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return l, fmt.Errorf("sqlite: lease: %w", err)
	}
	return l, nil
}

func fillFirst(l *api.Lease) {
	l.NodeID, l.DeviceID = "", ""
	if len(l.Parts) > 0 {
		l.NodeID, l.DeviceID = l.Parts[0].NodeID, l.Parts[0].DeviceID
	}
}

// CreateLease inserts a lease and reserves its parts atomically.
func (s *Store) CreateLease(ctx context.Context, l api.Lease, d store.Demand, idem *store.Idempotency, ev api.Event) (api.Lease, error) {
	return s.one(ctx, store.LeaseOp{Create: &store.NewLease{Lease: l, Demand: d, Idem: idem, Event: ev}})
}

// TransitionLease moves a lease between states (compare-and-set).
func (s *Store) TransitionLease(ctx context.Context, id string, ch store.LeaseChange, ev api.Event) (api.Lease, error) {
	return s.one(ctx, store.LeaseOp{Transition: store.Transition{ID: id, Change: ch, Event: ev}})
}

func (s *Store) one(ctx context.Context, op store.LeaseOp) (api.Lease, error) {
	out, errs, err := s.LeaseOps(ctx, []store.LeaseOp{op})
	if err != nil {
		return api.Lease{}, err
	}
	return out[0], errs[0]
}

// opText is what an op stores as JSON, encoded before the transaction:
// the writer is serial.
type opText struct{ plan, parts string }

// late marks an error that happened after an op of a batch wrote: the
// batch must be rolled back, or the op rolled back to its savepoint. An
// op's refusals (ErrConflict, ErrCapacity, ...) come before it writes.
type late struct{ err error }

func (l late) Error() string { return l.err.Error() }
func (l late) Unwrap() error { return l.err }

// createTx is CreateLease's work inside a transaction. Refusals
// (ErrDuplicate, ErrCapacity) come before anything is written.
func (s *Store) createTx(ctx context.Context, tx execer, n store.NewLease, text opText) (api.Lease, error) {
	l, d, idem := n.Lease, n.Demand, n.Idem
	if idem != nil {
		if err := checkIdempotencyKey(ctx, tx, *idem); err != nil {
			return api.Lease{}, err
		}
	}
	if err := checkParts(ctx, tx, l.Kind, l.Parts); err != nil {
		return api.Lease{}, err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO leases (`+leaseInsertCols+`, demand_bps, work_bytes, deadline_at, gateway) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		l.ID, l.State, l.Kind, l.Mode, l.Tenant, l.Borrower, l.Size, l.Count, l.StripeUnit, l.BandwidthCap, l.IOPSCap, l.URI, l.Credential, l.TTLSeconds,
		ns(l.ExpiresAt), ns(l.CreatedAt), ns(l.UpdatedAt), l.Reason, l.IdempotencyKey, text.parts, d.Bandwidth, d.Work, ns(d.Deadline), d.Gateway)
	if err != nil {
		return api.Lease{}, late{fmt.Errorf("sqlite: create lease: %w", err)}
	}
	if text.plan != "" {
		if err := putPlan(ctx, tx, l.CreatedAt, l.ID, text.plan); err != nil {
			return api.Lease{}, late{err}
		}
	}
	if err := insertParts(ctx, tx, l.ID, l.Parts); err != nil {
		return api.Lease{}, err
	}
	if idem != nil {
		if err := putIdempotencyKey(ctx, tx, *idem, l.ID, l.CreatedAt); err != nil {
			return api.Lease{}, late{err}
		}
	}
	return createdLease(l), nil
}

// createdLease is what getLease would read back right after CreateLease
// stored l, without the reads.
func createdLease(l api.Lease) api.Lease {
	l.ExpiresAt, l.CreatedAt, l.UpdatedAt = tm(ns(l.ExpiresAt)), tm(ns(l.CreatedAt)), tm(ns(l.UpdatedAt))
	parts := make([]api.Part, len(l.Parts))
	for i, p := range l.Parts {
		parts[i] = api.Part{NodeID: p.NodeID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length}
	}
	l.Parts = parts
	if l.Plan != nil {
		l.Plan = clonePlan(l.Plan)
	}
	fillFirst(&l)
	return l
}

// ReplaceParts swaps a non-terminal lease's parts for new ones.
func (s *Store) ReplaceParts(ctx context.Context, id string, parts []api.Part, plan *api.Plan, at time.Time, ev api.Event) (api.Lease, error) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	defer s.live.drop(id) // read back from the row next time
	var out api.Lease
	partsText := s.partsJSON(storedParts(parts))
	err := s.tx(ctx, func(tx execer) error {
		var state api.LeaseState
		var kind api.Kind
		if err := tx.QueryRowContext(ctx, `SELECT state, kind FROM leases WHERE id = ?`, id).Scan(&state, &kind); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
			}
			return fmt.Errorf("sqlite: replace parts: %w", err)
		}
		if state != api.LeaseRequested && state != api.LeaseReserved {
			return fmt.Errorf("lease %s is %s: %w", id, state, store.ErrConflict)
		}
		if err := free(ctx, tx, id, true); err != nil {
			return err
		}
		if err := reserve(ctx, tx, id, kind, parts); err != nil {
			return err
		}
		q := `UPDATE leases SET state = 'reserved', updated_at = ?, parts = ?`
		args := []any{ns(at), partsText}
		if plan != nil {
			q += `, mode = ?`
			args = append(args, plan.Mode)
		}
		if _, err := tx.ExecContext(ctx, q+` WHERE id = ?`, append(args, id)...); err != nil {
			return fmt.Errorf("sqlite: replace parts: %w", err)
		}
		if plan != nil {
			if err := replacePlan(ctx, tx, id, s.planJSON(plan)); err != nil {
				return err
			}
		}
		if err := s.appendEvents(ctx, tx, []api.Event{ev}); err != nil {
			return err
		}
		var err error
		out, err = s.getLease(ctx, tx, id)
		return err
	})
	return out, err
}

// TransitionLeases applies several transitions in one write transaction
// (group commit), as LeaseOps does.
func (s *Store) TransitionLeases(ctx context.Context, ts []store.Transition) (out []api.Lease, errs []error, err error) {
	ops := make([]store.LeaseOp, len(ts))
	for i, t := range ts {
		ops[i].Transition = t
	}
	return s.LeaseOps(ctx, ops)
}

// errSavepoints makes LeaseOps write a batch again, one savepoint per op.
var errSavepoints = errors.New("sqlite: an op failed after writing")

// LeaseOps applies lease creations and transitions in one write
// transaction (group commit), each as CreateLease or TransitionLease would
// and independently of the others: errs[i] is op i's refusal, and a
// refused op left nothing behind. err is set, and nothing committed, when
// the batch itself fails.
//
// Every op refuses before it writes, so a batch needs no savepoints; the
// events of the ops that succeeded are appended together at the end. In
// the unexpected case of an op failing after it wrote, the batch is rolled
// back and written again with a savepoint around each op.
func (s *Store) LeaseOps(ctx context.Context, ops []store.LeaseOp) (out []api.Lease, errs []error, err error) {
	texts := make([]opText, len(ops)) // outside the transaction: the writer is serial
	for i, op := range ops {
		switch {
		case op.Create != nil:
			texts[i] = opText{plan: s.planJSON(op.Create.Lease.Plan), parts: s.partsJSON(storedParts(op.Create.Lease.Parts))}
		case op.Transition.Change.Plan != nil:
			texts[i].plan = s.planJSON(op.Transition.Change.Plan)
		}
	}
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	var staged []api.Lease // committed values, once the batch commits
	for _, savepoints := range []bool{false, true} {
		err = s.tx(ctx, func(tx execer) error {
			out, errs = make([]api.Lease, len(ops)), make([]error, len(ops))
			evs := make([]api.Event, 0, len(ops))
			staged = staged[:0]
			for i, op := range ops {
				if savepoints {
					if _, err := tx.ExecContext(ctx, `SAVEPOINT op`); err != nil {
						return fmt.Errorf("sqlite: savepoint: %w", err)
					}
				}
				ev := op.Transition.Event
				if op.Create != nil {
					out[i], errs[i] = s.createTx(ctx, tx, *op.Create, texts[i])
					ev = op.Create.Event
				} else {
					t := op.Transition
					out[i], errs[i] = s.transitionTx(ctx, tx, t.ID, t.Change, texts[i].plan, s.live.lookup(t.ID, staged))
				}
				var lt late
				if errors.As(errs[i], &lt) {
					if !savepoints {
						return errSavepoints
					}
					errs[i] = lt.err
				}
				if savepoints {
					if errs[i] != nil {
						if _, err := tx.ExecContext(ctx, `ROLLBACK TO op`); err != nil {
							return fmt.Errorf("sqlite: rollback to savepoint: %w", err)
						}
					}
					if _, err := tx.ExecContext(ctx, `RELEASE op`); err != nil {
						return fmt.Errorf("sqlite: release savepoint: %w", err)
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
	s.live.update(staged)
	for i := range out {
		out[i] = copyLease(out[i]) // the cache keeps its own
	}
	return out, errs, nil
}

// applyChange is what a transition's UPDATE does to the row, applied to
// its value; false if it cannot tell (more URIs than parts).
func (s *Store) applyChange(l api.Lease, ch store.LeaseChange, plan string) (api.Lease, bool) {
	if len(ch.URIs) > len(l.Parts) {
		return l, false
	}
	l.State, l.UpdatedAt = ch.To, tm(ns(ch.At))
	if ch.Reason != "" {
		l.Reason = ch.Reason
	}
	if ch.URI != "" {
		l.URI = ch.URI
	}
	if !ch.ExpiresAt.IsZero() {
		l.ExpiresAt = tm(ns(ch.ExpiresAt))
	}
	if ch.TTL != 0 {
		l.TTLSeconds = ch.TTL
	}
	if ch.Plan != nil {
		p, err := s.decodePlan(plan)
		if err != nil {
			return l, false
		}
		l.Plan = p
	}
	if len(ch.URIs) > 0 || len(ch.LostParts) > 0 {
		l.Parts = slices.Clone(l.Parts)
		for i, u := range ch.URIs {
			l.Parts[i].URI = u
		}
		for _, i := range ch.LostParts {
			if i < 0 || i >= len(l.Parts) {
				return l, false
			}
			l.Parts[i].State = api.PartLost
		}
	}
	return l, true
}

// transitionTx is TransitionLease's work inside a transaction, but for
// the event. A refusal (ErrConflict, ErrNotFound) comes before anything is
// written.
//
// prev, when known, is the lease's committed value: the row is then
// updated without being read back, and the change applied to prev.
func (s *Store) transitionTx(ctx context.Context, tx execer, id string, ch store.LeaseChange, plan string, prev *api.Lease) (api.Lease, error) {
	if len(ch.From) == 0 {
		return api.Lease{}, fmt.Errorf("lease %s: no source state: %w", id, store.ErrConflict)
	}
	var next api.Lease
	var partsText string
	if prev != nil {
		var ok bool
		if next, ok = s.applyChange(*prev, ch, plan); !ok {
			prev = nil
		} else if len(ch.URIs) > 0 || len(ch.LostParts) > 0 {
			partsText = s.partsJSON(next.Parts)
		}
	}
	// One statement does the compare-and-set, records the parts' URIs and
	// reads the row back.
	q := `UPDATE leases SET state = ?, updated_at = ?`
	args := make([]any, 0, 9+len(ch.From)+2*len(ch.URIs))
	args = append(args, ch.To, ns(ch.At))
	if ch.Reason != "" {
		q += `, reason = ?`
		args = append(args, ch.Reason)
	}
	if ch.URI != "" {
		q += `, uri = ?`
		args = append(args, ch.URI)
	}
	if !ch.ExpiresAt.IsZero() {
		q += `, expires_at = ?`
		args = append(args, ns(ch.ExpiresAt))
	}
	if ch.TTL != 0 {
		q += `, ttl_seconds = ?`
		args = append(args, ch.TTL)
	}
	switch {
	case (len(ch.URIs) > 0 || len(ch.LostParts) > 0) && prev != nil:
		q += `, parts = ?`
		args = append(args, partsText)
	case len(ch.URIs) > 0 || len(ch.LostParts) > 0:
		q += `, parts = json_set(parts` + strings.Repeat(`, ?, ?`, len(ch.URIs)+len(ch.LostParts)) + `)`
		for i, u := range ch.URIs {
			args = append(args, "$["+strconv.Itoa(i)+"].uri", u)
		}
		for _, i := range ch.LostParts {
			args = append(args, "$["+strconv.Itoa(i)+"].state", string(api.PartLost))
		}
	}
	q += ` WHERE id = ? AND state IN (` + placeholders(len(ch.From)) + `)`
	args = append(args, id)
	for _, f := range ch.From {
		args = append(args, f)
	}
	if ch.Tenant != "" {
		q += ` AND tenant = ?`
		args = append(args, ch.Tenant)
	}
	var l api.Lease
	var err error
	if prev != nil {
		var res sql.Result
		var n int64
		if res, err = tx.ExecContext(ctx, q, args...); err == nil {
			if n, err = res.RowsAffected(); err == nil && n == 0 {
				err = sql.ErrNoRows
			}
		}
		l = next
	} else {
		l, err = s.scanLease(tx.QueryRowContext(ctx, q+` RETURNING `+leaseCols, args...))
	}
	if errors.Is(err, sql.ErrNoRows) {
		var state api.LeaseState
		var tenant string
		if err := tx.QueryRowContext(ctx, `SELECT state, tenant FROM leases WHERE id = ?`, id).Scan(&state, &tenant); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return api.Lease{}, fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
			}
			return api.Lease{}, fmt.Errorf("sqlite: transition: %w", err)
		}
		if ch.Tenant != "" && tenant != ch.Tenant {
			return api.Lease{}, fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
		}
		return api.Lease{}, fmt.Errorf("lease %s is %s, not %v: %w", id, state, ch.From, store.ErrConflict)
	}
	if err != nil {
		return api.Lease{}, late{fmt.Errorf("sqlite: transition: %w", err)}
	}
	if ch.Plan != nil {
		if err := replacePlan(ctx, tx, id, plan); err != nil {
			return api.Lease{}, late{err}
		}
		if prev == nil { // read back before the plan was written
			p, err := s.decodePlan(plan)
			if err != nil {
				return api.Lease{}, late{err}
			}
			l.Plan = p
		}
	}
	if ch.To.Terminal() {
		// free only touches live parts: a no-op if the lease had already
		// ended.
		if err := free(ctx, tx, id, false); err != nil {
			return api.Lease{}, late{err}
		}
	} else if len(ch.LostParts) > 0 {
		if err := freeParts(ctx, tx, id, ch.LostParts); err != nil {
			return api.Lease{}, late{err}
		}
	}
	return l, nil
}

// Lease returns one lease.
func (s *Store) Lease(ctx context.Context, id string) (api.Lease, error) {
	return s.getLease(ctx, s.rd(), id)
}

// Leases lists leases matching f, oldest first.
func (s *Store) Leases(ctx context.Context, f store.LeaseFilter) ([]api.Lease, error) {
	var where []string
	var args []any
	if f.Tenant != "" {
		where = append(where, `tenant = ?`)
		args = append(args, f.Tenant)
	}
	if f.NodeID != "" {
		where = append(where, `id IN (SELECT lease_id FROM lease_parts WHERE node_id = ? AND live = 1)`)
		args = append(args, f.NodeID)
	}
	if f.States != nil {
		where = append(where, `state IN (`+placeholders(len(f.States))+`)`)
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
		where = append(where, `id IN (`+placeholders(len(f.IDs))+`)`)
		for _, id := range f.IDs {
			args = append(args, id)
		}
	}
	if !f.ExpiresBefore.IsZero() {
		where = append(where, `expires_at < ?`)
		args = append(args, ns(f.ExpiresBefore))
	}
	cond := ""
	if len(where) > 0 {
		cond = ` WHERE ` + strings.Join(where, ` AND `)
	}
	// One statement: the parts are on the lease rows.
	rows, err := s.rd().QueryContext(ctx, `SELECT `+leaseCols+` FROM leases`+cond+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: leases: %w", err)
	}
	defer rows.Close()
	out := []api.Lease{}
	for rows.Next() {
		l, err := s.scanLease(rows)
		if err != nil {
			return nil, fmt.Errorf("sqlite: leases: %w", err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: leases: %w", err)
	}
	return out, nil
}
