package sqlstore

import (
	"context"

	"github.com/rialto-project/rialto/api"
)

// PutProfile stores a profile.
func (s *Core) PutProfile(ctx context.Context, p api.Profile, ev api.Event) (api.Profile, error) {
	if p.ID == "" {
		p.ID = p.Model
	}
	if p.State == "" {
		p.State = "ready"
	}
	err := s.tx(ctx, func(tx Execer) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO profiles (id, state, data, source, measured_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET state = excluded.state, data = excluded.data, source = excluded.source, measured_at = excluded.measured_at`,
			p.ID, p.State, js(p), p.Source, ns(p.MeasuredAt))
		if err != nil {
			return s.wrap("put profile", err)
		}
		_, err = s.AppendEventTx(ctx, tx, ev)
		return err
	})
	return p, err
}

// Profiles lists profiles.
func (s *Core) Profiles(ctx context.Context) ([]api.Profile, error) { return s.profiles(ctx, s.rd()) }

func (s *Core) profiles(ctx context.Context, q Execer) ([]api.Profile, error) {
	rows, err := q.QueryContext(ctx, `SELECT data FROM profiles ORDER BY id`)
	if err != nil {
		return nil, s.wrap("profiles", err)
	}
	defer rows.Close()
	out := []api.Profile{}
	for rows.Next() {
		var data string
		var p api.Profile
		if err := rows.Scan(&data); err != nil {
			return nil, s.wrap("profiles", err)
		}
		if err := unjs(data, &p); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}
