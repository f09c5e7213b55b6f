package postgres

import (
	"context"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
)

// appendEvents appends events with as few statements as it can: rows are
// inserted in chunks of a power of two (at most maxEventRows), so that a
// handful of prepared statements serve every batch size.
func (s *Store) appendEvents(ctx context.Context, q execer, evs []api.Event) error {
	const maxEventRows = 64
	var args []any
	for len(evs) > 0 {
		n := maxEventRows
		for n > len(evs) {
			n /= 2
		}
		args = args[:0]
		for _, ev := range evs[:n] {
			if ev.At.IsZero() {
				ev.At = time.Now().UTC()
			}
			args = append(args, ns(ev.At), ev.Type, ev.Subject, ev.Message, ev.State)
		}
		if _, err := q.ExecContext(ctx, s.eventInsert(n), args...); err != nil {
			return wrap("append events", err)
		}
		evs = evs[n:]
	}
	return nil
}

// eventInsert is the statement inserting n events.
func (s *Store) eventInsert(n int) string {
	if v, ok := s.eventSQL.Load(n); ok {
		return v.(string)
	}
	q := `INSERT INTO events (at, type, subject, message, state) VALUES (?, ?, ?, ?, ?)` + strings.Repeat(`, (?, ?, ?, ?, ?)`, n-1)
	s.eventSQL.Store(n, q)
	return q
}

func appendEvent(ctx context.Context, q execer, ev api.Event) (api.Event, error) {
	if ev.Type == "" {
		return ev, nil
	}
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	if err := lockEventLog(ctx, q); err != nil {
		return ev, err
	}
	if err := q.QueryRowContext(ctx, `INSERT INTO events (at, type, subject, message, state) VALUES (?, ?, ?, ?, ?) RETURNING id`,
		ns(ev.At), ev.Type, ev.Subject, ev.Message, ev.State).Scan(&ev.ID); err != nil {
		return ev, wrap("append event", err)
	}
	return ev, nil
}

// AppendEvent appends one event.
func (s *Store) AppendEvent(ctx context.Context, ev api.Event) (api.Event, error) {
	var out api.Event
	err := s.tx(ctx, func(tx execer) error {
		var err error
		out, err = appendEvent(ctx, tx, ev)
		return err
	})
	return out, err
}

// Events returns events with ID > since.
func (s *Store) Events(ctx context.Context, since int64, limit int, tenant string) ([]api.Event, error) {
	if limit <= 0 {
		limit = 1000
	}
	q, args := `SELECT id, at, type, subject, message, state FROM events WHERE id > ?`, []any{since}
	if tenant != "" {
		q += ` AND (type NOT LIKE 'lease.%' OR EXISTS (SELECT 1 FROM leases WHERE leases.id = events.subject AND leases.tenant = ?))`
		args = append(args, tenant)
	}
	rows, err := s.rd().QueryContext(ctx, q+` ORDER BY id LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, wrap("events", err)
	}
	defer rows.Close()
	out := []api.Event{}
	for rows.Next() {
		var e api.Event
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Type, &e.Subject, &e.Message, &e.State); err != nil {
			return nil, wrap("events", err)
		}
		e.At = tm(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// LastEventID returns the greatest event ID (0 for an empty log): where a
// tail of the log (the event stream) starts.
func (s *Store) LastEventID(ctx context.Context) (int64, error) {
	var id int64
	if err := s.rd().QueryRowContext(ctx, `SELECT COALESCE(MAX(id), 0) FROM events`).Scan(&id); err != nil {
		return 0, wrap("last event id", err)
	}
	return id, nil
}
