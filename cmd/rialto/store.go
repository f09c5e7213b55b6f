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

// dbName is db fit for logs and messages: a URL without its password.
func dbName(db string) string {
	if !isPostgresURL(db) {
		return db
	}
	u, err := url.Parse(db)
	if err != nil {
		return "postgres://(unparsable URL)"
	}
	return u.Redacted()
}
