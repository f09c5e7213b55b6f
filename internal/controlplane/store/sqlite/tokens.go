package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
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
			return fmt.Errorf("sqlite: put token: %w", err)
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
		return t, fmt.Errorf("sqlite: token: %w", err)
	}
	t.CreatedAt = tm(created)
	return t, nil
}

// ReplaceTokens makes ts the whole set of tokens, in one transaction: a
// token not in ts stops working; one already stored keeps its creation
// time.
func (s *Store) ReplaceTokens(ctx context.Context, ts []store.Token) error {
	return s.tx(ctx, func(tx execer) error {
		hashes := make([]string, len(ts))
		for i, t := range ts {
			hashes[i] = t.Hash
		}
		keep, err := json.Marshal(hashes)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM tokens WHERE hash NOT IN (SELECT value FROM json_each(?))`, string(keep)); err != nil {
			return fmt.Errorf("sqlite: replace tokens: %w", err)
		}
		for _, t := range ts {
			if t.CreatedAt.IsZero() {
				t.CreatedAt = time.Now()
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO tokens (hash, kind, tenant, admin, created_at) VALUES (?, ?, ?, ?, ?)
				ON CONFLICT (hash) DO UPDATE SET kind = excluded.kind, tenant = excluded.tenant, admin = excluded.admin`,
				t.Hash, t.Kind, t.Tenant, t.Admin, ns(t.CreatedAt)); err != nil {
				return fmt.Errorf("sqlite: replace tokens: %w", err)
			}
		}
		return nil
	})
}
