package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Store is a store.Store on a PostgreSQL database.
type Store struct {
	sqlstore.Core // the statements shared with the SQLite store

	db         *sql.DB
	url        string
	sequential bool // Options.sequential
	twoTrips   bool // Options.twoTrips
}

var (
	_ store.Store        = (*Store)(nil)
	_ store.LeaseBatcher = (*Store)(nil)
	_ store.Leader       = (*Store)(nil)
	_ store.Pinger       = (*Store)(nil)
)

// Advisory lock keys (the first of pg_advisory_lock's two int4 keys
// names the use; see doc.go).
const (
	lockClass    = 0x52_69_61 // "Ria"
	lockEvents   = 1
	lockLeader   = 2
	lockMigrate  = 3
	lockTenantNS = 0x52_69_62 // the class of tenant locks; the second key is hashtext(tenant)
)

// Options tune a Store.
type Options struct {
	// MaxConns bounds the connection pool (default 32).
	MaxConns int

	// sequential writes every lease batch statement by statement (the
	// path of a batch the pipeline cannot write), for tests.
	sequential bool
	// twoTrips judges every batch's creations in a first round trip
	// (the path of a batch whose creation was refused), for tests.
	twoTrips bool
}

// Open connects to the database at url (postgres://…), applies pending
// migrations and returns the store.
func Open(ctx context.Context, url string, o Options) (*Store, error) {
	cfg, err := pgxConfig(url)
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*cfg)
	if o.MaxConns <= 0 {
		o.MaxConns = 32
	}
	db.SetMaxOpenConns(o.MaxConns)
	db.SetMaxIdleConns(o.MaxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	s := &Store{db: db, url: url, sequential: o.sequential, twoTrips: o.twoTrips}
	s.Init(dialect{s})
	if err := s.migrate(ctx, -1); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the connection pool.
func (s *Store) Close() error { return s.db.Close() }

// Ping reports whether the database answers.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.db.QueryRowContext(ctx, `SELECT 1`).Scan(&one); err != nil {
		return wrap("ping", err)
	}
	return nil
}

// unavailable reports whether err says the database could not be
// reached or dropped the connection (rather than refusing the statement).
func unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 08: connection exception; 57P01-57P03: admin shutdown,
		// crash shutdown, cannot connect now; 53: insufficient resources.
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03" || strings.HasPrefix(pe.Code, "53")
	}
	var ne net.Error
	var ce *pgconn.ConnectError
	return errors.As(err, &ne) || errors.As(err, &ce) || errors.Is(err, sql.ErrConnDone) || errors.Is(err, sql.ErrTxDone) ||
		errors.Is(err, driver.ErrBadConn) || pgconn.SafeToRetry(err) || strings.Contains(err.Error(), "conn closed") ||
		strings.Contains(err.Error(), "unexpected EOF") || strings.Contains(err.Error(), "connection reset")
}

// retryable reports a serialization failure or a deadlock: the
// transaction was rolled back and may run again.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// corruptAdvice is what to do about err if it is PostgreSQL's report of
// damaged data (SQLSTATE XX001 data_corrupted: a table's page; XX002
// index_corrupted: an index's), "" for any other err.
func corruptAdvice(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return ""
	}
	switch pe.Code {
	case "XX001":
		return `stop every replica and restore the database from a backup (docs/operations.md, "Backups and restore")`
	case "XX002":
		return `rebuild the index PostgreSQL names (REINDEX INDEX name), or stop every replica and restore the database from a backup (docs/operations.md, "Backups and restore")`
	}
	return ""
}

// wrap wraps a database error: store.ErrUnavailable when the database
// could not be reached, store.ErrCorrupt (with what to do) when it
// reports damaged data.
func wrap(what string, err error) error {
	if unavailable(err) {
		return fmt.Errorf("postgres: %s: %w: %w", what, store.ErrUnavailable, err)
	}
	if advice := corruptAdvice(err); advice != "" && !errors.Is(err, store.ErrCorrupt) {
		return fmt.Errorf("postgres: %s: %w: %w; %s", what, store.ErrCorrupt, err, advice)
	}
	return fmt.Errorf("postgres: %s: %w", what, err)
}

// execer runs statements written with SQLite's "?" placeholders: a
// transaction or the pool (rebound turns them into PostgreSQL's "$n").
type execer = sqlstore.Execer

type rebound struct {
	q interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
		QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	}
}

func (r rebound) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return r.q.ExecContext(ctx, rebind(q), args...)
}

func (r rebound) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return r.q.QueryContext(ctx, rebind(q), args...)
}

func (r rebound) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return r.q.QueryRowContext(ctx, rebind(q), args...)
}

var rebinds sync.Map // query → rebound query

// rebind replaces each "?" of q (none appears inside a literal in this
// package's statements) with "$1", "$2", ...
func rebind(q string) string {
	if v, ok := rebinds.Load(q); ok {
		return v.(string)
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	out := b.String()
	if len(q) < 4096 {
		rebinds.Store(q, out)
	}
	return out
}

// rd is the read side.
func (s *Store) rd() execer { return rebound{s.db} }

// maxTxAttempts bounds the re-runs of a transaction that PostgreSQL
// rolled back for a deadlock or a serialization failure.
const maxTxAttempts = 8

// tx runs f in a write transaction, again if PostgreSQL rolled it back
// for a deadlock or a serialization failure.
func (s *Store) tx(ctx context.Context, f func(tx execer) error) error {
	var err error
	for attempt := 0; attempt < maxTxAttempts; attempt++ {
		if err = s.tx1(ctx, f); !retryable(err) {
			return err
		}
	}
	return err
}

func (s *Store) tx1(ctx context.Context, f func(tx execer) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return wrap("begin", err)
	}
	if err := f(rebound{tx}); err != nil {
		tx.Rollback()
		if retryable(err) || unavailable(err) && !errors.Is(err, store.ErrUnavailable) ||
			corruptAdvice(err) != "" && !errors.Is(err, store.ErrCorrupt) {
			return wrap("transaction", err)
		}
		return err
	}
	if err := tx.Commit(); err != nil {
		return wrap("commit", err)
	}
	return nil
}

func migrations() ([]sqlstore.Migration, error) {
	ms, err := sqlstore.ReadMigrations(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return ms, nil
}

// MigrationNames returns the migrations' file names, in order.
func MigrationNames() ([]string, error) {
	ms, err := migrations()
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out, err
}

// SchemaVersion returns the highest applied migration.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_version`).Scan(&v); err != nil {
		return 0, wrap("schema version", err)
	}
	return int(v.Int64), nil
}

// migrate applies the pending migrations up to version max (-1: all),
// each in its own transaction, under an advisory lock: replicas starting
// together migrate once.
func (s *Store) migrate(ctx context.Context, max int) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return wrap("migrate", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1, $2)`, lockClass, lockMigrate); err != nil {
		return wrap("migrate", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, $2)`, lockClass, lockMigrate)
	return sqlstore.Migrate(ctx, conn, ms, max, "TIMESTAMPTZ", `INSERT INTO schema_version (version, name) VALUES ($1, $2)`, "postgres", wrap)
}
