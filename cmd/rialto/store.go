package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
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
