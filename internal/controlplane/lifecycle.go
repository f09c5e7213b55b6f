package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// teardownParts asks each lender of l (once per node) to stop serving it,
// in parallel, each within PrepareTimeout. Failures are logged: a lender
// that missed it is told again by its next heartbeat response.
func (s *Server) teardownParts(ctx context.Context, l api.Lease, skipNodes ...string) {
	seen := map[string]bool{}
	for _, n := range skipNodes {
		seen[n] = true
	}
	var lenders []store.NodeRecord
	for _, p := range l.Parts {
		if seen[p.NodeID] {
			continue
		}
		seen[p.NodeID] = true
		n, err := s.nodeRecord(ctx, p.NodeID)
		if err != nil {
			s.log.Warn("teardown: node", "lease", l.ID, "node", p.NodeID, "err", err)
			continue
		}
		if n.State == api.NodeDown {
			continue
		}
		lenders = append(lenders, n)
	}
	teardown := func(n store.NodeRecord) {
		tctx, cancel := context.WithTimeout(ctx, s.cfg.PrepareTimeout)
		defer cancel()
		start := time.Now()
		err := s.lender.Teardown(tctx, n.Node, n.AgentKey, l.ID)
		s.m.lenderLatency.With("teardown").Observe(time.Since(start).Seconds())
		if err != nil {
			s.log.Warn("teardown failed; the lender's heartbeat will reconcile", "lease", l.ID, "node", n.ID, "err", err)
		}
	}
	if len(lenders) == 1 {
		teardown(lenders[0]) // the usual case needs no goroutine
		return
	}
	var wg sync.WaitGroup
	for _, n := range lenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			teardown(n)
		}()
	}
	wg.Wait()
}

// getLease returns a lease p may see.
func (s *Server) getLease(ctx context.Context, p principal, id string) (api.Lease, error) {
	l, err := s.st.Lease(ctx, id)
	if err != nil {
		return l, err
	}
	if !p.canSee(l) {
		// Do not reveal other tenants' lease IDs.
		return api.Lease{}, fmt.Errorf("%w: lease %s", ErrNotFound, id)
	}
	return l, nil
}

