package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

const leaseCols = `id, state, kind, mode, tenant, borrower, size, count, stripe_unit, uri, credential, ttl_seconds, expires_at, created_at, updated_at, reason, idempotency_key, plan`

func scanLease(sc interface{ Scan(...any) error }) (api.Lease, error) {
	var l api.Lease
	var exp, created, updated int64
	var plan string
	if err := sc.Scan(&l.ID, &l.State, &l.Kind, &l.Mode, &l.Tenant, &l.Borrower, &l.Size, &l.Count, &l.StripeUnit, &l.URI,
		&l.Credential, &l.TTLSeconds, &exp, &created, &updated, &l.Reason, &l.IdempotencyKey, &plan); err != nil {
		return l, err
	}
	l.ExpiresAt, l.CreatedAt, l.UpdatedAt = tm(exp), tm(created), tm(updated)
	if plan != "" {
		p, err := decodePlan(plan)
		if err != nil {
			return l, err
		}
		l.Plan = p
	}
	l.Parts = []api.Part{}
	return l, nil
}

// A lease's plan is read back many times over its life (after every
// transition, on every get), and decoding its JSON was the largest single
// cost of a read. Decoded plans are kept by their JSON text (so the cache
// cannot go stale), bounded, and every read gets its own copy.
const maxCachedPlans = 4096

var plans struct {
	sync.Mutex
	m map[string]*api.Plan
}

func decodePlan(text string) (*api.Plan, error) {
	plans.Lock()
	p, ok := plans.m[text]
	plans.Unlock()
	if !ok {
		p = new(api.Plan)
		if err := unjs(text, p); err != nil {
			return nil, err
		}
		rememberPlan(text, p)
	}
	return clonePlan(p), nil
}

func rememberPlan(text string, p *api.Plan) {
	plans.Lock()
	if plans.m == nil || len(plans.m) >= maxCachedPlans {
		plans.m = make(map[string]*api.Plan, 256)
	}
	plans.m[text] = p
	plans.Unlock()
}

func clonePlan(p *api.Plan) *api.Plan {
	c := *p
	c.Parts = slices.Clone(p.Parts)
	c.Impacts = slices.Clone(p.Impacts)
	c.Explanation = slices.Clone(p.Explanation)
	return &c
}

// planJSON encodes a plan to store; the text is remembered so that reading
// the lease back does not decode it.
func planJSON(p *api.Plan) string {
	if p == nil {
		return ""
	}
	text := js(p)
	rememberPlan(text, clonePlan(p))
	return text
}

// reserve checks and inserts the parts of a lease inside tx.
func reserve(ctx context.Context, tx execer, leaseID string, kind api.Kind, parts []api.Part) error {
	for i, p := range parts {
		var dstate, nstate, dkind, nodeID string
		var capacity int64
		err := tx.QueryRowContext(ctx, `SELECT d.state, d.kind, d.capacity, d.node_id, n.state FROM devices d JOIN nodes n ON n.id = d.node_id WHERE d.id = ?`, p.DeviceID).
			Scan(&dstate, &dkind, &capacity, &nodeID, &nstate)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("device %s: %w", p.DeviceID, store.ErrCapacity)
		}
		if err != nil {
			return fmt.Errorf("sqlite: reserve: %w", err)
		}
		switch {
		case nodeID != p.NodeID:
			return fmt.Errorf("device %s is not on node %s: %w", p.DeviceID, p.NodeID, store.ErrCapacity)
		case dstate != "available" || nstate != string(api.NodeReady):
			return fmt.Errorf("device %s is %s on a %s node: %w", p.DeviceID, dstate, nstate, store.ErrCapacity)
		case api.Kind(dkind) != kind:
			return fmt.Errorf("device %s is %s, not %s: %w", p.DeviceID, dkind, kind, store.ErrCapacity)
		case p.Offset < 0 || p.Length <= 0 || p.Offset > capacity-p.Length:
			return fmt.Errorf("device %s: range %d+%d outside capacity %d: %w", p.DeviceID, p.Offset, p.Length, capacity, store.ErrCapacity)
		}
		var overlap int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM lease_parts WHERE device_id = ? AND live = 1 AND off < ? AND off + length > ?`,
			p.DeviceID, p.Offset+p.Length, p.Offset).Scan(&overlap); err != nil {
			return fmt.Errorf("sqlite: reserve: %w", err)
		}
		if overlap > 0 {
			return fmt.Errorf("device %s: range %d+%d is taken: %w", p.DeviceID, p.Offset, p.Length, store.ErrCapacity)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO lease_parts (lease_id, idx, node_id, device_id, off, length, uri, live) VALUES (?, ?, ?, ?, ?, ?, ?, 1)`,
			leaseID, i, p.NodeID, p.DeviceID, p.Offset, p.Length, p.URI); err != nil {
			return fmt.Errorf("sqlite: reserve: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE devices SET allocated = allocated + ? WHERE id = ?`, p.Length, p.DeviceID); err != nil {
			return fmt.Errorf("sqlite: reserve: %w", err)
		}
	}
	return nil
}

