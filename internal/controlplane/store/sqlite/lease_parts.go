package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// reserve checks the parts of a lease inside tx (device available on a
// ready node, range inside the capacity, no overlap with a live part or
// another part of the lease), then inserts them. A refusal
// (ErrCapacity) comes before anything is written.
func reserve(ctx context.Context, tx execer, leaseID string, kind api.Kind, parts []api.Part) error {
	if err := checkParts(ctx, tx, kind, parts); err != nil {
		return err
	}
	return insertParts(ctx, tx, leaseID, parts)
}

// checkParts is reserve's checks; it writes nothing.
func checkParts(ctx context.Context, tx execer, kind api.Kind, parts []api.Part) error {
	for i, p := range parts {
		var dstate, nstate, dkind, nodeID string
		var capacity int64
		var taken, cordoned bool
		err := tx.QueryRowContext(ctx, `SELECT d.state, d.kind, d.capacity, d.node_id, n.state, n.cordoned,
			EXISTS (SELECT 1 FROM lease_parts p WHERE p.device_id = d.id AND p.live = 1 AND p.off < ? AND p.off + p.length > ?)
			FROM devices d JOIN nodes n ON n.id = d.node_id WHERE d.id = ?`, p.Offset+p.Length, p.Offset, p.DeviceID).
			Scan(&dstate, &dkind, &capacity, &nodeID, &nstate, &cordoned, &taken)
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
		case cordoned:
			return fmt.Errorf("device %s is on a cordoned node: %w", p.DeviceID, store.ErrCapacity)
		case api.Kind(dkind) != kind:
			return fmt.Errorf("device %s is %s, not %s: %w", p.DeviceID, dkind, kind, store.ErrCapacity)
		case p.Offset < 0 || p.Length <= 0 || p.Offset > capacity-p.Length:
			return fmt.Errorf("device %s: range %d+%d outside capacity %d: %w", p.DeviceID, p.Offset, p.Length, capacity, store.ErrCapacity)
		case taken:
			return fmt.Errorf("device %s: range %d+%d is taken: %w", p.DeviceID, p.Offset, p.Length, store.ErrCapacity)
		}
		for _, q := range parts[:i] {
			if q.DeviceID == p.DeviceID && q.Offset < p.Offset+p.Length && q.Offset+q.Length > p.Offset {
				return fmt.Errorf("device %s: parts of one lease overlap: %w", p.DeviceID, store.ErrCapacity)
			}
		}
	}
	return nil
}

// insertParts inserts the parts of a lease, live.
func insertParts(ctx context.Context, tx execer, leaseID string, parts []api.Part) error {
	for i, p := range parts {
		if _, err := tx.ExecContext(ctx, `INSERT INTO lease_parts (lease_id, idx, node_id, device_id, off, length, uri, live) VALUES (?, ?, ?, ?, ?, ?, '', 1)`,
			leaseID, i, p.NodeID, p.DeviceID, p.Offset, p.Length); err != nil {
			return late{fmt.Errorf("sqlite: reserve: %w", err)}
		}
	}
	return nil
}

// free releases the live parts of a lease; del also deletes their rows.
func free(ctx context.Context, tx execer, leaseID string, del bool) error {
	q := `UPDATE lease_parts SET live = 0 WHERE lease_id = ? AND live = 1`
	if del {
		q = `DELETE FROM lease_parts WHERE lease_id = ?`
	}
	if _, err := tx.ExecContext(ctx, q, leaseID); err != nil {
		return fmt.Errorf("sqlite: free parts: %w", err)
	}
	return nil
}

// freeParts releases the live parts idx of a lease (parts it goes on
// without).
func freeParts(ctx context.Context, tx execer, leaseID string, idx []int) error {
	args := make([]any, 0, len(idx)+1)
	args = append(args, leaseID)
	for _, i := range idx {
		args = append(args, i)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE lease_parts SET live = 0 WHERE lease_id = ? AND live = 1 AND idx IN (`+placeholders(len(idx))+`)`, args...); err != nil {
		return fmt.Errorf("sqlite: free parts: %w", err)
	}
	return nil
}

// storedParts are a new lease's parts as stored: without URIs.
func storedParts(ps []api.Part) []api.Part {
	out := make([]api.Part, len(ps))
	for i, p := range ps {
		out[i] = api.Part{NodeID: p.NodeID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length}
	}
	return out
}

// decodeParts decodes a lease's stored parts; they are read back as often
// as plans, and cached the same way.
func (s *Store) decodeParts(text string) ([]api.Part, error) {
	if text == "" || text == "[]" {
		return []api.Part{}, nil
	}
	ps, ok := s.parts.Get(text)
	if !ok {
		if err := unjs(text, &ps); err != nil {
			return nil, err
		}
		s.parts.Put(text, ps)
	}
	return slices.Clone(ps), nil
}

// partsJSON encodes parts to store (and remembers the text).
func (s *Store) partsJSON(ps []api.Part) string {
	if ps == nil {
		ps = []api.Part{}
	}
	text := js(ps)
	s.parts.Put(text, slices.Clone(ps))
	return text
}
