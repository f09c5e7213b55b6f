package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/rialto-project/rialto/api"
)

// appendEvents appends events in one statement that first takes the
// event log's lock in shared mode (see doc.go: no reader skips an event
// committed late); the rows get their IDs in the order given.
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
	if _, err := q.ExecContext(ctx, `WITH lk AS (SELECT pg_advisory_xact_lock_shared(?, ?))
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

// readEventLog runs the statement q (args) in a transaction that first
// takes the event log's lock in exclusive mode, and passes its rows to
// each; the transaction is one round trip (a batch). The lock is granted
// once no writer holds it (writers take it in shared mode before they
// append, and keep it until they commit or roll back), and writers that
// come later wait for the read: q's snapshot, taken after the grant (READ
// COMMITTED: one per statement), holds every event whose ID is lower than
// one it sees (a sequence hands out IDs in increasing order, so a lower ID
// was handed out earlier, to a writer that had finished when the lock was
// granted). A follower that reads "ID > last seen" thus never skips an
// event committed late. A read that PostgreSQL picked as a deadlock's
// victim (a writer waiting behind it may hold a row another writer
// holding the lock waits for) runs again, after start; start also runs
// before the first.
func (s *Store) readEventLog(ctx context.Context, what, q string, args []any, start func(), each func(pgx.Rows) error) error {
	var err error
	for attempt := 0; attempt < maxTxAttempts; attempt++ {
		start()
		if err = s.readEventLog1(ctx, what, q, args, each); !retryable(err) {
			return err
		}
	}
	return err
}

func (s *Store) readEventLog1(ctx context.Context, what, q string, args []any, each func(pgx.Rows) error) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return wrap(what, err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		c := dc.(*stdlib.Conn).Conn()
		err := readEventLogOn(ctx, c, q, args, each)
		if err != nil && c.PgConn().TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_, rerr := c.Exec(rctx, "ROLLBACK")
			cancel()
			if rerr != nil {
				c.PgConn().Close(rctx) // the pool drops it (IsClosed)
			}
		}
		return err
	})
	if err != nil {
		return wrap(what, err)
	}
	return nil
}

func readEventLogOn(ctx context.Context, c *pgx.Conn, q string, args []any, each func(pgx.Rows) error) error {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(`SELECT pg_advisory_xact_lock($1, $2)`, lockClass, lockEvents)
	b.Queue(rebind(q), args...)
	b.Queue("COMMIT")
	br := c.SendBatch(ctx, b)
	defer br.Close()
	for range 2 { // BEGIN, the lock
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	for rows.Next() {
		if err := each(rows); err != nil {
			rows.Close()
			return err
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if _, err := br.Exec(); err != nil { // COMMIT
		return err
	}
	return br.Close()
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
	var out []api.Event
	err := s.readEventLog(ctx, "events", q+` ORDER BY id LIMIT ?`, append(args, limit), func() { out = []api.Event{} }, func(rows pgx.Rows) error {
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
func (s *Store) LastEventID(ctx context.Context) (int64, error) {
	var id int64
	err := s.readEventLog(ctx, "last event id", `SELECT COALESCE(MAX(id), 0) FROM events`, nil, func() { id = 0 }, func(rows pgx.Rows) error {
		return rows.Scan(&id)
	})
	return id, err
}
