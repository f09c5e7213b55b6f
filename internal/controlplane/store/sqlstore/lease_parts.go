package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/resource"
)

// reserve checks the parts of a lease inside tx (device available on a
// ready node, range inside the capacity, no overlap with a live part or
// another part of the lease), then inserts them. A refusal
// (ErrCapacity) comes before anything is written.
func (s *Core) reserve(ctx context.Context, tx Execer, leaseID string, kind api.Kind, parts []api.Part) error {
	if err := s.checkParts(ctx, tx, kind, parts); err != nil {
		return err
	}
	return s.InsertParts(ctx, tx, leaseID, parts)
}

// checkParts is reserve's checks; it writes nothing.
func (s *Core) checkParts(ctx context.Context, tx Execer, kind api.Kind, parts []api.Part) error {
	for i, p := range parts {
		var r PartRow
		err := tx.QueryRowContext(ctx, PartCheckSQL, PartCheckArgs(p)...).
			Scan(&r.DState, &r.DKind, &r.Capacity, &r.NodeID, &r.NState, &r.Cordoned, &r.Taken)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("device %s: %w", p.DeviceID, store.ErrCapacity)
		}
		if err != nil {
			return s.wrap("reserve", err)
		}
		if err := JudgePart(kind, parts, i, r); err != nil {
			return err
		}
	}
	return nil
}

// PartCheckSQL reads what a part's check needs: its device's state, kind,
// capacity and node, the node's state and cordon, and whether a live part
// or a range being wiped overlaps the range (arguments: PartCheckArgs).
const PartCheckSQL = `SELECT d.state, d.kind, d.capacity, d.node_id, n.state, n.cordoned <> 0,
	EXISTS (SELECT 1 FROM lease_parts p WHERE p.device_id = d.id AND p.live = 1 AND p.off < ? AND p.off + p.length > ?)
	OR EXISTS (SELECT 1 FROM wipes w WHERE w.device_id = d.id AND w.off < ? AND w.off + w.length > ?)
	FROM devices d JOIN nodes n ON n.id = d.node_id WHERE d.id = ?`

// PartCheckArgs are PartCheckSQL's arguments for part p.
func PartCheckArgs(p api.Part) []any {
	return []any{p.Offset + p.Length, p.Offset, p.Offset + p.Length, p.Offset, p.DeviceID}
}

// PartRow is PartCheckSQL's answer.
type PartRow struct {
	DState, DKind, NodeID, NState string
	Capacity                      int64
	Cordoned, Taken               bool
}

// JudgePart refuses part i of parts (ErrCapacity) unless r shows it
// fits: device available on a ready node that is not cordoned, of the lease's kind, the range
// inside the capacity, not taken, and not overlapping an earlier part.
func JudgePart(kind api.Kind, parts []api.Part, i int, r PartRow) error {
	p := parts[i]
	switch {
	case r.NodeID != p.NodeID:
		return fmt.Errorf("device %s is not on node %s: %w", p.DeviceID, p.NodeID, store.ErrCapacity)
	case r.DState != "available" || r.NState != string(api.NodeReady):
		return fmt.Errorf("device %s is %s on a %s node: %w", p.DeviceID, r.DState, r.NState, store.ErrCapacity)
	case r.Cordoned:
		return fmt.Errorf("device %s is on a cordoned node: %w", p.DeviceID, store.ErrCapacity)
	case api.Kind(r.DKind) != kind:
		return fmt.Errorf("device %s is %s, not %s: %w", p.DeviceID, r.DKind, kind, store.ErrCapacity)
	case p.Offset < 0 || p.Length <= 0 || p.Offset > r.Capacity-p.Length:
		return fmt.Errorf("device %s: range %d+%d outside capacity %d: %w", p.DeviceID, p.Offset, p.Length, r.Capacity, store.ErrCapacity)
	case r.Taken:
		return fmt.Errorf("device %s: range %d+%d is taken (by a live lease, or being wiped after one): %w", p.DeviceID, p.Offset, p.Length, store.ErrCapacity)
	}
	for _, q := range parts[:i] {
		if q.DeviceID == p.DeviceID && q.Offset < p.Offset+p.Length && q.Offset+q.Length > p.Offset {
			return fmt.Errorf("device %s: parts of one lease overlap: %w", p.DeviceID, store.ErrCapacity)
		}
	}
	return nil
}

// checkLimit refuses a new lease l (not yet written) that would take its
// tenant past lim (store.ErrQuota); the tenant is locked (Dialect.LockParts).
func (s *Core) checkLimit(ctx context.Context, tx Execer, l api.Lease, d store.Demand, lim store.Limit) error {
	var u Usage
	if err := tx.QueryRowContext(ctx, LimitSQL, l.Tenant).Scan(&u.Leases, &u.BW, &u.Bytes, &u.Slots); err != nil {
		return s.wrap("quota", err)
	}
	kinds := make([]PartRow, len(l.Parts))
	for i, p := range l.Parts {
		if err := tx.QueryRowContext(ctx, `SELECT kind, capacity FROM devices WHERE id = ?`, p.DeviceID).Scan(&kinds[i].DKind, &kinds[i].Capacity); err != nil {
			return s.wrap("quota", err)
		}
	}
	return JudgeLimit(l, d, lim, u, kinds)
}

