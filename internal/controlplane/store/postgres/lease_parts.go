package postgres

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
		var r partRow
		err := tx.QueryRowContext(ctx, partCheckSQL, p.Offset+p.Length, p.Offset, p.DeviceID).
			Scan(&r.dstate, &r.dkind, &r.capacity, &r.nodeID, &r.nstate, &r.cordoned, &r.taken)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("device %s: %w", p.DeviceID, store.ErrCapacity)
		}
		if err != nil {
			return wrap("reserve", err)
		}
		if err := judgePart(kind, parts, i, r); err != nil {
			return err
		}
	}
	return nil
}

// partCheckSQL reads what a part's check needs: its device's state, kind,
// capacity and node, the node's state and cordon, and whether a live part overlaps
// the range (arguments: range end, range start, device ID).
const partCheckSQL = `SELECT d.state, d.kind, d.capacity, d.node_id, n.state, n.cordoned <> 0,
	EXISTS (SELECT 1 FROM lease_parts p WHERE p.device_id = d.id AND p.live = 1 AND p.off < ? AND p.off + p.length > ?)
	FROM devices d JOIN nodes n ON n.id = d.node_id WHERE d.id = ?`

// partRow is partCheckSQL's answer.
type partRow struct {
	dstate, dkind, nodeID, nstate string
	capacity                      int64
	cordoned, taken               bool
}

// judgePart refuses part i of parts (ErrCapacity) unless r shows it
// fits: device available on a ready node that is not cordoned, of the lease's kind, the range
// inside the capacity, not taken, and not overlapping an earlier part.
func judgePart(kind api.Kind, parts []api.Part, i int, r partRow) error {
	p := parts[i]
	switch {
	case r.nodeID != p.NodeID:
		return fmt.Errorf("device %s is not on node %s: %w", p.DeviceID, p.NodeID, store.ErrCapacity)
	case r.dstate != "available" || r.nstate != string(api.NodeReady):
		return fmt.Errorf("device %s is %s on a %s node: %w", p.DeviceID, r.dstate, r.nstate, store.ErrCapacity)
	case r.cordoned:
		return fmt.Errorf("device %s is on a cordoned node: %w", p.DeviceID, store.ErrCapacity)
	case api.Kind(r.dkind) != kind:
		return fmt.Errorf("device %s is %s, not %s: %w", p.DeviceID, r.dkind, kind, store.ErrCapacity)
	case p.Offset < 0 || p.Length <= 0 || p.Offset > r.capacity-p.Length:
		return fmt.Errorf("device %s: range %d+%d outside capacity %d: %w", p.DeviceID, p.Offset, p.Length, r.capacity, store.ErrCapacity)
	case r.taken:
		return fmt.Errorf("device %s: range %d+%d is taken: %w", p.DeviceID, p.Offset, p.Length, store.ErrCapacity)
	}
	for _, q := range parts[:i] {
		if q.DeviceID == p.DeviceID && q.Offset < p.Offset+p.Length && q.Offset+q.Length > p.Offset {
			return fmt.Errorf("device %s: parts of one lease overlap: %w", p.DeviceID, store.ErrCapacity)
		}
	}
	return nil
}

