package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/resource"
)

// allocatedExpr is a device d's allocation: the bytes (or slots) its live
// parts hold. It is computed, not kept in a column, so that reserving and
// freeing write only lease_parts.
const allocatedExpr = `(SELECT COALESCE(SUM(p.length), 0) FROM lease_parts p WHERE p.device_id = d.id AND p.live = 1)`

// registerDevices records the devices a node reports at its join: upserted
// by (node, name), keeping their IDs; the node's devices it no longer
// reports become unavailable. A device's capacity never drops below what
// its live leases hold.
func (s *Core) registerDevices(ctx context.Context, tx Execer, nodeID string, specs []api.DeviceSpec) error {
	seen := map[string]bool{}
	for _, d := range specs {
		seen[d.Name] = true
		var did string
		var allocated int64
		err := tx.QueryRowContext(ctx, `SELECT id, `+allocatedExpr+` FROM devices d WHERE node_id = ? AND name = ?`, nodeID, d.Name).Scan(&did, &allocated)
		switch {
		case err == nil:
			capacity := d.Capacity
			if capacity < allocated {
				capacity = allocated // never below what live leases hold
			}
			_, err = tx.ExecContext(ctx, `UPDATE devices SET kind = ?, state = 'available', capacity = ?, model = ?, attributes = ?, sharing = ? WHERE id = ?`,
				d.Kind, capacity, d.Model, js(d.Attributes), d.Sharing, did)
		case errors.Is(err, sql.ErrNoRows):
			_, err = tx.ExecContext(ctx, `INSERT INTO devices (id, node_id, name, kind, state, capacity, model, attributes, sharing) VALUES (?, ?, ?, ?, 'available', ?, ?, ?, ?)`,
				resource.NewID("dev"), nodeID, d.Name, d.Kind, d.Capacity, d.Model, js(d.Attributes), d.Sharing)
		}
		if err != nil {
			return s.wrap("register device "+d.Name, err)
		}
	}
	rows, err := tx.QueryContext(ctx, `SELECT id, name FROM devices WHERE node_id = ?`, nodeID)
	if err != nil {
		return s.wrap("join node", err)
	}
	var gone []string
	for rows.Next() {
		var did, name string
		if err := rows.Scan(&did, &name); err != nil {
			rows.Close()
			return s.wrap("join node", err)
		}
		if !seen[name] {
			gone = append(gone, did)
		}
	}
	rows.Close()
	for _, did := range gone {
		if _, err := tx.ExecContext(ctx, `UPDATE devices SET state = 'unavailable' WHERE id = ?`, did); err != nil {
			return s.wrap("join node", err)
		}
	}
	return nil
}

func (s *Core) devices(ctx context.Context, q Execer) ([]api.Device, error) {
	rows, err := q.QueryContext(ctx, `SELECT d.id, d.node_id, d.name, d.kind, d.state, d.capacity, `+allocatedExpr+`, d.model, d.attributes, d.sharing
		FROM devices d JOIN nodes n ON n.id = d.node_id ORDER BY n.name, d.node_id, d.name`)
	if err != nil {
		return nil, s.wrap("devices", err)
	}
	defer rows.Close()
	out := []api.Device{}
	for rows.Next() {
		var d api.Device
		var attrs string
		if err := rows.Scan(&d.ID, &d.NodeID, &d.Name, &d.Kind, &d.State, &d.Capacity, &d.Allocated, &d.Model, &attrs, &d.Sharing); err != nil {
			return nil, s.wrap("devices", err)
		}
		if err := unjs(attrs, &d.Attributes); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// Devices lists devices.
func (s *Core) Devices(ctx context.Context) ([]api.Device, error) { return s.devices(ctx, s.rd()) }
