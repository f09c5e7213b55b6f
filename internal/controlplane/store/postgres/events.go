package postgres

import (
	"context"
	"time"

	"github.com/rialto-project/rialto/api"
)

// appendEvents appends events in one statement that first takes the
// event log's lock (see doc.go: events become visible in ID order); the
// rows get their IDs in the order given.
func (s *Store) appendEvents(ctx context.Context, q execer, evs []api.Event) error {
	if len(evs) == 0 {
		return nil
	}
	at := make([]int64, len(evs))
	typ, subj, msg, st := make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs))
	for i, ev := range evs {
		if ev.At.IsZero() {
			ev.At = time.Now().UTC()
		}
		at[i], typ[i], subj[i], msg[i], st[i] = ns(ev.At), ev.Type, ev.Subject, ev.Message, ev.State
	}
	if _, err := q.ExecContext(ctx, `WITH lk AS (SELECT pg_advisory_xact_lock(?, ?))
		INSERT INTO events (at, type, subject, message, state)
		SELECT t.at, t.type, t.subject, t.message, t.state
		FROM lk, unnest(?::bigint[], ?::text[], ?::text[], ?::text[], ?::text[]) WITH ORDINALITY AS t(at, type, subject, message, state, i)
		ORDER BY t.i`, lockClass, lockEvents, at, typ, subj, msg, st); err != nil {
		return wrap("append events", err)
	}
	return nil
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
