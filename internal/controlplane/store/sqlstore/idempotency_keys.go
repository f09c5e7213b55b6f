package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// checkIdempotencyKey refuses a key its tenant already used
// (store.ErrDuplicate); it writes nothing.
func (s *Core) checkIdempotencyKey(ctx context.Context, tx Execer, idem store.Idempotency) error {
	var leaseID string
	err := tx.QueryRowContext(ctx, `SELECT lease_id FROM idempotency_keys WHERE tenant = ? AND key = ?`, idem.Tenant, idem.Key).Scan(&leaseID)
	if err == nil {
		return fmt.Errorf("key used by lease %s: %w", leaseID, store.ErrDuplicate)
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return s.wrap("idempotency", err)
	}
	return nil
}

// putIdempotencyKey records the lease a key created.
func (s *Core) putIdempotencyKey(ctx context.Context, tx Execer, idem store.Idempotency, leaseID string, at time.Time) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO idempotency_keys (tenant, key, request_hash, lease_id, created_at) VALUES (?, ?, ?, ?, ?)`,
		idem.Tenant, idem.Key, idem.RequestHash, leaseID, ns(at)); err != nil {
		if s.d.UniqueViolation(err) {
			return fmt.Errorf("key used by a concurrent request: %w", store.ErrDuplicate)
		}
		return s.wrap("idempotency", err)
	}
	return nil
}

// LeaseByIdempotencyKey returns the lease recorded for (tenant, key).
func (s *Core) LeaseByIdempotencyKey(ctx context.Context, tenant, key string) (api.Lease, string, error) {
	var leaseID, hash string
	err := s.rd().QueryRowContext(ctx, `SELECT lease_id, request_hash FROM idempotency_keys WHERE tenant = ? AND key = ?`, tenant, key).Scan(&leaseID, &hash)
	if errors.Is(err, sql.ErrNoRows) {
		return api.Lease{}, "", fmt.Errorf("idempotency key: %w", store.ErrNotFound)
	}
	if err != nil {
		return api.Lease{}, "", s.wrap("idempotency", err)
	}
	l, err := s.GetLease(ctx, s.rd(), leaseID)
	return l, hash, err
}