// LimitSQL is a tenant's usage: its leases with live parts, their
// declared bandwidths, and the bytes and slots their parts Charge.
const LimitSQL = `SELECT COUNT(*), COALESCE(SUM(l.demand_bps), 0), COALESCE(SUM(c.bytes), 0), COALESCE(SUM(c.slots), 0)
	FROM leases l JOIN (
		SELECT p.lease_id,
			SUM(CASE WHEN d.kind = 'accel' THEN 0 WHEN l2.mode = 'dedicated' THEN d.capacity ELSE p.length END) AS bytes,
			SUM(CASE WHEN d.kind = 'accel' THEN p.length ELSE 0 END) AS slots
		FROM lease_parts p JOIN devices d ON d.id = p.device_id JOIN leases l2 ON l2.id = p.lease_id
		WHERE p.live = 1 AND l2.tenant = ? GROUP BY p.lease_id) c ON c.lease_id = l.id`

// Usage is a tenant's charge against its limit.
type Usage struct {
	Leases       int
	BW           float64
	Bytes, Slots int64
}

// Charge is what lease l (parts on devices of the given kinds and
// capacities) adds to its tenant's usage.
func Charge(l api.Lease, d store.Demand, devs []PartRow) Usage {
	u := Usage{Leases: 1, BW: d.Bandwidth}
	for i, p := range l.Parts {
		switch {
		case devs[i].DKind == string(api.KindAccel):
			u.Slots += p.Length
		case l.Mode == api.ModeDedicated:
			u.Bytes += devs[i].Capacity
		default:
			u.Bytes += p.Length
		}
	}
	return u
}

// slotText shows n accel units as slots ("2.25").
func slotText(n int64) string {
	return strconv.FormatFloat(float64(n)/api.SlotUnits, 'f', -1, 64)
}

// JudgeLimit refuses l if the tenant's usage u plus l's charge breaks lim.
func JudgeLimit(l api.Lease, d store.Demand, lim store.Limit, u Usage, devs []PartRow) error {
	c := Charge(l, d, devs)
	leases, bw, bytes, slots := u.Leases+c.Leases, u.BW+c.BW, u.Bytes+c.Bytes, u.Slots+c.Slots
	switch {
	case lim.Leases > 0 && leases > lim.Leases:
		return fmt.Errorf("tenant %s would hold %d of %d leases: %w", l.Tenant, leases, lim.Leases, store.ErrQuota)
	case lim.Bytes > 0 && bytes > lim.Bytes:
		return fmt.Errorf("tenant %s would hold %s of %s: %w", l.Tenant, resource.FormatSize(bytes), resource.FormatSize(lim.Bytes), store.ErrQuota)
	case lim.Slots > 0 && slots > lim.Slots:
		return fmt.Errorf("tenant %s would hold %s of %s slots: %w", l.Tenant, slotText(slots), slotText(lim.Slots), store.ErrQuota)
	case lim.Bandwidth > 0 && bw > lim.Bandwidth:
		// The quota counts every kind's rates together in bytes/s; a
		// nic lease's own rate is a link rate, as its size prints, with
		// the bytes/s counted (placement's refusal says the same).
		with := ""
		if l.Kind == api.KindNIC {
			with = fmt.Sprintf(" with this nic lease's %s (%s)", resource.FormatLinkRate(c.BW), resource.FormatRate(c.BW))
		}
		return fmt.Errorf("tenant %s would use %s of %s%s: %w", l.Tenant, resource.FormatRate(bw), resource.FormatRate(lim.Bandwidth), with, store.ErrQuota)
	}
	return nil
}

// InsertParts inserts the parts of a lease, live.
func (s *Core) InsertParts(ctx context.Context, tx Execer, leaseID string, parts []api.Part) error {
	for i, p := range parts {
		if _, err := tx.ExecContext(ctx, `INSERT INTO lease_parts (lease_id, idx, node_id, device_id, off, length, uri, live) VALUES (?, ?, ?, ?, ?, ?, '', 1)`,
			leaseID, i, p.NodeID, p.DeviceID, p.Offset, p.Length); err != nil {
			return Late{s.wrap("reserve", err)}
		}
	}
	return nil
}

// Free releases the live parts of a lease; del also deletes their rows.
func (s *Core) Free(ctx context.Context, tx Execer, leaseID string, del bool) error {
	q := `UPDATE lease_parts SET live = 0 WHERE lease_id = ? AND live = 1`
	if del {
		q = `DELETE FROM lease_parts WHERE lease_id = ?`
	}
	if _, err := tx.ExecContext(ctx, q, leaseID); err != nil {
		return s.wrap("free parts", err)
	}
	return nil
}

// FreeParts releases the live parts idx of a lease (parts it goes on
// without).
func (s *Core) FreeParts(ctx context.Context, tx Execer, leaseID string, idx []int) error {
	args := make([]any, 0, len(idx)+1)
	args = append(args, leaseID)
	for _, i := range idx {
		args = append(args, i)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE lease_parts SET live = 0 WHERE lease_id = ? AND live = 1 AND idx IN (`+Placeholders(len(idx))+`)`, args...); err != nil {
		return s.wrap("free parts", err)
	}
	return nil
}

// StoredParts are a new lease's parts as stored: without URIs.
func StoredParts(ps []api.Part) []api.Part {
	out := make([]api.Part, len(ps))
	for i, p := range ps {
		out[i] = api.Part{NodeID: p.NodeID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length}
	}
	return out
}

// DecodeParts decodes a lease's stored parts; they are read back as often
// as plans, and cached the same way.
func (s *Core) DecodeParts(text string) ([]api.Part, error) {
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

// PartsJSON encodes parts to store (and remembers the text).
func (s *Core) PartsJSON(ps []api.Part) string {
	if ps == nil {
		ps = []api.Part{}
	}
	text := js(ps)
	s.parts.Put(text, slices.Clone(ps))
	return text
}
