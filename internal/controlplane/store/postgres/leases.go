package postgres

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strconv"

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
// A batch is written in two round trips (pipeline.go); one that needs
// more (an op failed after writing) is written again statement by
// statement (sqlstore.Core.WriteOps), which first locks what its
// creations re-check (their tenants and devices, each in ID order: see
// doc.go).
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
	for attempt := 0; attempt < maxTxAttempts; attempt++ {
		out, errs, err = s.pipelined(ctx, ops, texts, tenants, devs)
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
// (a round trip each would be most of a creation's cost).
func (d dialect) InsertLease(ctx context.Context, tx sqlstore.Execer, n store.NewLease, text sqlstore.OpText) error {
	l, dm := n.Lease, n.Demand
	nodes, devs := make([]string, len(l.Parts)), make([]string, len(l.Parts))
	offs, lens := make([]int64, len(l.Parts)), make([]int64, len(l.Parts))
	for i, p := range l.Parts {
		nodes[i], devs[i], offs[i], lens[i] = p.NodeID, p.DeviceID, p.Offset, p.Length
	}
	_, err := tx.ExecContext(ctx, `WITH l AS (INSERT INTO leases (`+sqlstore.LeaseInsertCols+`, demand_bps, work_bytes, deadline_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)),
		p AS (INSERT INTO lease_plans (created_at, lease_id, plan) SELECT ?, ?, ? WHERE ? <> ''),
		x AS (INSERT INTO lease_parts (lease_id, idx, node_id, device_id, off, length, uri, live)
			SELECT ?, t.i - 1, t.node, t.dev, t.off, t.len, '', 1
			FROM unnest(?::text[], ?::text[], ?::bigint[], ?::bigint[]) WITH ORDINALITY AS t(node, dev, off, len, i))
		SELECT 1`,
		l.ID, l.State, l.Kind, l.Mode, l.Tenant, l.Borrower, l.Size, l.Count, l.StripeUnit, l.BandwidthCap, l.IOPSCap, l.URI, l.Credential, l.TTLSeconds,
		ns(l.ExpiresAt), ns(l.CreatedAt), ns(l.UpdatedAt), l.Reason, l.IdempotencyKey, text.Parts, dm.Bandwidth, dm.Work, ns(dm.Deadline),
		ns(l.CreatedAt), l.ID, text.Plan, text.Plan,
		l.ID, nodes, devs, offs, lens)
	if err != nil {
		return wrap("create lease", err)
	}
	return nil
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

// TransitionTx is TransitionLease's work inside a transaction, but for
// the event: one statement does the compare-and-set, records the parts'
// URIs, frees the parts of a lease that ends, and reads the row back. A
// refusal (ErrConflict, ErrNotFound) comes before anything is written.
func (d dialect) TransitionTx(ctx context.Context, tx sqlstore.Execer, id string, ch store.LeaseChange, plan string, _ []api.Lease) (api.Lease, error) {
	s := d.s
	set, args := sqlstore.ChangeSet(ch, make([]any, 0, 12+len(ch.From)+2*len(ch.URIs)))
	set += partsSet(ch, &args)
	where, args := sqlstore.ChangeWhere(id, ch, args)
	q := `WITH u AS (UPDATE leases SET ` + set + where + ` RETURNING ` + sqlstore.LeaseCols + `)`
	if ch.To.Terminal() {
		// Free only touches live parts: a no-op if the lease had ended.
		q += `, f AS (UPDATE lease_parts SET live = 0 WHERE lease_id = ? AND live = 1 AND EXISTS (SELECT 1 FROM u))`
		args = append(args, id)
	} else if len(ch.LostParts) > 0 {
		q += `, fl AS (UPDATE lease_parts SET live = 0 WHERE lease_id = ? AND live = 1 AND idx = ANY(?::bigint[]) AND EXISTS (SELECT 1 FROM u))`
		args = append(args, id, lostIdx(ch.LostParts))
	}
	l, err := s.ScanLease(tx.QueryRowContext(ctx, q+` SELECT * FROM u`, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return api.Lease{}, s.TransitionRefusal(ctx, tx, id, ch)
	}
	if err != nil {
		// A NOT NULL violation: more URIs than parts.
		return api.Lease{}, sqlstore.Late{Err: wrap("transition", err)}
	}
	if ch.Plan != nil {
		if err := s.ReplacePlan(ctx, tx, id, plan); err != nil {
			return api.Lease{}, sqlstore.Late{Err: err}
		}
		p, err := s.DecodePlan(plan)
		if err != nil {
			return api.Lease{}, sqlstore.Late{Err: err}
		}
		l.Plan = p
	}
	return l, nil
}