// releaseLease ends a lease: releasing → lenders tear down → released.
// Releasing a released lease returns it unchanged.
func (s *Server) releaseLease(ctx context.Context, p principal, id string) (api.Lease, error) {
	// The usual case, a reserved or active lease of the caller's, needs no
	// read first: the compare-and-set checks state and tenant. Anything
	// else takes the slow path below, which words the answer.
	if p.role == roleTenant {
		tenant := p.tenant
		if p.admin {
			tenant = ""
		}
		l, err := s.transition(ctx, id, api.LeaseReleasing, store.LeaseChange{Tenant: tenant}, "released by tenant "+p.tenant, api.LeaseReserved, api.LeaseActive)
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
	switch l.State {
	case api.LeaseReleased:
		return l, nil
	case api.LeaseFailed, api.LeaseLost, api.LeaseExpired:
		return l, fmt.Errorf("%w: lease %s is already %s (%s)", ErrConflict, id, l.State, l.Reason)
	}
	if l.State != api.LeaseReleasing {
		l, err = s.transition(ctx, id, api.LeaseReleasing, store.LeaseChange{}, "released by tenant "+p.tenant)
		if err != nil {
			return l, s.conflictState(ctx, id, err)
		}
	}
	return s.finishRelease(ctx, l)
}

// finishRelease tears a releasing lease's exports down and records it
// released.
func (s *Server) finishRelease(ctx context.Context, l api.Lease) (api.Lease, error) {
	s.teardownParts(ctx, l)
	out, err := s.transition(ctx, l.ID, api.LeaseReleased, store.LeaseChange{}, "lenders torn down")
	if err != nil {
		return out, s.conflictState(ctx, l.ID, err)
	}
	s.log.Info("lease released", "lease", l.ID)
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

// renewLease extends a reserved or active lease's TTL from now.
func (s *Server) renewLease(ctx context.Context, p principal, id string, ttlSeconds int64) (api.Lease, error) {
	l, err := s.getLease(ctx, p, id)
	if err != nil {
		return l, err
	}
	if ttlSeconds < 0 || ttlSeconds > int64(s.cfg.MaxTTL/time.Second) {
		return l, fmt.Errorf("%w: ttl_seconds must be between 0 and %d", ErrInvalid, int64(s.cfg.MaxTTL/time.Second))
	}
	if ttlSeconds == 0 {
		ttlSeconds = l.TTLSeconds
	}
	if l.State != api.LeaseActive && l.State != api.LeaseReserved {
		return l, fmt.Errorf("%w: lease %s is %s; only reserved or active leases renew", ErrConflict, id, l.State)
	}
	exp := s.now().Add(time.Duration(ttlSeconds) * time.Second)
	out, err := s.transition(ctx, id, l.State, store.LeaseChange{ExpiresAt: exp, TTL: ttlSeconds},
		fmt.Sprintf("renewed until %s", exp.Format(time.RFC3339)), l.State)
	if err != nil {
		return out, s.conflictState(ctx, id, err)
	}
	return out, nil
}

// Sweep runs one pass of the background duties: node liveness (ready →
// suspect → down; a down node's leases become lost), TTL expiry, and
// clean-up of reservations or releases interrupted by a restart.
func (s *Server) Sweep(ctx context.Context) error {
	now := s.now()
	nodes, err := s.st.Nodes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	changed := false
	for i := range nodes {
		n := &nodes[i]
		// A control-plane restart gives every agent a full grace period
		// again: silence while the control plane was away does not count.
		last := n.LastHeartbeat
		if last.Before(s.started) {
			last = s.started
		}
		silent := now.Sub(last)
		switch {
		case n.State != api.NodeDown && silent > s.cfg.DownAfter:
			err := s.st.SetNodeState(ctx, n.ID, n.State, api.NodeDown, api.Event{At: now, Type: "node.down", Subject: n.ID,
				Message: fmt.Sprintf("no heartbeat for %v (grace period %v)", silent.Round(time.Millisecond), s.cfg.DownAfter), State: string(api.NodeDown)})
			if err != nil {
				if !errors.Is(err, store.ErrConflict) {
					errs = append(errs, err)
				}
				continue
			}
			s.log.Warn("node down", "node", n.ID, "name", n.Name, "silent", silent)
			n.State = api.NodeDown
			changed = true
		case n.State == api.NodeReady && silent > s.cfg.SuspectAfter:
			err := s.st.SetNodeState(ctx, n.ID, n.State, api.NodeSuspect, api.Event{At: now, Type: "node.suspect", Subject: n.ID,
				Message: fmt.Sprintf("no heartbeat for %v", silent.Round(time.Millisecond)), State: string(api.NodeSuspect)})
			if err != nil && !errors.Is(err, store.ErrConflict) {
				errs = append(errs, err)
			}
			changed = true
			s.log.Info("node suspect", "node", n.ID, "name", n.Name, "silent", silent)
		}
		if n.State == api.NodeDown {
			// Its leases (also ones reserved in a race with the sweep) are lost.
			ls, err := s.st.Leases(ctx, store.LeaseFilter{NodeID: n.ID, States: []api.LeaseState{api.LeaseReserved, api.LeaseActive, api.LeaseReleasing}})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, l := range ls {
				reason := fmt.Sprintf("lender node %s (%s) is down", n.Name, n.ID)
				if _, err := s.transition(ctx, l.ID, api.LeaseLost, store.LeaseChange{Reason: reason}, ""); err != nil {
					if !errors.Is(err, store.ErrConflict) {
						errs = append(errs, err)
					}
					continue
				}
				s.log.Warn("lease lost", "lease", l.ID, "node", n.ID)
				s.teardownParts(ctx, l, n.ID) // the other lenders of a composed lease
			}
		}
	}
	s.peers.set(nodes)
	if changed {
		s.invalidate() // placement must see the new node states
	}

	// TTL expiry.
	ls, err := s.st.Leases(ctx, store.LeaseFilter{States: []api.LeaseState{api.LeaseReserved, api.LeaseActive}, ExpiresBefore: now})
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range ls {
		reason := fmt.Sprintf("TTL of %ds ran out at %s without renewal", l.TTLSeconds, l.ExpiresAt.Format(time.RFC3339))
		if _, err := s.transition(ctx, l.ID, api.LeaseExpired, store.LeaseChange{Reason: reason}, ""); err != nil {
			if !errors.Is(err, store.ErrConflict) {
				errs = append(errs, err)
			}
			continue
		}
		s.log.Info("lease expired", "lease", l.ID)
		s.teardownParts(ctx, l)
	}

	// Work interrupted by a control-plane restart: releases finish,
	// reservations that were never confirmed fail.
	stale := now.Add(-time.Duration(prepareStaleFactor) * s.cfg.PrepareTimeout)
	ls, err = s.st.Leases(ctx, store.LeaseFilter{States: []api.LeaseState{api.LeaseReleasing, api.LeaseReserved}})
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range ls {
		if !l.UpdatedAt.Before(stale) {
			continue
		}
		s.teardownParts(ctx, l)
		to, reason := api.LeaseReleased, "release completed after an interruption"
		if l.State == api.LeaseReserved {
			to, reason = api.LeaseFailed, "reservation was never confirmed (interrupted)"
		}
		if _, err := s.transition(ctx, l.ID, to, store.LeaseChange{Reason: reason}, "", l.State); err != nil && !errors.Is(err, store.ErrConflict) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
