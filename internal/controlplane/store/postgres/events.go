package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

// AppendEvents appends events in one statement that first takes the
// event log's lock in shared mode (see doc.go: no reader skips an event
// committed late); the rows get their IDs in the order given.
func (d dialect) AppendEvents(ctx context.Context, q sqlstore.Execer, evs []api.Event) error {
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

// LockEventLog takes the event log's lock in shared mode, for the rest
// of the transaction: a writer appends its events under it, and writers
// do not wait for one another; a reader of the log takes it in exclusive
// mode (ReadEventLog), which waits for every writer that may hold an
// event ID it cannot see yet (see doc.go).
func (dialect) LockEventLog(ctx context.Context, tx sqlstore.Execer) error {
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock_shared(?, ?)`, lockClass, lockEvents); err != nil {
		return wrap("lock the event log", err)
	}
	return nil
}

// ReadEventLog runs the statement q (args) in a transaction that first
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
func (d dialect) ReadEventLog(ctx context.Context, what, q string, args []any, start func(), each func(sqlstore.Scanner) error) error {
	s := d.s
	var err error
	for attempt := 0; attempt < maxTxAttempts; attempt++ {
		start()
		if err = s.readEventLog1(ctx, what, q, args, each); !retryable(err) {
			return err
		}
	}
	return err
}

func (s *Store) readEventLog1(ctx context.Context, what, q string, args []any, each func(sqlstore.Scanner) error) error {
	return s.onConn(ctx, what, func(c *pgx.Conn) error {
		if err := readEventLogOn(ctx, c, q, args, each); err != nil {
			return wrap(what, err)
		}
		return nil
	})
}

func readEventLogOn(ctx context.Context, c *pgx.Conn, q string, args []any, each func(sqlstore.Scanner) error) error {
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
