package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// PutToken stores or replaces a token.
func (s *Core) PutToken(ctx context.Context, t store.Token) error {
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now()
	}
	return s.tx(ctx, func(tx Execer) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO tokens (hash, kind, tenant, admin, created_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (hash) DO UPDATE SET kind = excluded.kind, tenant = excluded.tenant, admin = excluded.admin`,
			t.Hash, t.Kind, t.Tenant, t.Admin, ns(t.CreatedAt))
		if err != nil {
			return s.wrap("put token", err)
		}
		return nil
	})
}

// LookupToken finds a token by hash.
func (s *Core) LookupToken(ctx context.Context, hash string) (store.Token, error) {
	var t store.Token
	var created int64
	err := s.rd().QueryRowContext(ctx, `SELECT hash, kind, tenant, admin, created_at FROM tokens WHERE hash = ?`, hash).
		Scan(&t.Hash, &t.Kind, &t.Tenant, &t.Admin, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("token: %w", store.ErrNotFound)
	}
	if err != nil {
		return t, s.wrap("token", err)
	}
	t.CreatedAt = tm(created)
	return t, nil
}

// ReplaceTokens makes ts the whole set of tokens, in one transaction: a
// token not in ts stops working; one already stored keeps its creation
// time. Replicas share the table: they must be configured alike.
func (s *Core) ReplaceTokens(ctx context.Context, ts []store.Token) error {
	keep := make([]any, len(ts))
	for i, t := range ts {
		keep[i] = t.Hash
	}
	del := `DELETE FROM tokens`
	if len(keep) > 0 {
		del += ` WHERE hash NOT IN (` + Placeholders(len(keep)) + `)`
	}
	return s.tx(ctx, func(tx Execer) error {
		if _, err := tx.ExecContext(ctx, del, keep...); err != nil {
			return s.wrap("replace tokens", err)
		}
		for _, t := range ts {
			if t.CreatedAt.IsZero() {
				t.CreatedAt = time.Now()
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO tokens (hash, kind, tenant, admin, created_at) VALUES (?, ?, ?, ?, ?)
				ON CONFLICT (hash) DO UPDATE SET kind = excluded.kind, tenant = excluded.tenant, admin = excluded.admin`,
				t.Hash, t.Kind, t.Tenant, t.Admin, ns(t.CreatedAt)); err != nil {
				return s.wrap("replace tokens", err)
			}
		}
		return nil
	})
}
