package sqlite

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

// AppendEvents appends events with as few statements as it can: rows are
// inserted in chunks of a power of two (at most maxEventRows), so that a
// handful of prepared statements serve every batch size.
func (d dialect) AppendEvents(ctx context.Context, q execer, evs []api.Event) error {
	s := d.s
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
			return fmt.Errorf("sqlite: append events: %w", err)
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

// ReadEventLog runs q on the read side: the single writer commits
// events in ID order, so a reader never sees a later ID before an earlier
// one.
func (d dialect) ReadEventLog(ctx context.Context, what, q string, args []any, start func(), each func(sqlstore.Scanner) error) error {
	start()
	rows, err := d.s.rd().QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("sqlite: %s: %w", what, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return fmt.Errorf("sqlite: %s: %w", what, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sqlite: %s: %w", what, err)
	}
	return nil
}
