package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
	"github.com/rialto-project/rialto/internal/filelock"
)

// isPostgresURL reports whether --db names a PostgreSQL database.
func isPostgresURL(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://")
}

// openStore opens the SQLite file or the PostgreSQL database db names.
func openStore(ctx context.Context, db string) (store.Store, error) {
	if isPostgresURL(db) {
		st, err := postgres.Open(ctx, db, postgres.Options{})
		if err != nil {
			return nil, fmt.Errorf("open database %s: %w", dbName(db), err)
		}
		return st, nil
	}
	st, err := sqlite.Open(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", db, err)
	}
	return st, nil
}

// lockSQLite takes the lock that makes this process the only server of
// the SQLite database db (nil for PostgreSQL): a second `rialto server`
// on the file would keep its own view of the leases and lend the ranges
// the first lends. The lock is the file db.lock; the kernel drops it when
// the process ends, however it ends.
func lockSQLite(db string) (*os.File, error) {
	if isPostgresURL(db) || db == ":memory:" {
		return nil, nil
	}
	f, err := filelock.Open(db + ".lock")
	var held *filelock.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("database %s is served by another rialto server%s: a SQLite database has one server; replicas share a PostgreSQL database (--db postgres://…, docs/operations.md)", db, filelock.HolderNote(held.PID))
	}
	if err != nil {
		return nil, fmt.Errorf("lock database %s: %w", db, err)
	}
	return f, nil
}

// closeLock releases a lock lockSQLite took (nil: none), though a child
// process forked meanwhile shares it (filelock.Close): a server started
// right after in this process (a restart) takes it.
func closeLock(f *os.File) {
	_ = filelock.Close(f)
}

// dbName is db fit for logs and messages: a URL without its password
// (the user's, or a password or sslpassword parameter).
func dbName(db string) string {
	if !isPostgresURL(db) {
		return db
	}
	u, err := url.Parse(db)
	if err != nil {
		return "postgres://(unparsable URL)"
	}
	if q := u.Query(); dbQueryPassword(q) {
		for _, k := range dbPasswordParams {
			if q.Has(k) {
				q.Set(k, "xxxxx")
			}
		}
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// dbPasswordParams are the PostgreSQL URL parameters that carry a secret.
var dbPasswordParams = []string{"password", "sslpassword"}

func dbQueryPassword(q url.Values) bool {
	for _, k := range dbPasswordParams {
		if q.Has(k) {
			return true
		}
	}
	return false
}

// dbHasPassword reports whether a PostgreSQL URL carries a password.
func dbHasPassword(db string) bool {
	if !isPostgresURL(db) {
		return false
	}
	u, err := url.Parse(db)
	if err != nil {
		return strings.Contains(db, "@") || strings.Contains(db, "password")
	}
	if _, ok := u.User.Password(); ok {
		return true
	}
	return dbQueryPassword(u.Query())
}
