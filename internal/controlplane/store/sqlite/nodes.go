package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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
	if err := sc.Scan(&n.ID, &machine, &n.Name, &n.State, &n.Address, &n.AgentURL, &endpoints, &labels, &fp, &n.Health, &hb, &joined, &n.AgentKey, &n.Cordoned); err != nil {
		return n, err
	}
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
			return fmt.Errorf("sqlite: join node: %w", err)
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
		return api.Node{}, fmt.Errorf("sqlite: node by credential: %w", err)
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

// Heartbeats records many heartbeats in one transaction.
func (s *Store) Heartbeats(ctx context.Context, beats []store.Beat) ([]api.NodeState, []error, error) {
	prev := make([]api.NodeState, len(beats))
	errs := make([]error, len(beats))
	err := s.tx(ctx, func(tx execer) error {
		for i, b := range beats {
			// The usual case, a ready node, is one statement; a node that
			// was not ready (or is unknown) is read first.
			res, err := tx.ExecContext(ctx, `UPDATE nodes SET health = ?, last_heartbeat = ? WHERE id = ? AND state = 'ready'`, b.Health, ns(b.At), b.NodeID)
			var n int64
			if err == nil {
				n, err = res.RowsAffected()
			}
			if err != nil {
				return fmt.Errorf("sqlite: heartbeat: %w", err)
			}
			prev[i] = api.NodeReady
			if n == 0 {
				if err := tx.QueryRowContext(ctx, `SELECT state FROM nodes WHERE id = ?`, b.NodeID).Scan(&prev[i]); err != nil {
					if errors.Is(err, sql.ErrNoRows) {
						errs[i] = fmt.Errorf("node %s: %w", b.NodeID, store.ErrNotFound)
						continue
					}
					return fmt.Errorf("sqlite: heartbeat: %w", err)
				}
				if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state = 'ready', health = ?, last_heartbeat = ? WHERE id = ?`, b.Health, ns(b.At), b.NodeID); err != nil {
					return fmt.Errorf("sqlite: heartbeat: %w", err)
				}
			}
			for _, l := range b.Links {
				if err := putLink(ctx, tx, l); err != nil {
					return err
				}
			}
			if prev[i] != api.NodeReady {
				if _, err := appendEvent(ctx, tx, api.Event{At: b.At, Type: "node.ready", Subject: b.NodeID, Message: "heartbeat after " + string(prev[i]), State: string(api.NodeReady)}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return prev, errs, err
}

// SetNodeState moves a node between states.
func (s *Store) SetNodeState(ctx context.Context, id string, from, to api.NodeState, ev api.Event) error {
	return s.tx(ctx, func(tx execer) error {
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET state = ? WHERE id = ? AND state = ?`, to, id, from)
		if err != nil {
			return fmt.Errorf("sqlite: set node state: %w", err)
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
		return n, fmt.Errorf("sqlite: node: %w", err)
	}
	return n, nil
}

func nodes(ctx context.Context, q execer) ([]api.Node, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+nodeReadCols+` FROM nodes ORDER BY name, id`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: nodes: %w", err)
	}
	defer rows.Close()
	out := []api.Node{}
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, fmt.Errorf("sqlite: nodes: %w", err)
		}
		out = append(out, n.Node)
	}
	return out, rows.Err()
}

// Nodes lists nodes.
func (s *Store) Nodes(ctx context.Context) ([]api.Node, error) { return nodes(ctx, s.rd()) }

// RemoveNode retires a node (store.NodeRemover): state removed, a
// credential hash no token hashes to (hashes are hex; this one is not),
// devices unavailable, links gone.
func (s *Store) RemoveNode(ctx context.Context, id string, ev api.Event) (api.Node, error) {
	var out api.Node
	err := s.tx(ctx, func(tx execer) error {
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET state = ?, credential_hash = ? WHERE id = ?`, api.NodeRemoved, "removed:"+id, id)
		if err != nil {
			return fmt.Errorf("sqlite: remove node: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("node %s: %w", id, store.ErrNotFound)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE devices SET state = 'unavailable' WHERE node_id = ?`, id); err != nil {
			return fmt.Errorf("sqlite: remove node: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM links WHERE from_node = ? OR to_node = ?`, id, id); err != nil {
			return fmt.Errorf("sqlite: remove node: %w", err)
		}
		n, err := scanNode(tx.QueryRowContext(ctx, `SELECT `+nodeReadCols+` FROM nodes WHERE id = ?`, id))
		if err != nil {
			return fmt.Errorf("sqlite: remove node: %w", err)
		}
		if _, err := appendEvent(ctx, tx, ev); err != nil {
			return err
		}
		out = n.Node
		return nil
	})
	return out, err
}
