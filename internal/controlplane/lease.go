package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/lifecycle"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// This file holds what a tenant does with a lease after creating it:
// read, renew, release. Each change is a step of the lease state machine
// (lifecycle.Step), performed by apply.

// getLease returns a lease p may see.
func (s *Server) getLease(ctx context.Context, p principal, id string) (api.Lease, error) {
	l, err := s.st.Lease(ctx, id)
	if err != nil {
		return l, err
	}
	if !p.canSee(l) {
		// Do not reveal other tenants' lease IDs.
		return api.Lease{}, fmt.Errorf("%w: lease %s not found", ErrNotFound, id)
	}
	return l, nil
}

// releaseLease ends a lease: releasing → lenders tear down → released.
// Releasing a released lease returns it unchanged.
func (s *Server) releaseLease(ctx context.Context, p principal, id string) (api.Lease, error) {
	// The usual case, a reserved or active lease of the caller's, needs no
	// read first: the state machine plans the write blind, and its
	// compare-and-set checks state and tenant. Anything else takes the slow
	// path below, which reads the lease and words the answer.
	if p.role == roleTenant {
		tenant := p.tenant
		if p.admin {
			tenant = ""
		}
		l, _, err := s.apply(ctx, api.Lease{ID: id}, lifecycle.Release{By: p.tenant, Tenant: tenant})
		if err == nil {
			return s.finishRelease(ctx, l)
		}
		if !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) {
			return l, err
		}
	}
	l, err := s.getLease(ctx, p, id)
	if err != nil {
		return l, err
	}
	l, _, err = s.apply(ctx, l, lifecycle.Release{By: p.tenant})
	if err != nil {
		return l, s.conflictState(ctx, id, refused(err))
	}
	if l.State != api.LeaseReleasing {
		return l, nil // released already
	}
	return s.finishRelease(ctx, l)
}

// finishRelease records a releasing lease released: its lenders were
// told to tear it down.
func (s *Server) finishRelease(ctx context.Context, l api.Lease) (api.Lease, error) {
	out, _, err := s.apply(ctx, l, lifecycle.TornDown{})
	if err != nil {
		return out, s.conflictState(ctx, l.ID, refused(err))
	}
	return out, nil
}

// renewLease extends a reserved or active lease's TTL from now.
func (s *Server) renewLease(ctx context.Context, p principal, id string, ttlSeconds int64) (api.Lease, error) {
	l, err := s.getLease(ctx, p, id)
	if err != nil {
		return l, err
	}
	if ttlSeconds < 0 || ttlSeconds > int64(s.cfg.MaxTTL/time.Second) {
		return l, fmt.Errorf("%w: ttl_seconds must be between 0 and %d", ErrInvalid, int64(s.cfg.MaxTTL/time.Second))
	}
	out, _, err := s.apply(ctx, l, lifecycle.Renew{TTLSeconds: ttlSeconds})
	if err != nil {
		return out, s.conflictState(ctx, id, refused(err))
	}
	return out, nil
}

// conflictState words a lost compare-and-set.
func (s *Server) conflictState(ctx context.Context, id string, err error) error {
	if !errors.Is(err, store.ErrConflict) {
		return err
	}
	if cur, gerr := s.st.Lease(ctx, id); gerr == nil {
		return fmt.Errorf("%w: lease %s is %s", ErrConflict, id, cur.State)
	}
	return fmt.Errorf("%w: lease %s changed concurrently", ErrConflict, id)
}

// refused words a refusal of the lease state machine as the API's
// conflict; other errors pass.
func refused(err error) error {
	var r *lifecycle.Refusal
	if errors.As(err, &r) {
		return fmt.Errorf("%w: %s", ErrConflict, r.Why)
	}
	return err
}