// free releases the live parts of a lease; del also deletes their rows.
func free(ctx context.Context, tx execer, leaseID string, del bool) error {
	if _, err := tx.ExecContext(ctx, `UPDATE devices SET allocated = allocated - (SELECT COALESCE(SUM(length), 0) FROM lease_parts p
		WHERE p.lease_id = ? AND p.live = 1 AND p.device_id = devices.id)
		WHERE id IN (SELECT device_id FROM lease_parts WHERE lease_id = ? AND live = 1)`, leaseID, leaseID); err != nil {
		return fmt.Errorf("sqlite: free parts: %w", err)
	}
	q := `UPDATE lease_parts SET live = 0 WHERE lease_id = ?`
	if del {
		q = `DELETE FROM lease_parts WHERE lease_id = ?`
	}
	if _, err := tx.ExecContext(ctx, q, leaseID); err != nil {
		return fmt.Errorf("sqlite: free parts: %w", err)
	}
	return nil
}

func getLease(ctx context.Context, q execer, id string) (api.Lease, error) {
	l, err := scanLease(q.QueryRowContext(ctx, `SELECT `+leaseCols+` FROM leases WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return l, fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return l, fmt.Errorf("sqlite: lease: %w", err)
	}
	return l, readParts(ctx, q, &l)
}

// readParts reads a lease's parts into l.
func readParts(ctx context.Context, q execer, l *api.Lease) error {
	rows, err := q.QueryContext(ctx, `SELECT node_id, device_id, off, length, uri FROM lease_parts WHERE lease_id = ? ORDER BY idx`, l.ID)
	if err != nil {
		return fmt.Errorf("sqlite: lease parts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var p api.Part
		if err := rows.Scan(&p.NodeID, &p.DeviceID, &p.Offset, &p.Length, &p.URI); err != nil {
			return fmt.Errorf("sqlite: lease parts: %w", err)
		}
		l.Parts = append(l.Parts, p)
	}
	fillFirst(l)
	return rows.Err()
}

func fillFirst(l *api.Lease) {
	l.NodeID, l.DeviceID = "", ""
	if len(l.Parts) > 0 {
		l.NodeID, l.DeviceID = l.Parts[0].NodeID, l.Parts[0].DeviceID
	}
}

// CreateLease inserts a lease and reserves its parts atomically.
func (s *Store) CreateLease(ctx context.Context, l api.Lease, d store.Demand, idem *store.Idempotency, ev api.Event) (api.Lease, error) {
	var out api.Lease
	plan := planJSON(l.Plan) // outside the transaction: the writer is serial
	err := s.tx(ctx, func(tx execer) error {
		var err error
		out, err = createTx(ctx, tx, store.NewLease{Lease: l, Demand: d, Idem: idem, Event: ev}, plan)
		return err
	})
	return out, err
}

// createTx is CreateLease's work inside a transaction.
func createTx(ctx context.Context, tx execer, n store.NewLease, plan string) (api.Lease, error) {
	l, d, idem := n.Lease, n.Demand, n.Idem
	if idem != nil {
		var leaseID string
		err := tx.QueryRowContext(ctx, `SELECT lease_id FROM idempotency_keys WHERE tenant = ? AND key = ?`, idem.Tenant, idem.Key).Scan(&leaseID)
		if err == nil {
			return api.Lease{}, fmt.Errorf("key used by lease %s: %w", leaseID, store.ErrDuplicate)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return api.Lease{}, fmt.Errorf("sqlite: idempotency: %w", err)
		}
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO leases (`+leaseCols+`, demand_bps, work_bytes, deadline_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		l.ID, l.State, l.Kind, l.Mode, l.Tenant, l.Borrower, l.Size, l.Count, l.StripeUnit, l.URI, l.Credential, l.TTLSeconds,
		ns(l.ExpiresAt), ns(l.CreatedAt), ns(l.UpdatedAt), l.Reason, l.IdempotencyKey, plan, d.Bandwidth, d.Work, ns(d.Deadline))
	if err != nil {
		return api.Lease{}, fmt.Errorf("sqlite: create lease: %w", err)
	}
	if err := reserve(ctx, tx, l.ID, l.Kind, l.Parts); err != nil {
		return api.Lease{}, err
	}
	if idem != nil {
		if _, err := tx.ExecContext(ctx, `INSERT INTO idempotency_keys (tenant, key, request_hash, lease_id, created_at) VALUES (?, ?, ?, ?, ?)`,
			idem.Tenant, idem.Key, idem.RequestHash, l.ID, ns(l.CreatedAt)); err != nil {
			return api.Lease{}, fmt.Errorf("sqlite: idempotency: %w", err)
		}
	}
	if _, err := appendEvent(ctx, tx, n.Event); err != nil {
		return api.Lease{}, err
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
		q := `UPDATE leases SET state = 'reserved', updated_at = ?`
		args := []any{ns(at)}
		if plan != nil {
			q += `, plan = ?, mode = ?`
			args = append(args, planJSON(plan), plan.Mode)
		}
		if _, err := tx.ExecContext(ctx, q+` WHERE id = ?`, append(args, id)...); err != nil {
			return fmt.Errorf("sqlite: replace parts: %w", err)
		}
		if _, err := appendEvent(ctx, tx, ev); err != nil {
			return err
		}
		var err error
		out, err = getLease(ctx, tx, id)
		return err
	})
	return out, err
}

// TransitionLease moves a lease between states (compare-and-set).
func (s *Store) TransitionLease(ctx context.Context, id string, ch store.LeaseChange, ev api.Event) (api.Lease, error) {
	var out api.Lease
	var plan string
	if ch.Plan != nil {
		plan = planJSON(ch.Plan) // outside the transaction: the writer is serial
	}
	err := s.tx(ctx, func(tx execer) error {
		l, err := transitionTx(ctx, tx, id, ch, plan, ev)
		out = l
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

// LeaseOps applies lease creations and transitions in one write
// transaction (group commit), each as CreateLease or TransitionLease would
// and independently of the others: an op that fails is rolled back to its
// savepoint and reported in errs. err is set, and nothing committed, when
// the batch itself fails.
func (s *Store) LeaseOps(ctx context.Context, ops []store.LeaseOp) (out []api.Lease, errs []error, err error) {
	plans := make([]string, len(ops)) // outside the transaction: the writer is serial
	for i, op := range ops {
		switch {
		case op.Create != nil:
			plans[i] = planJSON(op.Create.Lease.Plan)
		case op.Transition.Change.Plan != nil:
			plans[i] = planJSON(op.Transition.Change.Plan)
		}
	}
	err = s.tx(ctx, func(tx execer) error {
		out, errs = make([]api.Lease, len(ops)), make([]error, len(ops))
		single := len(ops) == 1 // the transaction itself is the savepoint
		for i, op := range ops {
			if !single {
				if _, err := tx.ExecContext(ctx, `SAVEPOINT tl`); err != nil {
					return fmt.Errorf("sqlite: savepoint: %w", err)
				}
			}
			if op.Create != nil {
				out[i], errs[i] = createTx(ctx, tx, *op.Create, plans[i])
			} else {
				t := op.Transition
				out[i], errs[i] = transitionTx(ctx, tx, t.ID, t.Change, plans[i], t.Event)
			}
			if single {
				if errs[i] != nil {
					return errs[i]
				}
				continue
			}
			if errs[i] != nil {
				if _, err := tx.ExecContext(ctx, `ROLLBACK TO tl`); err != nil {
					return fmt.Errorf("sqlite: rollback to savepoint: %w", err)
				}
			}
			if _, err := tx.ExecContext(ctx, `RELEASE tl`); err != nil {
				return fmt.Errorf("sqlite: release savepoint: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		if len(ops) == 1 && errs != nil && errs[0] != nil {
			return out, errs, nil // the op's own refusal, rolled back
		}
		return nil, nil, err
	}
	return out, errs, nil
}

// transitionTx is TransitionLease's work inside a transaction.
func transitionTx(ctx context.Context, tx execer, id string, ch store.LeaseChange, plan string, ev api.Event) (api.Lease, error) {
	var out api.Lease
	err := func() error {
		if len(ch.From) == 0 {
			return fmt.Errorf("lease %s: no source state: %w", id, store.ErrConflict)
		}
		// One statement does the compare-and-set and reads the row back.
		q := `UPDATE leases SET state = ?, updated_at = ?`
		args := make([]any, 0, 8+len(ch.From))
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
		if ch.Plan != nil {
			q += `, plan = ?`
			args = append(args, plan)
		}
		args = append(args, id)
		for _, f := range ch.From {
			args = append(args, f)
		}
		q += ` WHERE id = ? AND state IN (` + placeholders(len(ch.From)) + `)`
		if ch.Tenant != "" {
			q += ` AND tenant = ?`
			args = append(args, ch.Tenant)
		}
		l, err := scanLease(tx.QueryRowContext(ctx, q+` RETURNING `+leaseCols, args...))
		if errors.Is(err, sql.ErrNoRows) {
			var state api.LeaseState
			var tenant string
			if err := tx.QueryRowContext(ctx, `SELECT state, tenant FROM leases WHERE id = ?`, id).Scan(&state, &tenant); err != nil {
				if errors.Is(err, sql.ErrNoRows) {
					return fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
				}
				return fmt.Errorf("sqlite: transition: %w", err)
			}
			if ch.Tenant != "" && tenant != ch.Tenant {
				return fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
			}
			return fmt.Errorf("lease %s is %s, not %v: %w", id, state, ch.From, store.ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("sqlite: transition: %w", err)
		}
		for i, u := range ch.URIs {
			if _, err := tx.ExecContext(ctx, `UPDATE lease_parts SET uri = ? WHERE lease_id = ? AND idx = ?`, u, id, i); err != nil {
				return fmt.Errorf("sqlite: transition: %w", err)
			}
		}
		if ch.To.Terminal() {
			// free only touches live parts: a no-op if the lease had
			// already ended.
			if err := free(ctx, tx, id, false); err != nil {
				return err
			}
		}
		if _, err := appendEvent(ctx, tx, ev); err != nil {
			return err
		}
		if err := readParts(ctx, tx, &l); err != nil {
			return err
		}
		out = l
		return nil
	}()
	return out, err
}

// Lease returns one lease.
func (s *Store) Lease(ctx context.Context, id string) (api.Lease, error) {
	return getLease(ctx, s.rd(), id)
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
	rtx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: s.r != s.w})
	if err != nil {
		return nil, fmt.Errorf("sqlite: leases: %w", err)
	}
	defer s.rs.flush(ctx) // runs after the rollback below
	defer rtx.Rollback()
	tx := cachedTx{rtx, s.rs}
	rows, err := tx.QueryContext(ctx, `SELECT `+leaseCols+` FROM leases`+cond+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: leases: %w", err)
	}
	out := []api.Lease{}
	idx := map[string]int{}
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("sqlite: leases: %w", err)
		}
		idx[l.ID] = len(out)
		out = append(out, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: leases: %w", err)
	}
	if len(out) == 0 {
		return out, nil
	}
	prows, err := tx.QueryContext(ctx, `SELECT lease_id, node_id, device_id, off, length, uri FROM lease_parts
		WHERE lease_id IN (SELECT id FROM leases`+cond+`) ORDER BY lease_id, idx`, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: lease parts: %w", err)
	}
	defer prows.Close()
	for prows.Next() {
		var lid string
		var p api.Part
		if err := prows.Scan(&lid, &p.NodeID, &p.DeviceID, &p.Offset, &p.Length, &p.URI); err != nil {
			return nil, fmt.Errorf("sqlite: lease parts: %w", err)
		}
		if i, ok := idx[lid]; ok {
			out[i].Parts = append(out[i].Parts, p)
		}
	}
	for i := range out {
		fillFirst(&out[i])
	}
	return out, prows.Err()
}

// LeaseByIdempotencyKey returns the lease recorded for (tenant, key).
func (s *Store) LeaseByIdempotencyKey(ctx context.Context, tenant, key string) (api.Lease, string, error) {
	var leaseID, hash string
	err := s.rd().QueryRowContext(ctx, `SELECT lease_id, request_hash FROM idempotency_keys WHERE tenant = ? AND key = ?`, tenant, key).Scan(&leaseID, &hash)
	if errors.Is(err, sql.ErrNoRows) {
		return api.Lease{}, "", fmt.Errorf("idempotency key: %w", store.ErrNotFound)
	}
	if err != nil {
		return api.Lease{}, "", fmt.Errorf("sqlite: idempotency: %w", err)
	}
	l, err := getLease(ctx, s.rd(), leaseID)
	return l, hash, err
}
