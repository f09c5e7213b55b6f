package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The placement leader's address. The elected replica (Campaign) runs the
// reservation pipeline for every replica: the others forward the writes
// that must be serialized to it (internal/controlplane, forward.go). It
// records its API address in rialto_leader with the backend PID of the
// session that holds the leader lock; LeaderURL returns the address only
// while that very session still holds the lock, so a dead leader's
// address is never handed out, even before the next leader overwrites
// the row.
//
// The table is created by the first leader that advertises (CREATE TABLE
// IF NOT EXISTS, under the leader lock, so never concurrently) rather
// than by a migration: it holds no data worth keeping, and a database
// without it (an older leader) reads as "no leader known".

const leaderTable = `CREATE TABLE IF NOT EXISTS rialto_leader (
	id    integer PRIMARY KEY CHECK (id = 1),
	url   text NOT NULL,
	pid   integer NOT NULL,
	since timestamptz NOT NULL DEFAULT now()
)`

// advertise records url as the leader's address, on the leader lock's
// session conn.
func advertise(ctx context.Context, conn *pgx.Conn, url string) error {
	if _, err := conn.Exec(ctx, leaderTable); err != nil {
		return fmt.Errorf("postgres: leader address: %w", err)
	}
	_, err := conn.Exec(ctx, `INSERT INTO rialto_leader (id, url, pid) VALUES (1, $1, pg_backend_pid())
		ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, pid = EXCLUDED.pid, since = now()`, url)
	if err != nil {
		return fmt.Errorf("postgres: leader address: %w", err)
	}
	return nil
}

// LeaderURL returns the API address the elected replica advertised, or
// "" when no replica leads, or the leader advertised none.
func (s *Store) LeaderURL(ctx context.Context) (string, error) {
	var url string
	err := s.rd().QueryRowContext(ctx, `SELECT r.url FROM rialto_leader r
		WHERE r.id = 1 AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.pid = r.pid
			AND l.classid = ? AND l.objid = ? AND l.objsubid = 2 AND l.granted)`, lockClass, lockLeader).Scan(&url)
	var pe *pgconn.PgError
	switch {
	case err == nil:
		return url, nil
	case errors.Is(err, sql.ErrNoRows):
		return "", nil
	case errors.As(err, &pe) && pe.Code == "42P01": // undefined_table: nobody advertised yet
		return "", nil
	}
	return "", wrap("leader address", err)
}
