package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

// Heartbeats records many heartbeats in one transaction: the usual case,
// ready nodes, in one statement for the whole batch, their links in
// another; a node that was not ready (or is unknown) is read and moved to
// ready on its own, unless it was removed: a removed node's heartbeat is
// refused (store.ErrNotFound) and writes nothing, its links neither. Several beats of one node in a batch: the last one's
// health and time are kept, and the answers are those of beats written one
// by one (the first gets the state before, the others ready).
func (s *Store) Heartbeats(ctx context.Context, beats []store.Beat) ([]api.NodeState, []error, error) {
	prev := make([]api.NodeState, len(beats))
	errs := make([]error, len(beats))
	last := map[string]int{} // node → its last beat in the batch
	for i, b := range beats {
		last[b.NodeID] = i
	}
	ids := make([]string, 0, len(last))
	for id := range last {
		ids = append(ids, id)
	}
	sort.Strings(ids) // rows are locked in node ID order (doc.go)
	health, at, wiping := make([]string, len(ids)), make([]int64, len(ids)), make([]string, len(ids))
	for k, id := range ids {
		b := beats[last[id]]
		health[k], at[k], wiping[k] = b.Health, ns(b.At), sqlstore.WipingText(b.Wiping)
	}
	err := s.tx(ctx, func(tx sqlstore.Execer) error {
		before := map[string]api.NodeState{}
		removed := map[string]bool{}
		rows, err := tx.QueryContext(ctx, `UPDATE nodes n SET health = v.h, last_heartbeat = v.at, wiping = v.w,
				prev_credential_hash = CASE WHEN v.at > n.last_heartbeat THEN '' ELSE n.prev_credential_hash END
			FROM (SELECT * FROM unnest(?::text[], ?::text[], ?::bigint[], ?::text[]) AS t(id, h, at, w) ORDER BY id) v
			WHERE n.id = v.id AND n.state = 'ready' RETURNING n.id`, ids, health, at, wiping)
		if err != nil {
			return wrap("heartbeat", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return wrap("heartbeat", err)
			}
			before[id] = api.NodeReady
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return wrap("heartbeat", err)
		}
		var evs []api.Event
		for k, id := range ids {
			if _, ok := before[id]; ok {
				continue
			}
			var st api.NodeState
			if err := tx.QueryRowContext(ctx, `SELECT state FROM nodes WHERE id = ? FOR UPDATE`, id).Scan(&st); err != nil {
				if errors.Is(err, sql.ErrNoRows) {
					continue // unknown: not in before
				}
				return wrap("heartbeat", err)
			}
			if st == api.NodeRemoved {
				// Removal is final (the row is locked: a removal
				// committed before this read is seen, one after waits).
				removed[id] = true
				continue
			}
			if _, err := tx.ExecContext(ctx, `UPDATE nodes SET prev_credential_hash = CASE WHEN ? > last_heartbeat THEN '' ELSE prev_credential_hash END, state = 'ready', health = ?, last_heartbeat = ?, wiping = ? WHERE id = ?`, at[k], health[k], at[k], wiping[k], id); err != nil {
				return wrap("heartbeat", err)
			}
			before[id] = st
			if st != api.NodeReady {
				b := beats[last[id]]
				evs = append(evs, api.Event{At: b.At, Type: "node.ready", Subject: id, Message: "heartbeat after " + string(st), State: string(api.NodeReady)})
			}
		}
		// Links of the known nodes, the last report of each pair.
		linkAt := map[[2]string]api.Link{}
		var pairs [][2]string
		for _, b := range beats {
			if _, ok := before[b.NodeID]; !ok {
				continue
			}
			for _, l := range b.Links {
				k := [2]string{l.From, l.To}
				if _, ok := linkAt[k]; !ok {
					pairs = append(pairs, k)
				}
				linkAt[k] = l
			}
		}
		if len(pairs) > 0 {
			sort.Slice(pairs, func(i, j int) bool {
				return pairs[i][0] < pairs[j][0] || pairs[i][0] == pairs[j][0] && pairs[i][1] < pairs[j][1]
			})
			var lid, from, to, kind, status []string
			var bw, load, measured []int64
			var rtt []float64
			for _, k := range pairs {
				l := linkAt[k]
				if l.ID == "" {
					l.ID = l.From + ">" + l.To
				}
				lid, from, to, kind, status = append(lid, l.ID), append(from, l.From), append(to, l.To), append(kind, l.Kind), append(status, l.Status)
				bw, load, measured, rtt = append(bw, l.BandwidthBps), append(load, l.LoadBps), append(measured, ns(l.MeasuredAt)), append(rtt, l.RTTMicros)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO links (id, from_node, to_node, kind, bandwidth_bps, rtt_us, status, load_bps, measured_at)
				SELECT * FROM unnest(?::text[], ?::text[], ?::text[], ?::text[], ?::bigint[], ?::float8[], ?::text[], ?::bigint[], ?::bigint[])
				ON CONFLICT (from_node, to_node) DO UPDATE SET kind = excluded.kind, bandwidth_bps = excluded.bandwidth_bps,
				rtt_us = excluded.rtt_us, status = excluded.status, load_bps = excluded.load_bps, measured_at = excluded.measured_at`,
				lid, from, to, kind, bw, rtt, status, load, measured); err != nil {
				return wrap("links", err)
			}
		}
		seen := map[string]bool{}
		for i, b := range beats {
			st, ok := before[b.NodeID]
			switch {
			case removed[b.NodeID]:
				errs[i] = fmt.Errorf("node %s was removed: %w", b.NodeID, store.ErrNotFound)
				continue
			case !ok:
				errs[i] = fmt.Errorf("node %s: %w", b.NodeID, store.ErrNotFound)
				continue
			}
			if seen[b.NodeID] {
				st = api.NodeReady // as if written one by one: the first made it ready
			}
			seen[b.NodeID] = true
			prev[i], errs[i] = st, nil
		}
		return dialect{s}.AppendEvents(ctx, tx, evs)
	})
	return prev, errs, err
}
