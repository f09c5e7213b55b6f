package sqlstore

import (
	"context"

	"github.com/rialto-project/rialto/api"
)

func (s *Core) links(ctx context.Context, q Execer) ([]api.Link, error) {
	rows, err := q.QueryContext(ctx, `SELECT id, from_node, to_node, kind, bandwidth_bps, rtt_us, status, load_bps, measured_at FROM links ORDER BY from_node, to_node`)
	if err != nil {
		return nil, s.wrap("links", err)
	}
	defer rows.Close()
	out := []api.Link{}
	for rows.Next() {
		var l api.Link
		var at int64
		if err := rows.Scan(&l.ID, &l.From, &l.To, &l.Kind, &l.BandwidthBps, &l.RTTMicros, &l.Status, &l.LoadBps, &at); err != nil {
			return nil, s.wrap("links", err)
		}
		l.MeasuredAt = tm(at)
		l.State = l.Status
		out = append(out, l)
	}
	return out, rows.Err()
}

// Links lists links.
func (s *Core) Links(ctx context.Context) ([]api.Link, error) { return s.links(ctx, s.rd()) }
