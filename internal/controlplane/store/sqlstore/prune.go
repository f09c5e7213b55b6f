package sqlstore

import (
	"context"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// pruneChunk bounds the rows one statement of Prune names.
const pruneChunk = 200

// terminalStates are the lease states no transition leaves.
func terminalStates() []any {
	var out []any
	for _, st := range []api.LeaseState{api.LeaseRequested, api.LeaseReserved, api.LeaseActive, api.LeaseReleasing,
		api.LeaseReleased, api.LeaseFailed, api.LeaseLost, api.LeaseExpired} {
		if st.Terminal() {
			out = append(out, string(st))
		}
	}
	return out
}

// Prune is store.Pruner's: history (ended leases, old events) before
// before, at most limit of each, in one write transaction.
func (s *Core) Prune(ctx context.Context, before time.Time, limit int) (store.Pruned, error) {
	if limit <= 0 {
		limit = 1000
	}
	var out store.Pruned
	err := s.tx(ctx, func(tx Execer) error {
		out = store.Pruned{}
		n, err := s.pruneLeases(ctx, tx, before, limit)
		if err != nil {
			return err
		}
		out.Leases = n
		out.Events, out.EventsThrough, err = s.pruneEvents(ctx, tx, before, limit)
		return err
	})
	return out, err
}

type prunedLease struct {
	id        string
	createdAt int64
}

// pruneLeases deletes the ended leases of Prune with what refers to them.
func (s *Core) pruneLeases(ctx context.Context, tx Execer, before time.Time, limit int) (int, error) {
	states := terminalStates()
	args := append(append([]any{}, states...), ns(before), limit)
	// Only a lease that no longer holds anything: no live range (its own
	// or a move's destination) and no open move.
	rows, err := tx.QueryContext(ctx, `SELECT id, created_at FROM leases
		WHERE state IN (`+Placeholders(len(states))+`) AND updated_at < ?
		AND NOT EXISTS (SELECT 1 FROM lease_parts p WHERE p.lease_id = leases.id AND p.live = 1)
		AND NOT EXISTS (SELECT 1 FROM lease_moves m WHERE m.lease_id = leases.id AND m.state NOT IN ('done', 'failed'))
		ORDER BY updated_at LIMIT ?`+s.d.ForUpdate(), args...)
	if err != nil {
		return 0, s.wrap("prune: leases", err)
	}
	var ls []prunedLease
	for rows.Next() {
		var l prunedLease
		if err := rows.Scan(&l.id, &l.createdAt); err != nil {
			rows.Close()
			return 0, s.wrap("prune: leases", err)
		}
		ls = append(ls, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, s.wrap("prune: leases", err)
	}
	total := len(ls)
	for len(ls) > 0 {
		chunk := ls[:min(len(ls), pruneChunk)]
		ls = ls[len(chunk):]
		ids := make([]any, len(chunk))
		var plans []any
		for i, l := range chunk {
			ids[i] = l.id
			plans = append(plans, l.createdAt, l.id)
		}
		in := `(` + Placeholders(len(ids)) + `)`
		stmts := []struct {
			q    string
			args []any
		}{
			{`DELETE FROM lease_parts WHERE lease_id IN ` + in, ids},
			{`DELETE FROM lease_moves WHERE lease_id IN ` + in, ids},
			{`DELETE FROM idempotency_keys WHERE lease_id IN ` + in, ids}, // migration 12's index
			// lease_plans is keyed by (created_at, lease_id): name its keys,
			// so that the delete uses them.
			{`DELETE FROM lease_plans WHERE ` + strings.Repeat(`(created_at = ? AND lease_id = ?) OR `, len(chunk)-1) + `(created_at = ? AND lease_id = ?)`, plans},
			{`DELETE FROM leases WHERE id IN ` + in, ids},
		}
		for _, st := range stmts {
			if len(st.args) == 0 {
				continue
			}
			if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
				return 0, s.wrap("prune: leases", err)
			}
		}
	}
	return total, nil
}

// pruneEvents deletes the oldest events appended before before (at most
// limit, never the newest) and records the greatest ID pruned.
func (s *Core) pruneEvents(ctx context.Context, tx Execer, before time.Time, limit int) (n int, through int64, err error) {
	if err := tx.QueryRowContext(ctx, `SELECT events_through FROM history WHERE id = 1`).Scan(&through); err != nil {
		return 0, 0, s.wrap("prune: events", err)
	}
	var last int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(id), 0) FROM events`).Scan(&last); err != nil {
		return 0, 0, s.wrap("prune: events", err)
	}
	// The prefix of the log older than before: the first limit events at
	// most, up to the first one at or after before.
	rows, err := tx.QueryContext(ctx, `SELECT id, at FROM events WHERE id > ? ORDER BY id LIMIT ?`, through, limit)
	if err != nil {
		return 0, 0, s.wrap("prune: events", err)
	}
	var upTo int64
	cut := ns(before)
	for rows.Next() {
		var id, at int64
		if err := rows.Scan(&id, &at); err != nil {
			rows.Close()
			return 0, 0, s.wrap("prune: events", err)
		}
		if at >= cut || id >= last {
			break // the newest event stays: IDs are max(id) + 1 in SQLite
		}
		upTo = id
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, s.wrap("prune: events", err)
	}
	if n == 0 {
		return 0, through, nil
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM events WHERE id <= ?`, upTo); err != nil {
		return 0, 0, s.wrap("prune: events", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE history SET events_through = ? WHERE id = 1`, upTo); err != nil {
		return 0, 0, s.wrap("prune: events", err)
	}
	return n, upTo, nil
}

// PrunedEvents is store.Pruner's: the greatest event ID pruned.
func (s *Core) PrunedEvents(ctx context.Context) (int64, error) {
	var through int64
	if err := s.rd().QueryRowContext(ctx, `SELECT events_through FROM history WHERE id = 1`).Scan(&through); err != nil {
		return 0, s.wrap("pruned events", err)
	}
	return through, nil
}
