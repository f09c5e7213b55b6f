package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// PutToken stores or replaces a token.
func (s *Store) PutToken(ctx context.Context, t store.Token) error {
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now()
	}
	return s.tx(ctx, func(tx execer) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO tokens (hash, kind, tenant, admin, created_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (hash) DO UPDATE SET kind = excluded.kind, tenant = excluded.tenant, admin = excluded.admin`,
			t.Hash, t.Kind, t.Tenant, t.Admin, ns(t.CreatedAt))
		if err != nil {
			return wrap("put token", err)
		}
		return nil
	})
}

// LookupToken finds a token by hash.
func (s *Store) LookupToken(ctx context.Context, hash string) (store.Token, error) {
	var t store.Token
	var created int64
	err := s.rd().QueryRowContext(ctx, `SELECT hash, kind, tenant, admin, created_at FROM tokens WHERE hash = ?`, hash).
		Scan(&t.Hash, &t.Kind, &t.Tenant, &t.Admin, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("token: %w", store.ErrNotFound)
	}
	if err != nil {
		return t, wrap("token", err)
	}
	t.CreatedAt = tm(created)
	return t, nil
}