// lockParts locks, in the order doc.go gives, what creations and
// re-placements re-check: the tenants whose limits they check (a
// transaction-scoped advisory lock each) and the parts' devices (FOR
// UPDATE: one reservation on a device at a time), each in ID order.
// Nodes are not locked: a reservation that races a node's move to
// suspect or down may commit on it, and the sweep, which looks for the
// leases of a down node on every pass, marks it lost like the others.
// checkParts and checkLimit then read what the previous holders
// committed.
func lockParts(ctx context.Context, tx execer, tenants []string, parts []api.Part) error {
	slices.Sort(tenants)
	for _, t := range slices.Compact(tenants) {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?, hashtext(?))`, lockTenantNS, t); err != nil {
			return wrap("lock tenant", err)
		}
	}
	if len(parts) == 0 {
		return nil
	}
	devs := make([]string, 0, len(parts))
	for _, p := range parts {
		devs = append(devs, p.DeviceID)
	}
	slices.Sort(devs)
	if _, err := tx.ExecContext(ctx, `SELECT id FROM devices WHERE id = ANY(?) ORDER BY id FOR UPDATE`, slices.Compact(devs)); err != nil {
		return wrap("lock devices", err)
	}
	return nil
}

// checkLimit refuses a new lease l (not yet written) that would take its
// tenant past lim (store.ErrQuota); the tenant is locked (lockParts).
func checkLimit(ctx context.Context, tx execer, l api.Lease, d store.Demand, lim store.Limit) error {
	var u usage
	if err := tx.QueryRowContext(ctx, limitSQL, l.Tenant).Scan(&u.leases, &u.bw, &u.bytes, &u.slots); err != nil {
		return wrap("quota", err)
	}
	kinds := make([]partRow, len(l.Parts))
	for i, p := range l.Parts {
		if err := tx.QueryRowContext(ctx, `SELECT kind, capacity FROM devices WHERE id = ?`, p.DeviceID).Scan(&kinds[i].dkind, &kinds[i].capacity); err != nil {
			return wrap("quota", err)
		}
	}
	return judgeLimit(l, d, lim, u, kinds)
}

// limitSQL is a tenant's usage: its leases with live parts, their
// declared bandwidths, and the bytes and slots their parts charge.
const limitSQL = `SELECT COUNT(*), COALESCE(SUM(l.demand_bps), 0), COALESCE(SUM(c.bytes), 0), COALESCE(SUM(c.slots), 0)
	FROM leases l JOIN (
		SELECT p.lease_id,
			SUM(CASE WHEN d.kind = 'accel' THEN 0 WHEN l2.mode = 'dedicated' THEN d.capacity ELSE p.length END) AS bytes,
			SUM(CASE WHEN d.kind = 'accel' THEN p.length ELSE 0 END) AS slots
		FROM lease_parts p JOIN devices d ON d.id = p.device_id JOIN leases l2 ON l2.id = p.lease_id
		WHERE p.live = 1 AND l2.tenant = ? GROUP BY p.lease_id) c ON c.lease_id = l.id`

// usage is a tenant's charge against its limit.
type usage struct {
	leases       int
	bw           float64
	bytes, slots int64
}

// charge is what lease l (parts on devices of the given kinds and
// capacities) adds to its tenant's usage.
func charge(l api.Lease, d store.Demand, devs []partRow) usage {
	u := usage{leases: 1, bw: d.Bandwidth}
	for i, p := range l.Parts {
		switch {
		case devs[i].dkind == string(api.KindAccel):
			u.slots += p.Length
		case l.Mode == api.ModeDedicated:
			u.bytes += devs[i].capacity
		default:
			u.bytes += p.Length
		}
	}
	return u
}

// judgeLimit refuses l if the tenant's usage u plus l's charge breaks lim.
func judgeLimit(l api.Lease, d store.Demand, lim store.Limit, u usage, devs []partRow) error {
	c := charge(l, d, devs)
	leases, bw, bytes, slots := u.leases+c.leases, u.bw+c.bw, u.bytes+c.bytes, u.slots+c.slots
	switch {
	case lim.Leases > 0 && leases > lim.Leases:
		return fmt.Errorf("tenant %s would hold %d of %d leases: %w", l.Tenant, leases, lim.Leases, store.ErrQuota)
	case lim.Bytes > 0 && bytes > lim.Bytes:
		return fmt.Errorf("tenant %s would hold %d of %d bytes: %w", l.Tenant, bytes, lim.Bytes, store.ErrQuota)
	case lim.Slots > 0 && slots > lim.Slots:
		return fmt.Errorf("tenant %s would hold %d of %d slots: %w", l.Tenant, slots, lim.Slots, store.ErrQuota)
	case lim.Bandwidth > 0 && bw > lim.Bandwidth:
		return fmt.Errorf("tenant %s would use %.0f of %.0f bytes/s: %w", l.Tenant, bw, lim.Bandwidth, store.ErrQuota)
	}
	return nil
}

// insertParts inserts the parts of a lease, live.
func insertParts(ctx context.Context, tx execer, leaseID string, parts []api.Part) error {
	for i, p := range parts {
		if _, err := tx.ExecContext(ctx, `INSERT INTO lease_parts (lease_id, idx, node_id, device_id, off, length, uri, live) VALUES (?, ?, ?, ?, ?, ?, '', 1)`,
			leaseID, i, p.NodeID, p.DeviceID, p.Offset, p.Length); err != nil {
			return late{wrap("reserve", err)}
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
		return wrap("free parts", err)
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
