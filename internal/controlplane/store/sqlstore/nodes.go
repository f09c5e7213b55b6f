package sqlstore

import (
	"context"
	"crypto/subtle"
	"database/sql"
	"errors"
	"fmt"
	"slices"
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

// JoinNode registers or re-registers a node by machine ID: a known
// machine's node is taken over only by a join that proves it is the
// node's (store.JoinNode), or while the node is down or removed. The
// node's row is locked (PostgreSQL) while the rule is checked, so that a
// heartbeat or a sweep of it commits before or after, not in between.
func (s *Core) JoinNode(ctx context.Context, j store.JoinNode, ev api.Event) (api.Node, store.Joined, error) {
	var out api.Node
	var how store.Joined
	err := s.tx(ctx, func(tx Execer) error {
		how = store.JoinedNew
		n, ev := j.Node, ev // (a retried transaction starts again from the caller's)
		var id, name, credHash, prevHash string
		var state api.NodeState
		var joined int64
		err := tx.QueryRowContext(ctx, `SELECT id, name, state, credential_hash, prev_credential_hash, joined_at FROM nodes WHERE machine_id = ?`+s.d.ForUpdate(),
			n.Fingerprint.MachineID).Scan(&id, &name, &state, &credHash, &prevHash, &joined)
		switch {
		case err == nil:
			// The credential the node's agent holds: the current one, or
			// the one the last proven join presented while the agent has
			// not been heard with that join's answer (it may have lost
			// it: see store.JoinNode). The agent presents the one it
			// holds now and those it held before (a restored database
			// knows an older one).
			matched := provingHash(credHash, prevHash, j.ProofHash, j.EarlierProofHashes)
			byCred := matched != ""
			// A certificate proves nothing of a removed node: its removal
			// revoked every one issued to it, and one it missed (its
			// replica stopped before its second pass, and no replica
			// revoked it since) is the removed machine's; a takeover
			// revokes it.
			proven := byCred || (j.ProofNodeID != "" && j.ProofNodeID == id && state != api.NodeRemoved)
			prevHash = ""
			switch {
			case proven:
				how = store.JoinedProven
				if byCred {
					// What the agent presented and holds still, should
					// this join's answer be lost.
					prevHash = matched
				}
			case state == api.NodeDown || state == api.NodeRemoved:
				how = store.JoinedTakeover
				ev.Message += fmt.Sprintf("; it did not present the node's credential, and took the %s node over", state)
			default:
				return &store.NodeLive{MachineID: n.Fingerprint.MachineID, Node: api.Node{ID: id, Name: name, State: state}}
			}
			n.ID = id
			n.JoinedAt = tm(joined)
			_, err = tx.ExecContext(ctx, `UPDATE nodes SET name = ?, state = ?, address = ?, agent_url = ?, endpoints = ?, labels = ?,
				fingerprint = ?, health = ?, credential_hash = ?, prev_credential_hash = ?, agent_key = ?, last_heartbeat = ?, wiping = ?, removal_revoked = '', removal_gen = removal_gen + 1 WHERE id = ?`,
				n.Name, n.State, n.Address, n.AgentURL, js(n.Endpoints), js(n.Labels), js(n.Fingerprint), n.Health,
				j.CredentialHash, prevHash, j.AgentKey, ns(n.LastHeartbeat), WipingUnknown, id)
		case errors.Is(err, sql.ErrNoRows):
			_, err = tx.ExecContext(ctx, `INSERT INTO nodes (`+nodeCols+`, credential_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				n.ID, n.Fingerprint.MachineID, n.Name, n.State, n.Address, n.AgentURL, js(n.Endpoints), js(n.Labels), js(n.Fingerprint),
				n.Health, ns(n.LastHeartbeat), ns(n.JoinedAt), j.AgentKey, j.CredentialHash)
		}
		if err != nil {
			return s.wrap("join node", err)
		}
		if err := s.registerDevices(ctx, tx, n.ID, j.Devices); err != nil {
			return err
		}
		ev.Subject = n.ID
		if _, err := s.AppendEventTx(ctx, tx, ev); err != nil {
			return err
		}
		out = n
		return nil
	})
	return out, how, err
}

// provingHash returns the first of the presented credential hashes
// (proof, then earlier) that is the node's stored credential hash or its
// last proven join's (prev, "" for none), "" if none is. Each comparison
// takes constant time.
func provingHash(stored, prev, proof string, earlier []string) string {
	matched := ""
	for _, h := range append([]string{proof}, earlier...) {
		if h == "" {
			continue
		}
		m := subtle.ConstantTimeCompare([]byte(h), []byte(stored))
		if prev != "" {
			m |= subtle.ConstantTimeCompare([]byte(h), []byte(prev))
		}
		if m == 1 && matched == "" {
			matched = h
		}
	}
	return matched
}

// NodeByCredential finds a node by its credential hash.
func (s *Core) NodeByCredential(ctx context.Context, credHash string) (api.Node, error) {
	n, err := scanNode(s.rd().QueryRowContext(ctx, `SELECT `+nodeReadCols+` FROM nodes WHERE credential_hash = ?`, credHash))
	if errors.Is(err, sql.ErrNoRows) {
		return api.Node{}, fmt.Errorf("node credential: %w", store.ErrNotFound)
	}
	if err != nil {
		return api.Node{}, s.wrap("node by credential", err)
	}
	return n.Node, nil
}

// Heartbeat records a heartbeat.
func (s *Core) Heartbeat(ctx context.Context, nodeID string, at time.Time, health string, links []api.Link) (api.NodeState, error) {
	prev, errs, err := s.d.Heartbeats(ctx, []store.Beat{{NodeID: nodeID, At: at, Health: health, Links: links}})
	if err != nil {
		return "", err
	}
	return prev[0], errs[0]
}

// SetNodeState moves a node between states.
func (s *Core) SetNodeState(ctx context.Context, id string, from, to api.NodeState, ev api.Event) error {
	return s.tx(ctx, func(tx Execer) error {
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET state = ? WHERE id = ? AND state = ?`, to, id, from)
		if err != nil {
			return s.wrap("set node state", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("node %s not %s: %w", id, from, store.ErrConflict)
		}
		_, err = s.AppendEventTx(ctx, tx, ev)
		return err
	})
}

// Node returns one node with its agent key.
func (s *Core) Node(ctx context.Context, id string) (store.NodeRecord, error) {
	n, err := scanNode(s.rd().QueryRowContext(ctx, `SELECT `+nodeReadCols+` FROM nodes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return n, fmt.Errorf("node %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return n, s.wrap("node", err)
	}
	return n, nil
}

func (s *Core) nodes(ctx context.Context, q Execer) ([]api.Node, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+nodeReadCols+` FROM nodes ORDER BY name, id`)
	if err != nil {
		return nil, s.wrap("nodes", err)
	}
	defer rows.Close()
	out := []api.Node{}
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, s.wrap("nodes", err)
		}
		out = append(out, n.Node)
	}
	return out, rows.Err()
}

// Nodes lists nodes.
func (s *Core) Nodes(ctx context.Context) ([]api.Node, error) { return s.nodes(ctx, s.rd()) }

// RemoveNode retires a node (store.NodeRemover): state removed, a
// credential hash no token hashes to (hashes are hex; this one is not),
// devices unavailable, links and marks of ranges being wiped gone, the
// serials of the certificates the removal revoked recorded; it returns
// the generation of the node's removal record.
func (s *Core) RemoveNode(ctx context.Context, id string, revoked []string, ev api.Event) (api.Node, int64, error) {
	var out api.Node
	var gen int64
	err := s.tx(ctx, func(tx Execer) error {
		n, err := scanNode(tx.QueryRowContext(ctx, `UPDATE nodes SET state = ?, credential_hash = ?, prev_credential_hash = '' WHERE id = ? RETURNING `+nodeReadCols,
			api.NodeRemoved, "removed:"+id, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("node %s: %w", id, store.ErrNotFound)
		}
		if err != nil {
			return s.wrap("remove node", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE devices SET state = 'unavailable' WHERE node_id = ?`, id); err != nil {
			return s.wrap("remove node", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM links WHERE from_node = ? OR to_node = ?`, id, id); err != nil {
			return s.wrap("remove node", err)
		}
		// Its ranges being wiped: no heartbeat of it is recorded again to
		// forget them (ClearWipes). Should its agent join again, its
		// heartbeats list what it still wipes, marked again then.
		if _, err := tx.ExecContext(ctx, `DELETE FROM wipes WHERE node_id = ?`, id); err != nil {
			return s.wrap("remove node", err)
		}
		if err := tx.QueryRowContext(ctx, `SELECT removal_gen FROM nodes WHERE id = ?`, id).Scan(&gen); err != nil {
			return s.wrap("remove node", err)
		}
		if err := s.addRemovalRevoked(ctx, tx, id, gen, revoked); err != nil {
			return err
		}
		if _, err := s.AppendEventTx(ctx, tx, ev); err != nil {
			return err
		}
		out = n.Node
		return nil
	})
	return out, gen, err
}

// AddRemovalRevoked adds serials revoked after a node's removal committed
// to those recorded, while the node is removed and its record is of
// generation gen (store.NodeRemover).
func (s *Core) AddRemovalRevoked(ctx context.Context, id string, gen int64, revoked []string) error {
	if len(revoked) == 0 {
		return nil
	}
	return s.tx(ctx, func(tx Execer) error { return s.addRemovalRevoked(ctx, tx, id, gen, revoked) })
}

// addRemovalRevoked adds revoked to the serials recorded for node id in
// tx, if the node is removed and its record is of generation gen: those
// of the removals since its last join (which clears them, and raises the
// generation).
func (s *Core) addRemovalRevoked(ctx context.Context, tx Execer, id string, gen int64, revoked []string) error {
	if len(revoked) == 0 {
		return nil
	}
	var state api.NodeState
	var text string
	var have int64
	err := tx.QueryRowContext(ctx, `SELECT state, removal_revoked, removal_gen FROM nodes WHERE id = ?`+s.d.ForUpdate(), id).Scan(&state, &text, &have)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("node %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return s.wrap("removal revoked", err)
	}
	if state != api.NodeRemoved || have != gen {
		return nil // joined again since
	}
	var serials []string
	if err := unjs(text, &serials); err != nil {
		return err
	}
	for _, x := range revoked {
		if !slices.Contains(serials, x) {
			serials = append(serials, x)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE nodes SET removal_revoked = ? WHERE id = ?`, js(serials), id); err != nil {
		return s.wrap("removal revoked", err)
	}
	return nil
}

// RemovalRevoked returns the record of a node's removals since its last
// join: its generation, and the serials of the certificates they revoked
// (none for a node that is not removed) (store.NodeRemover).
func (s *Core) RemovalRevoked(ctx context.Context, id string) (store.RemovalRecord, error) {
	var state api.NodeState
	var text string
	var out store.RemovalRecord
	err := s.rd().QueryRowContext(ctx, `SELECT state, removal_revoked, removal_gen FROM nodes WHERE id = ?`, id).Scan(&state, &text, &out.Gen)
	if errors.Is(err, sql.ErrNoRows) {
		return store.RemovalRecord{}, fmt.Errorf("node %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return store.RemovalRecord{}, s.wrap("removal revoked", err)
	}
	if state != api.NodeRemoved {
		return out, nil
	}
	if err := unjs(text, &out.Revoked); err != nil {
		return store.RemovalRecord{}, err
	}
	return out, nil
}

// UnrecordedRemovalRevoked returns, per removed node, the serials of the
// certificates recorded as issued to it that are revoked, not expired off
// the list, and not named by its removal record, with the record's
// generation (store.NodeRemover).
func (s *Core) UnrecordedRemovalRevoked(ctx context.Context) (map[string]store.RemovalRecord, error) {
	rows, err := s.rd().QueryContext(ctx, `SELECT n.id, n.removal_gen, n.removal_revoked, i.serial FROM nodes n
		JOIN issued_certs i ON i.common_name = n.id JOIN revoked_certs r ON r.serial = i.serial
		WHERE n.state = ? AND r.expired = 0 ORDER BY n.id, i.serial`, api.NodeRemoved)
	if err != nil {
		return nil, s.wrap("unrecorded removal revoked", err)
	}
	defer rows.Close()
	out := map[string]store.RemovalRecord{}
	for rows.Next() {
		var id, text, serial string
		var gen int64
		if err := rows.Scan(&id, &gen, &text, &serial); err != nil {
			return nil, s.wrap("unrecorded removal revoked", err)
		}
		var named []string
		if err := unjs(text, &named); err != nil {
			return nil, err
		}
		if slices.Contains(named, serial) {
			continue
		}
		rec := out[id]
		rec.Gen = gen
		rec.Revoked = append(rec.Revoked, serial)
		out[id] = rec
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("unrecorded removal revoked", err)
	}
	return out, nil
}

// UnrevokedRemoved returns, per removed node, the serials of the
// certificates recorded as issued to it that expire after at and that no
// row of revoked_certs names, with its removal record's generation, read
// by one statement (store.NodeRemover).
func (s *Core) UnrevokedRemoved(ctx context.Context, at time.Time) (map[string]store.UnrevokedCerts, error) {
	rows, err := s.rd().QueryContext(ctx, `SELECT n.id, n.removal_gen, i.serial FROM nodes n
		JOIN issued_certs i ON i.common_name = n.id LEFT JOIN revoked_certs r ON r.serial = i.serial
		WHERE n.state = ? AND i.not_after > ? AND r.serial IS NULL ORDER BY n.id, i.serial`, api.NodeRemoved, at.Unix())
	if err != nil {
		return nil, s.wrap("unrevoked certificates of removed nodes", err)
	}
	defer rows.Close()
	out := map[string]store.UnrevokedCerts{}
	for rows.Next() {
		var id, serial string
		var gen int64
		if err := rows.Scan(&id, &gen, &serial); err != nil {
			return nil, s.wrap("unrevoked certificates of removed nodes", err)
		}
		u := out[id]
		u.Gen = gen
		u.Serials = append(u.Serials, serial)
		out[id] = u
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("unrevoked certificates of removed nodes", err)
	}
	return out, nil
}
