package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

const nodeCols = `id, machine_id, name, state, address, agent_url, endpoints, labels, fingerprint, health, last_heartbeat, joined_at, agent_key`

// nodeReadCols are nodeCols and what only reads have (cordoned, migration
// 8: a join keeps it).
const nodeReadCols = nodeCols + `, cordoned`

func scanNode(sc interface{ Scan(...any) error }) (store.NodeRecord, error) {
	var n store.NodeRecord
	var machine, endpoints, labels, fp string
	var hb, joined int64
	var cordoned int
	if err := sc.Scan(&n.ID, &machine, &n.Name, &n.State, &n.Address, &n.AgentURL, &endpoints, &labels, &fp, &n.Health, &hb, &joined, &n.AgentKey, &cordoned); err != nil {
		return n, err
	}
	n.Cordoned = cordoned != 0
	n.LastHeartbeat, n.JoinedAt = tm(hb), tm(joined)
	if err := errors.Join(unjs(endpoints, &n.Endpoints), unjs(labels, &n.Labels), unjs(fp, &n.Fingerprint)); err != nil {
		return n, err
	}
	return n, nil
}

// JoinNode registers or re-registers a node by machine ID.
func (s *Store) JoinNode(ctx context.Context, j store.JoinNode, ev api.Event) (api.Node, bool, error) {
	var out api.Node
	var rejoined bool
	err := s.tx(ctx, func(tx execer) error {
		n := j.Node
		var id string
		var joined int64
		err := tx.QueryRowContext(ctx, `SELECT id, joined_at FROM nodes WHERE machine_id = ?`, n.Fingerprint.MachineID).Scan(&id, &joined)
		switch {
		case err == nil:
			rejoined = true
			n.ID = id
			n.JoinedAt = tm(joined)
			_, err = tx.ExecContext(ctx, `UPDATE nodes SET name = ?, state = ?, address = ?, agent_url = ?, endpoints = ?, labels = ?,
				fingerprint = ?, health = ?, credential_hash = ?, agent_key = ?, last_heartbeat = ? WHERE id = ?`,
				n.Name, n.State, n.Address, n.AgentURL, js(n.Endpoints), js(n.Labels), js(n.Fingerprint), n.Health,
				j.CredentialHash, j.AgentKey, ns(n.LastHeartbeat), id)
		case errors.Is(err, sql.ErrNoRows):
			_, err = tx.ExecContext(ctx, `INSERT INTO nodes (`+nodeCols+`, credential_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				n.ID, n.Fingerprint.MachineID, n.Name, n.State, n.Address, n.AgentURL, js(n.Endpoints), js(n.Labels), js(n.Fingerprint),
				n.Health, ns(n.LastHeartbeat), ns(n.JoinedAt), j.AgentKey, j.CredentialHash)
		}
		if err != nil {
			return wrap("join node", err)
		}
		if err := registerDevices(ctx, tx, n.ID, j.Devices); err != nil {
			return err
		}
		ev.Subject = n.ID
		if _, err := appendEvent(ctx, tx, ev); err != nil {
			return err
		}
		out = n
		return nil
	})
	return out, rejoined, err
}

// NodeByCredential finds a node by its credential hash.
func (s *Store) NodeByCredential(ctx context.Context, credHash string) (api.Node, error) {
	n, err := scanNode(s.rd().QueryRowContext(ctx, `SELECT `+nodeReadCols+` FROM nodes WHERE credential_hash = ?`, credHash))
	if errors.Is(err, sql.ErrNoRows) {
		return api.Node{}, fmt.Errorf("node credential: %w", store.ErrNotFound)
	}
	if err != nil {
		return api.Node{}, wrap("node by credential", err)
	}
	return n.Node, nil
}

// Heartbeat records a heartbeat.
func (s *Store) Heartbeat(ctx context.Context, nodeID string, at time.Time, health string, links []api.Link) (api.NodeState, error) {
	prev, errs, err := s.Heartbeats(ctx, []store.Beat{{NodeID: nodeID, At: at, Health: health, Links: links}})
	if err != nil {
		return "", err
	}
	return prev[0], errs[0]
}

// Heartbeats records many heartbeats in one transaction: the usual case,
// ready nodes, in one statement for the whole batch, their links in
// another; a node that was not ready (or is unknown) is read and moved to
// ready on its own. Several beats of one node in a batch: the last one's
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
	health, at := make([]string, len(ids)), make([]int64, len(ids))
	for k, id := range ids {
		b := beats[last[id]]
		health[k], at[k] = b.Health, ns(b.At)
	}
	err := s.tx(ctx, func(tx execer) error {
		before := map[string]api.NodeState{}
		rows, err := tx.QueryContext(ctx, `UPDATE nodes n SET health = v.h, last_heartbeat = v.at
			FROM (SELECT * FROM unnest(?::text[], ?::text[], ?::bigint[]) AS t(id, h, at) ORDER BY id) v
			WHERE n.id = v.id AND n.state = 'ready' RETURNING n.id`, ids, health, at)
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
			if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state = 'ready', health = ?, last_heartbeat = ? WHERE id = ?`, health[k], at[k], id); err != nil {
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
			if !ok {
				errs[i] = fmt.Errorf("node %s: %w", b.NodeID, store.ErrNotFound)
				continue
			}
			if seen[b.NodeID] {
				st = api.NodeReady // as if written one by one: the first made it ready
			}
			seen[b.NodeID] = true
			prev[i], errs[i] = st, nil
		}
		return s.appendEvents(ctx, tx, evs)
	})
	return prev, errs, err
}

// SetNodeState moves a node between states.
func (s *Store) SetNodeState(ctx context.Context, id string, from, to api.NodeState, ev api.Event) error {
	return s.tx(ctx, func(tx execer) error {
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET state = ? WHERE id = ? AND state = ?`, to, id, from)
		if err != nil {
			return wrap("set node state", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("node %s not %s: %w", id, from, store.ErrConflict)
		}
		_, err = appendEvent(ctx, tx, ev)
		return err
	})
}

// Node returns one node with its agent key.
func (s *Store) Node(ctx context.Context, id string) (store.NodeRecord, error) {
	n, err := scanNode(s.rd().QueryRowContext(ctx, `SELECT `+nodeReadCols+` FROM nodes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return n, fmt.Errorf("node %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return n, wrap("node", err)
	}
	return n, nil
}

func nodes(ctx context.Context, q execer) ([]api.Node, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+nodeReadCols+` FROM nodes ORDER BY name, id`)
	if err != nil {
		return nil, wrap("nodes", err)
	}
	defer rows.Close()
	out := []api.Node{}
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, wrap("nodes", err)
		}
		out = append(out, n.Node)
	}
	return out, rows.Err()
}

// Nodes lists nodes.
func (s *Store) Nodes(ctx context.Context) ([]api.Node, error) { return nodes(ctx, s.rd()) }

var _ store.NodeRemover = (*Store)(nil)

// RemoveNode retires a node (store.NodeRemover): state removed, a
// credential hash no token hashes to (hashes are hex; this one is not),
// devices unavailable, links gone.
func (s *Store) RemoveNode(ctx context.Context, id string, ev api.Event) (api.Node, error) {
	var out api.Node
	err := s.tx(ctx, func(tx execer) error {
		n, err := scanNode(tx.QueryRowContext(ctx, `UPDATE nodes SET state = ?, credential_hash = ? WHERE id = ? RETURNING `+nodeReadCols,
			api.NodeRemoved, "removed:"+id, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("node %s: %w", id, store.ErrNotFound)
		}
		if err != nil {
			return wrap("remove node", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE devices SET state = 'unavailable' WHERE node_id = ?`, id); err != nil {
			return wrap("remove node", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM links WHERE from_node = ? OR to_node = ?`, id, id); err != nil {
			return wrap("remove node", err)
		}
		if _, err := appendEvent(ctx, tx, ev); err != nil {
			return err
		}
		out = n.Node
		return nil
	})
	return out, err
}
