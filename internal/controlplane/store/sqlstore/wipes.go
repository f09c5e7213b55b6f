package sqlstore

import (
	"context"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

var _ store.Wiper = (*Core)(nil)

// WipingText is a heartbeat's list of leases being wiped as nodes.wiping
// keeps it: ",id1,id2," ("" for none), so that a lease is found with
// LIKE '%,' || id || ',%' in either dialect.
//
// A node that joined again and whose heartbeats have not been recorded
// since keeps WipingUnknown: its lender's wipes are not known, and no
// mark on it goes (ClearWipes) until a heartbeat says.
func WipingText(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	return "," + strings.Join(ids, ",") + ","
}

// WipingUnknown is nodes.wiping of a node that joined again and whose
// heartbeats have not been recorded since (WipingText).
const WipingUnknown = "*"

// MarkWiping records ranges being wiped (store.Wiper); a mark already
// recorded takes the new time.
func (s *Core) MarkWiping(ctx context.Context, ws []store.Wipe) error {
	if len(ws) == 0 {
		return nil
	}
	return s.tx(ctx, func(tx Execer) error {
		for _, w := range ws {
			for i, p := range w.Parts {
				if _, err := tx.ExecContext(ctx, `INSERT INTO wipes (lease_id, node_id, idx, device_id, off, length, mode, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
					ON CONFLICT (lease_id, node_id, idx) DO UPDATE SET at = excluded.at`, w.LeaseID, w.NodeID, i, p.DeviceID, p.Offset, p.Length, string(w.Mode), ns(w.At)); err != nil {
					return s.wrap("mark wiping", err)
				}
			}
		}
		return nil
	})
}

// Unwipe forgets lease id's ranges on node (store.Wiper).
func (s *Core) Unwipe(ctx context.Context, leaseID, nodeID string) error {
	return s.tx(ctx, func(tx Execer) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM wipes WHERE lease_id = ? AND node_id = ?`, leaseID, nodeID); err != nil {
			return s.wrap("unwipe", err)
		}
		return nil
	})
}

// Wipes returns every range recorded as being wiped (store.Wiper).
func (s *Core) Wipes(ctx context.Context) ([]store.Wipe, error) {
	rows, err := s.rd().QueryContext(ctx, `SELECT lease_id, node_id, device_id, off, length, mode, at FROM wipes ORDER BY lease_id, node_id, idx`)
	if err != nil {
		return nil, s.wrap("wipes", err)
	}
	defer rows.Close()
	var out []store.Wipe
	for rows.Next() {
		var lease, node, mode string
		var p api.Part
		var at int64
		if err := rows.Scan(&lease, &node, &p.DeviceID, &p.Offset, &p.Length, &mode, &at); err != nil {
			return nil, s.wrap("wipes", err)
		}
		p.NodeID = node
		if k := len(out) - 1; k >= 0 && out[k].LeaseID == lease && out[k].NodeID == node {
			out[k].Parts = append(out[k].Parts, p)
			continue
		}
		out = append(out, store.Wipe{LeaseID: lease, NodeID: node, Parts: []api.Part{p}, Mode: api.Mode(mode), At: tm(at)})
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("wipes", err)
	}
	return out, nil
}

// ClearWipes forgets the ranges whose node's last recorded heartbeat, at
// least settle after the mark, no longer lists them (store.Wiper). A
// node that joined again and has not had a heartbeat recorded since
// (WipingUnknown) keeps its marks.
func (s *Core) ClearWipes(ctx context.Context, settle time.Duration) (int, error) {
	var n int64
	err := s.tx(ctx, func(tx Execer) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM wipes WHERE EXISTS (SELECT 1 FROM nodes n WHERE n.id = wipes.node_id
			AND n.last_heartbeat > wipes.at + ?
			AND n.wiping <> ?
			AND n.wiping NOT LIKE '%,' || wipes.lease_id || ',%'
			AND (n.wiping = '' OR wipes.lease_id NOT LIKE 'refused/%'))`, int64(settle), WipingUnknown)
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err != nil {
			return s.wrap("clear wipes", err)
		}
		return nil
	})
	return int(n), err
}
