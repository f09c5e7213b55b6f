package sqlstore

import (
	"context"
	"time"

	"github.com/rialto-project/rialto/api"
)

// appendEvents appends events in the order given (Dialect.AppendEvents).
func (s *Core) appendEvents(ctx context.Context, q Execer, evs []api.Event) error {
	if len(evs) == 0 {
		return nil
	}
	return s.d.AppendEvents(ctx, q, evs)
}

// AppendEventTx appends one event in transaction q (none if its Type
// is empty) and returns it with its ID.
func (s *Core) AppendEventTx(ctx context.Context, q Execer, ev api.Event) (api.Event, error) {
	if ev.Type == "" {
		return ev, nil
	}
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	if err := s.d.LockEventLog(ctx, q); err != nil {
		return ev, err
	}
	if err := q.QueryRowContext(ctx, `INSERT INTO events (at, type, subject, message, state) VALUES (?, ?, ?, ?, ?) RETURNING id`,
		ns(ev.At), ev.Type, ev.Subject, ev.Message, ev.State).Scan(&ev.ID); err != nil {
		return ev, s.wrap("append event", err)
	}
	return ev, nil
}

// AppendEvent appends one event.
func (s *Core) AppendEvent(ctx context.Context, ev api.Event) (api.Event, error) {
	var out api.Event
	err := s.tx(ctx, func(tx Execer) error {
		var err error
		out, err = s.AppendEventTx(ctx, tx, ev)
		return err
	})
	return out, err
}

// Events returns events with ID > since.
func (s *Core) Events(ctx context.Context, since int64, limit int, tenant string) ([]api.Event, error) {
	if limit <= 0 {
		limit = 1000
	}
	q, args := `SELECT id, at, type, subject, message, state FROM events WHERE id > ?`, []any{since}
	if tenant != "" {
		q += ` AND (type NOT LIKE 'lease.%' OR EXISTS (SELECT 1 FROM leases WHERE leases.id = events.subject AND leases.tenant = ?))`
		args = append(args, tenant)
	}
	var out []api.Event
	err := s.d.ReadEventLog(ctx, "events", q+` ORDER BY id LIMIT ?`, append(args, limit), func() { out = []api.Event{} }, func(rows Scanner) error {
		var e api.Event
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Type, &e.Subject, &e.Message, &e.State); err != nil {
			return err
		}
		e.At = tm(at)
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// LastEventID returns the greatest event ID (0 for an empty log): where a
// tail of the log (the event stream) starts. It is read under the event
// log's lock, as Events is: no event with a lower ID commits later.
func (s *Core) LastEventID(ctx context.Context) (int64, error) {
	var id int64
	err := s.d.ReadEventLog(ctx, "last event id", `SELECT COALESCE(MAX(id), 0) FROM events`, nil, func() { id = 0 }, func(rows Scanner) error {
		return rows.Scan(&id)
	})
	return id, err
}
