package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

// clearPrevCredential is the assignment by which a heartbeat at a time
// (its argument) after the node's last one (its join's, for the first
// after a join) forgets the credential the node's last proven join
// presented: the agent holds that join's answer (store.JoinNode). A
// heartbeat of the agent before, written late, forgets nothing.
const clearPrevCredential = `prev_credential_hash = CASE WHEN ? > last_heartbeat THEN '' ELSE prev_credential_hash END`

// Heartbeats records many heartbeats in one transaction. A heartbeat of
// a removed node is refused (store.ErrNotFound) and writes nothing.
func (s *Store) Heartbeats(ctx context.Context, beats []store.Beat) ([]api.NodeState, []error, error) {
	prev := make([]api.NodeState, len(beats))
	errs := make([]error, len(beats))
	err := s.tx(ctx, func(tx execer) error {
		for i, b := range beats {
			// The usual case, a ready node, is one statement; a node that
			// was not ready (or is unknown) is read first.
			res, err := tx.ExecContext(ctx, `UPDATE nodes SET `+clearPrevCredential+`, health = ?, last_heartbeat = ?, wiping = ? WHERE id = ? AND state = 'ready'`, ns(b.At), b.Health, ns(b.At), sqlstore.WipingText(b.Wiping), b.NodeID)
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
				if prev[i] == api.NodeRemoved {
					// Removal is final: a heartbeat that was in flight or
					// kept in memory when its node was removed changes
					// nothing (only a join brings the machine back).
					errs[i] = fmt.Errorf("node %s was removed: %w", b.NodeID, store.ErrNotFound)
					continue
				}
				if _, err := tx.ExecContext(ctx, `UPDATE nodes SET `+clearPrevCredential+`, state = 'ready', health = ?, last_heartbeat = ?, wiping = ? WHERE id = ?`, ns(b.At), b.Health, ns(b.At), sqlstore.WipingText(b.Wiping), b.NodeID); err != nil {
					return fmt.Errorf("sqlite: heartbeat: %w", err)
				}
			}
			for _, l := range b.Links {
				if err := putLink(ctx, tx, l); err != nil {
					return err
				}
			}
			if prev[i] != api.NodeReady {
				if _, err := s.AppendEventTx(ctx, tx, api.Event{At: b.At, Type: "node.ready", Subject: b.NodeID, Message: "heartbeat after " + string(prev[i]), State: string(api.NodeReady)}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return prev, errs, err
}

// putLink records a measured link (by its endpoints).
func putLink(ctx context.Context, tx execer, l api.Link) error {
	if l.ID == "" {
		l.ID = l.From + ">" + l.To
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO links (id, from_node, to_node, kind, bandwidth_bps, rtt_us, status, load_bps, measured_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
				ON CONFLICT (from_node, to_node) DO UPDATE SET kind = excluded.kind, bandwidth_bps = excluded.bandwidth_bps,
				rtt_us = excluded.rtt_us, status = excluded.status, load_bps = excluded.load_bps, measured_at = excluded.measured_at`,
		l.ID, l.From, l.To, l.Kind, l.BandwidthBps, l.RTTMicros, l.Status, l.LoadBps, ns(l.MeasuredAt))
	if err != nil {
		return fmt.Errorf("sqlite: link: %w", err)
	}
	return nil
}
