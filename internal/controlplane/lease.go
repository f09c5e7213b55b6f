package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// Releasing a released (or releasing) lease returns it unchanged.
//
// Releases of one lease are idempotent under concurrency: a release that
// finds another one of the same lease under way on this replica waits for
// it to end (within ctx) and then answers the lease as that release left
// it, so the lenders are told to tear the lease down (and wipe its block
// ranges) once, and every caller gets the released lease. A release that
// loses the compare-and-set to another replica's re-reads the lease and
// returns it when it is releasing or released.
func (s *Server) releaseLease(ctx context.Context, p principal, id string) (api.Lease, error) {
	done, err := s.releases.begin(ctx, id)
	if err != nil {
		return api.Lease{}, err
	}
	defer done()
	return s.releaseOnce(ctx, p, id)
}

// releaseOnce is releaseLease, the one release of lease id under way here.
func (s *Server) releaseOnce(ctx context.Context, p principal, id string) (api.Lease, error) {
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
		if cur, ok := s.releasedMeanwhile(ctx, id, err); ok {
			return cur, nil
		}
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
		if cur, ok := s.releasedMeanwhile(ctx, l.ID, err); ok {
			return cur, nil
		}
		return out, s.conflictState(ctx, l.ID, refused(err))
	}
	return out, nil
}

// releasedMeanwhile reports whether a release that lost its
// compare-and-set (err) lost it to another release: the lease, re-read,
// is releasing or released. Its caller, which may see the lease, then
// answers that lease, as a release of a released lease does.
func (s *Server) releasedMeanwhile(ctx context.Context, id string, err error) (api.Lease, bool) {
	if !errors.Is(err, store.ErrConflict) {
		return api.Lease{}, false
	}
	cur, gerr := s.st.Lease(ctx, id)
	if gerr != nil || (cur.State != api.LeaseReleasing && cur.State != api.LeaseReleased) {
		return api.Lease{}, false
	}
	return cur, true
}

// releaseFlights are the releases under way on this replica, by lease ID.
type releaseFlights struct {
	mu sync.Mutex
	m  map[string]chan struct{} // closed when the release ends
}

// begin waits (within ctx) until no other release of lease id is under
// way here, and makes the caller's the one: done ends it.
func (f *releaseFlights) begin(ctx context.Context, id string) (done func(), err error) {
	for {
		f.mu.Lock()
		ch, busy := f.m[id]
		if !busy {
			if f.m == nil {
				f.m = map[string]chan struct{}{}
			}
			ch = make(chan struct{})
			f.m[id] = ch
			f.mu.Unlock()
			return func() {
				f.mu.Lock()
				delete(f.m, id)
				f.mu.Unlock()
				close(ch)
			}, nil
		}
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: another release of lease %s is under way: %w", ErrUnavailable, id, ctx.Err())
		}
	}
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
