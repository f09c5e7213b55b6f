package postgres

import (
	"context"

	"github.com/rialto-project/rialto/api"
)

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
		return wrap("link", err)
	}
	return nil
}

func links(ctx context.Context, q execer) ([]api.Link, error) {
	rows, err := q.QueryContext(ctx, `SELECT id, from_node, to_node, kind, bandwidth_bps, rtt_us, status, load_bps, measured_at FROM links ORDER BY from_node, to_node`)
	if err != nil {
		return nil, wrap("links", err)
	}
	defer rows.Close()
	out := []api.Link{}
	for rows.Next() {
		var l api.Link
		var at int64
		if err := rows.Scan(&l.ID, &l.From, &l.To, &l.Kind, &l.BandwidthBps, &l.RTTMicros, &l.Status, &l.LoadBps, &at); err != nil {
			return nil, wrap("links", err)
		}
		l.MeasuredAt = tm(at)
		l.State = l.Status
		out = append(out, l)
	}
	return out, rows.Err()
}

// Links lists links.
func (s *Store) Links(ctx context.Context) ([]api.Link, error) { return links(ctx, s.rd()) }
