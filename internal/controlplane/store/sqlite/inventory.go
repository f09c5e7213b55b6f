package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// Inventory reads nodes, devices, live parts and links in one read transaction.
func (s *Store) Inventory(ctx context.Context) (store.Inventory, error) {
	var inv store.Inventory
	rtx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: s.r != s.w})
	if err != nil {
		return inv, fmt.Errorf("sqlite: inventory: %w", err)
	}
	defer s.rs.flush(ctx) // runs after the rollback below
	defer rtx.Rollback()
	tx := cachedTx{rtx, s.rs}
	if inv.Nodes, err = nodes(ctx, tx); err != nil {
		return inv, err
	}
	if inv.Devices, err = devices(ctx, tx); err != nil {
		return inv, err
	}
	if inv.Links, err = links(ctx, tx); err != nil {
		return inv, err
	}
	if inv.Profiles, err = profiles(ctx, tx); err != nil {
		return inv, err
	}
	rows, err := tx.QueryContext(ctx, `SELECT p.lease_id, p.node_id, p.device_id, p.off, p.length, l.mode, l.tenant, l.demand_bps, l.work_bytes, l.deadline_at, l.gateway
		FROM lease_parts p JOIN leases l ON l.id = p.lease_id WHERE p.live = 1 ORDER BY p.lease_id, p.idx`)
	if err != nil {
		return inv, fmt.Errorf("sqlite: inventory: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var p store.LivePart
		var deadline int64
		if err := rows.Scan(&p.LeaseID, &p.NodeID, &p.DeviceID, &p.Offset, &p.Length, &p.Mode, &p.Tenant, &p.Demand.Bandwidth, &p.Demand.Work, &deadline, &p.Demand.Gateway); err != nil {
			return inv, fmt.Errorf("sqlite: inventory: %w", err)
		}
		if deadline != 0 {
			p.Demand.Deadline = tm(deadline)
		}
		inv.Parts = append(inv.Parts, p)
	}
	return inv, rows.Err()
}

// Counts returns nodes and leases by state.
func (s *Store) Counts(ctx context.Context) (store.Counts, error) {
	c := store.Counts{Nodes: map[api.NodeState]int{}, Leases: map[api.LeaseState]int{}}
	for _, q := range []struct {
		sql string
		put func(string, int)
	}{
		{`SELECT state, COUNT(*) FROM nodes GROUP BY state`, func(s string, n int) { c.Nodes[api.NodeState(s)] = n }},
		{`SELECT state, COUNT(*) FROM leases GROUP BY state`, func(s string, n int) { c.Leases[api.LeaseState(s)] = n }},
	} {
		rows, err := s.rd().QueryContext(ctx, q.sql)
		if err != nil {
			return c, fmt.Errorf("sqlite: counts: %w", err)
		}
		for rows.Next() {
			var st string
			var n int
			if err := rows.Scan(&st, &n); err != nil {
				rows.Close()
				return c, fmt.Errorf("sqlite: counts: %w", err)
			}
			q.put(st, n)
		}
		rows.Close()
	}
	return c, nil
}
