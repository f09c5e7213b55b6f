package postgres

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
		return l, wrap("lease", err)
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
	if n.Limit != nil {
		if err := checkLimit(ctx, tx, l, d, *n.Limit); err != nil {
			return api.Lease{}, err
		}
	}
	// One statement writes the lease, its plan and its parts (a round
	// trip each would be most of a creation's cost).
	nodes, devs := make([]string, len(l.Parts)), make([]string, len(l.Parts))
	offs, lens := make([]int64, len(l.Parts)), make([]int64, len(l.Parts))
	for i, p := range l.Parts {
		nodes[i], devs[i], offs[i], lens[i] = p.NodeID, p.DeviceID, p.Offset, p.Length
	}
	_, err := tx.ExecContext(ctx, `WITH l AS (INSERT INTO leases (`+leaseInsertCols+`, demand_bps, work_bytes, deadline_at, gateway)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)),
		p AS (INSERT INTO lease_plans (created_at, lease_id, plan) SELECT ?, ?, ? WHERE ? <> ''),
		x AS (INSERT INTO lease_parts (lease_id, idx, node_id, device_id, off, length, uri, live)
			SELECT ?, t.i - 1, t.node, t.dev, t.off, t.len, '', 1
			FROM unnest(?::text[], ?::text[], ?::bigint[], ?::bigint[]) WITH ORDINALITY AS t(node, dev, off, len, i))
		SELECT 1`,
		l.ID, l.State, l.Kind, l.Mode, l.Tenant, l.Borrower, l.Size, l.Count, l.StripeUnit, l.BandwidthCap, l.IOPSCap, l.URI, l.Credential, l.TTLSeconds,
		ns(l.ExpiresAt), ns(l.CreatedAt), ns(l.UpdatedAt), l.Reason, l.IdempotencyKey, text.parts, d.Bandwidth, d.Work, ns(d.Deadline), d.Gateway,
		ns(l.CreatedAt), l.ID, text.plan, text.plan,
		l.ID, nodes, devs, offs, lens)
	if err != nil {
		return api.Lease{}, late{wrap("create lease", err)}
	}
	if idem != nil {
		if err := putIdempotencyKey(ctx, tx, *idem, l.ID, l.CreatedAt); err != nil {
			return api.Lease{}, late{err} // ErrDuplicate: another replica's request with the key committed first
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
	var out api.Lease
	partsText := s.partsJSON(storedParts(parts))
	err := s.tx(ctx, func(tx execer) error {
		if err := lockParts(ctx, tx, nil, parts); err != nil {
			return err
		}
		var state api.LeaseState
		var kind api.Kind
		if err := tx.QueryRowContext(ctx, `SELECT state, kind FROM leases WHERE id = ? FOR UPDATE`, id).Scan(&state, &kind); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
			}
			return wrap("replace parts", err)
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
			return wrap("replace parts", err)
		}
		if plan != nil {
			if err := replacePlan(ctx, tx, id, s.planJSON(plan)); err != nil {
				return err
			}
		}
		var err error
		if out, err = s.getLease(ctx, tx, id); err != nil {
			return err
		}
		return s.appendEvents(ctx, tx, []api.Event{ev})
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
var errSavepoints = errors.New("postgres: an op failed after writing")

// LeaseOps applies lease creations and transitions in one write
// transaction (group commit), each as CreateLease or TransitionLease would
// and independently of the others: errs[i] is op i's refusal, and a
// refused op left nothing behind. err is set, and nothing committed, when
// the batch itself fails.
//
// The batch first locks what its creations re-check (their tenants, nodes
// and devices, in that order and each in ID order: see doc.go); every op
// refuses before it writes, so a batch needs no savepoints; the events of
// the ops that succeeded are appended together at the end. In the
// unexpected case of an op failing after it wrote (PostgreSQL aborts the
// transaction at a failed statement), the batch is rolled back and
// written again with a savepoint around each op.
func (s *Store) LeaseOps(ctx context.Context, ops []store.LeaseOp) (out []api.Lease, errs []error, err error) {
	texts := make([]opText, len(ops))
	var devs []string
	var tenants []string
	var parts []api.Part
	for i, op := range ops {
		switch {
		case op.Create != nil:
			texts[i] = opText{plan: s.planJSON(op.Create.Lease.Plan), parts: s.partsJSON(storedParts(op.Create.Lease.Parts))}
			parts = append(parts, op.Create.Lease.Parts...)
			for _, p := range op.Create.Lease.Parts {
				devs = append(devs, p.DeviceID)
			}
			if op.Create.Limit != nil {
				tenants = append(tenants, op.Create.Lease.Tenant)
			}
		case op.Transition.Change.Plan != nil:
			texts[i].plan = s.planJSON(op.Transition.Change.Plan)
		}
	}
	slices.Sort(tenants)
	tenants = slices.Compact(tenants)
	slices.Sort(devs)
	devs = slices.Compact(devs)
	for attempt := 0; attempt < maxTxAttempts; attempt++ {
		out, errs, err = s.pipelined(ctx, ops, texts, tenants, devs)
		if err == nil {
			for i := range out {
				out[i] = copyLease(out[i])
			}
			return out, errs, nil
		}
		if errors.Is(err, errSequential) || !retryable(err) {
			break
		}
	}
	if !errors.Is(err, errSequential) {
		return nil, nil, err
	}
	for _, savepoints := range []bool{false, true} {
		err = s.tx(ctx, func(tx execer) error {
			out, errs = make([]api.Lease, len(ops)), make([]error, len(ops))
			evs := make([]api.Event, 0, len(ops))
			if err := lockParts(ctx, tx, tenants, parts); err != nil {
				return err
			}
			for i, op := range ops {
				if savepoints {
					if _, err := tx.ExecContext(ctx, `SAVEPOINT op`); err != nil {
						return wrap("savepoint", err)
					}
				}
				ev := op.Transition.Event
				if op.Create != nil {
					out[i], errs[i] = s.createTx(ctx, tx, *op.Create, texts[i])
					ev = op.Create.Event
				} else {
					t := op.Transition
					out[i], errs[i] = s.transitionTx(ctx, tx, t.ID, t.Change, texts[i].plan)
				}
				var lt late
				if errors.As(errs[i], &lt) {
					if !savepoints || unavailable(lt.err) || retryable(lt.err) {
						if savepoints {
							return lt.err
						}
						return errSavepoints
					}
					errs[i] = lt.err
				}
				if savepoints {
					if errs[i] != nil {
						if _, err := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT op`); err != nil {
							return wrap("rollback to savepoint", err)
						}
					}
					if _, err := tx.ExecContext(ctx, `RELEASE SAVEPOINT op`); err != nil {
						return wrap("release savepoint", err)
					}
				}
				if errs[i] == nil && ev.Type != "" {
					evs = append(evs, ev)
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
	for i := range out {
		out[i] = copyLease(out[i])
	}
	return out, errs, nil
}

// copyLease copies what a caller could change in place.
func copyLease(l api.Lease) api.Lease {
	l.Parts = slices.Clone(l.Parts)
	if l.Parts == nil {
		l.Parts = []api.Part{}
	}
	if l.Plan != nil {
		l.Plan = clonePlan(l.Plan)
	}
	return l
}

// partsSet is the SET clause's part for a change's parts (their URIs, the
// parts lost), its arguments appended to args; "" if it changes none. The
// parts become NULL — a NOT NULL violation — when the change names a part
// the lease lacks.
func partsSet(ch store.LeaseChange, args *[]any) string {
	if len(ch.URIs) == 0 && len(ch.LostParts) == 0 {
		return ""
	}
	expr := `parts::jsonb`
	need := len(ch.URIs)
	for i, u := range ch.URIs {
		expr = `jsonb_set(` + expr + `, ?::text[], to_jsonb(?::text))`
		*args = append(*args, []string{strconv.Itoa(i), "uri"}, u)
	}
	for _, i := range ch.LostParts {
		if i < 0 {
			return `, parts = NULL`
		}
		expr = `jsonb_set(` + expr + `, ?::text[], to_jsonb(?::text))`
		*args = append(*args, []string{strconv.Itoa(i), "state"}, string(api.PartLost))
		need = max(need, i+1)
	}
	return `, parts = CASE WHEN jsonb_array_length(parts::jsonb) >= ` + strconv.Itoa(need) + ` THEN (` + expr + `)::text ELSE NULL END`
}

// lostIdx are the indexes of lost parts as the statement takes them.
func lostIdx(idx []int) []int64 {
	out := make([]int64, len(idx))
	for k, i := range idx {
		out[k] = int64(i)
	}
	return out
}

// transitionTx is TransitionLease's work inside a transaction, but for
// the event: one statement does the compare-and-set, records the parts'
// URIs, frees the parts of a lease that ends, and reads the row back. A
// refusal (ErrConflict, ErrNotFound) comes before anything is written.
func (s *Store) transitionTx(ctx context.Context, tx execer, id string, ch store.LeaseChange, plan string) (api.Lease, error) {
	if len(ch.From) == 0 {
		return api.Lease{}, fmt.Errorf("lease %s: no source state: %w", id, store.ErrConflict)
	}
	set := `state = ?, updated_at = ?`
	args := make([]any, 0, 12+len(ch.From)+2*len(ch.URIs))
	args = append(args, ch.To, ns(ch.At))
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
	set += partsSet(ch, &args)
	where := ` WHERE id = ? AND state IN (` + placeholders(len(ch.From)) + `)`
	args = append(args, id)
	for _, f := range ch.From {
		args = append(args, f)
	}
	if ch.Tenant != "" {
		where += ` AND tenant = ?`
		args = append(args, ch.Tenant)
	}
	q := `WITH u AS (UPDATE leases SET ` + set + where + ` RETURNING ` + leaseCols + `)`
	if ch.To.Terminal() {
		// Free only touches live parts: a no-op if the lease had ended.
		q += `, f AS (UPDATE lease_parts SET live = 0 WHERE lease_id = ? AND live = 1 AND EXISTS (SELECT 1 FROM u))`
		args = append(args, id)
	} else if len(ch.LostParts) > 0 {
		q += `, fl AS (UPDATE lease_parts SET live = 0 WHERE lease_id = ? AND live = 1 AND idx = ANY(?::bigint[]) AND EXISTS (SELECT 1 FROM u))`
		args = append(args, id, lostIdx(ch.LostParts))
	}
	l, err := s.scanLease(tx.QueryRowContext(ctx, q+` SELECT * FROM u`, args...))
	if errors.Is(err, sql.ErrNoRows) {
		var state api.LeaseState
		var tenant string
		if err := tx.QueryRowContext(ctx, `SELECT state, tenant FROM leases WHERE id = ?`, id).Scan(&state, &tenant); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return api.Lease{}, fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
			}
			return api.Lease{}, late{wrap("transition", err)}
		}
		if ch.Tenant != "" && tenant != ch.Tenant {
			return api.Lease{}, fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
		}
		return api.Lease{}, fmt.Errorf("lease %s is %s, not %v: %w", id, state, ch.From, store.ErrConflict)
	}
	if err != nil {
		// A NOT NULL violation: more URIs than parts.
		return api.Lease{}, late{wrap("transition", err)}
	}
	if ch.Plan != nil {
		if err := replacePlan(ctx, tx, id, plan); err != nil {
			return api.Lease{}, late{err}
		}
		p, err := s.decodePlan(plan)
		if err != nil {
			return api.Lease{}, late{err}
		}
		l.Plan = p
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
		return nil, wrap("leases", err)
	}
	defer rows.Close()
	out := []api.Lease{}
	for rows.Next() {
		l, err := s.scanLease(rows)
		if err != nil {
			return nil, wrap("leases", err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("leases", err)
	}
	return out, nil
}
