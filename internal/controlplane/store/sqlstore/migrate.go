package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

// Migration is one schema change, the file NNNN_what.sql of a store's
// migrations: version NNNN.
type Migration struct {
	Version int
	Name    string // the file's name
	SQL     string
}

// ReadMigrations reads the migrations of dir in fsys, in version order;
// versions must be 1, 2, 3, ... without gaps.
func ReadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	ents, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	var ms []Migration
	for _, e := range ents {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("migration %q: name must be NNNN_what.sql", e.Name())
		}
		b, err := fs.ReadFile(fsys, dir+"/"+e.Name())
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", e.Name(), err)
		}
		ms = append(ms, Migration{v, e.Name(), string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %s: versions must be 1, 2, 3, ... without gaps", m.Name)
		}
	}
	return ms, nil
}

// MigrationDB is where migrations run: a *sql.DB, or a *sql.Conn that
// holds a lock.
type MigrationDB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Migrate is the runner of both stores' migrations. (A library such as
// goose would keep its own version table: the databases deployed record
// theirs in schema_version, which it would first have to take over, for
// a runner of fifty lines.)
//
// Migrate applies the migrations of ms that db's schema_version table
// does not list, up to version max (-1: all), each in its own transaction
// that also records it. A database whose version is newer than ms is
// refused, untouched. Each transaction reads the applied versions again
// before it changes anything: another process may have migrated the
// database meanwhile (two SQLite processes opening one file at once; a
// PostgreSQL store holds an advisory lock as well), and a migration it
// applied is not applied again. appliedAt is the SQL type of the table's
// time column; insert records a migration (its version and name, in the
// dialect's placeholders). Errors are wrapped by wrap, but for the
// refusal, which names the store (who).
func Migrate(ctx context.Context, db MigrationDB, ms []Migration, max int, appliedAt, insert, who string, wrap func(string, error) error) error {
	// In a transaction: on SQLite it takes the write lock (BEGIN
	// IMMEDIATE), so that a concurrent opener waits for it rather than
	// failing to upgrade a read to a write.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return wrap("schema_version", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at `+appliedAt+` NOT NULL DEFAULT CURRENT_TIMESTAMP)`); err != nil {
		tx.Rollback()
		return wrap("schema_version", err)
	}
	cur, err := schemaVersion(ctx, tx, ms, who, wrap)
	if err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return wrap("schema_version", err)
	}
	for _, m := range ms {
		if m.Version <= cur || (max >= 0 && m.Version > max) {
			continue
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return wrap("migration "+m.Name, err)
		}
		if cur, err = schemaVersion(ctx, tx, ms, who, wrap); err != nil {
			tx.Rollback()
			return err
		}
		if m.Version <= cur {
			tx.Rollback() // applied by another process meanwhile
			continue
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			tx.Rollback()
			return wrap("migration "+m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, insert, m.Version, m.Name); err != nil {
			tx.Rollback()
			return wrap("migration "+m.Name, err)
		}
		if err := tx.Commit(); err != nil {
			return wrap("migration "+m.Name, err)
		}
	}
	return nil
}

// schemaVersion reads the highest applied migration in tx, and refuses a
// database newer than ms.
func schemaVersion(ctx context.Context, tx *sql.Tx, ms []Migration, who string, wrap func(string, error) error) (int, error) {
	var cur sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_version`).Scan(&cur); err != nil {
		return 0, wrap("schema version", err)
	}
	if int(cur.Int64) > len(ms) {
		return 0, fmt.Errorf("%s: database schema version %d is newer than this binary (%d)", who, cur.Int64, len(ms))
	}
	return int(cur.Int64), nil
}
