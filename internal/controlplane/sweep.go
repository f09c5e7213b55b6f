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

// prepareStaleFactor × PrepareTimeout is how long a reservation or a
// release may stand still before the sweep takes it for interrupted: a
// reservation prepares its lenders (within PrepareTimeout each) at most
// lifecycle.MaxPrepareRounds times.
const prepareStaleFactor = lifecycle.MaxPrepareRounds + 2

// Sweep runs one pass of the background duties: node liveness (ready →
// suspect → down; a down node's leases become lost), TTL expiry,
// clean-up of reservations or releases interrupted by a restart,
// history retention (retain.go), and the recording of the certificates a
// removal revoked after its commit that the store did not take then
// (retryLateRevoked). The
// leases' changes are steps of the lease state machine (NodeDown, Expire,
// Interrupted), performed by apply; a lease that moved on meanwhile is
// left alone (the machine refuses the event, or the store the write).
func (s *Server) Sweep(ctx context.Context) error {
	if err := s.recoverMoves(ctx); err != nil {
		s.log.Warn("ending the moves a previous run left open", "err", err)
	}
	now := s.now()
	if s.cfg.CA != nil {
		// Revoked certificates expired: off the list (crlstore.go).
		s.expireRevoked(ctx, now)
		// Revocations made by another replica (recorded in the store)
		// or another process sharing the CA directory.
		if changed, err := s.syncCRL(ctx); err != nil {
			s.log.Warn("reading the revocation list", "err", err)
		} else if changed {
			s.log.Info("revocation list reloaded", "crl_number", s.cfg.CA.CRLNumber().String())
		}
	}
	var errs []error
	if s.livenessDue(now) {
		if err := s.sweepNodes(ctx, now); err != nil {
			errs = append(errs, err)
		}
	}

	// TTL expiry.
	ls, err := s.st.Leases(ctx, store.LeaseFilter{States: []api.LeaseState{api.LeaseReserved, api.LeaseActive}, ExpiresBefore: now})
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range ls {
		if _, _, err := s.apply(ctx, l, lifecycle.Expire{}); !movedOn(err) {
			errs = append(errs, err)
		}
	}

	// Work interrupted by a control-plane restart: releases finish,
	// reservations that were never confirmed fail.
	stale := now.Add(-time.Duration(prepareStaleFactor) * s.cfg.PrepareTimeout)
	ls, err = s.st.Leases(ctx, store.LeaseFilter{States: []api.LeaseState{api.LeaseReleasing, api.LeaseReserved}})
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range ls {
		if _, _, err := s.apply(ctx, l, lifecycle.Interrupted{Before: stale}); !movedOn(err) {
			errs = append(errs, err)
		}
	}

	// Ranges being wiped that their lenders no longer list (wiping.go).
	if err := s.clearWipes(ctx); err != nil {
		errs = append(errs, err)
	}

	// History retention (retain.go).
	if err := s.pruneHistory(ctx, now); err != nil {
		errs = append(errs, err)
	}

	// Certificates issued to removed nodes that their removal did not
	// revoke, its replica stopped before its second pass (noderemove.go).
	if err := s.finishRemovals(ctx); err != nil {
		errs = append(errs, err)
	}

	// Certificates a removal here revoked after its commit that the store
	// did not take then (noderemove.go).
	if err := s.retryLateRevoked(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// movedOn reports whether err is nil, or says that the lease was not in
// the state the sweep read (refused by the state machine or by the
// store's compare-and-set): nothing to report.
func movedOn(err error) bool {
	return err == nil || errors.Is(err, lifecycle.ErrRefused) || errors.Is(err, store.ErrConflict)
}

// sweepNodes is the sweep's node liveness: ready → suspect → down, and
// the leases of down nodes lost.
func (s *Server) sweepNodes(ctx context.Context, now time.Time) error {
	// This replica's heartbeats kept in memory first (liveness.go); other
	// replicas' are at most their flushPeriod late.
	s.flushBeats(ctx)
	nodes, err := s.st.Nodes(ctx)
	if err != nil {
		return err
	}
	s.setNodeCount(len(nodes))
	// Heartbeat spreading (replica.go): with many nodes each agent beats
	// less often, and silence is judged on the same stretched scale.
	f := s.heartbeatStretch()
	suspectAfter, downAfter := stretch(s.cfg.SuspectAfter, f), stretch(s.cfg.DownAfter, f)
	// Silence before the control plane started, or before this replica
	// was elected to sweep, does not count.
	since := s.started
	if ls := s.rep.leadSince.Load(); ls != 0 && time.Unix(0, ls).After(since) {
		since = time.Unix(0, ls).UTC()
	}
	var errs []error
	changed := false
	gone := map[string]api.Node{} // the nodes down or removed
	for i := range nodes {
		n := &nodes[i]
		if n.State == api.NodeRemoved {
			// Its leases were lost when it was removed; one that took a
			// part there in a race with the removal (a reservation or a
			// move's commit that read the node before it) is lost now.
			gone[n.ID] = *n
			continue
		}
		// A control-plane restart gives every agent a full grace period
		// again: silence while the control plane was away does not count.
		last := n.LastHeartbeat
		if last.Before(since) {
			last = since
		}
		silent := now.Sub(last)
		switch {
		case n.State != api.NodeDown && silent > downAfter:
			err := s.st.SetNodeState(ctx, n.ID, n.State, api.NodeDown, api.Event{At: now, Type: "node.down", Subject: n.ID,
				Message: fmt.Sprintf("no heartbeat for %v (grace period %v)", silent.Round(time.Millisecond), downAfter), State: string(api.NodeDown)})
			if err != nil {
				if !errors.Is(err, store.ErrConflict) {
					errs = append(errs, err)
				}
				continue
			}
			s.log.Warn("node down", "node", n.ID, "name", n.Name, "silent", silent)
			n.State = api.NodeDown
			changed = true
		case n.State == api.NodeReady && silent > suspectAfter:
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
			gone[n.ID] = *n
		}
	}
	if len(gone) > 0 {
		errs = append(errs, s.loseNodeLeases(ctx, gone)...)
	}
	s.peers.set(nodes)
	if changed {
		s.invalidate() // placement must see the new node states
	}
	return errors.Join(errs...)
}

// livenessDue reports whether the sweep's node liveness is due: on every
// sweep in a cluster of up to MaxHeartbeatsPerSecond × HeartbeatInterval
// nodes, else once per (stretched) heartbeat interval, which is as fine
// as the stretched thresholds need, and spares reading every node every
// HeartbeatInterval.
func (s *Server) livenessDue(now time.Time) bool {
	if s.heartbeatStretch() <= 1 {
		return true
	}
	last := s.rep.lastLiveness.Load()
	if last != 0 && now.Sub(time.Unix(0, last)) < s.heartbeatInterval() {
		return false
	}
	s.rep.lastLiveness.Store(now.UnixNano())
	return true
}

// loseNodeLeases loses the parts on the nodes gone (down or removed) of
// the leases that hold a live part there (lifecycle.NodeDown), read in
// one listing however many nodes are gone (removed nodes are kept for
// good); it returns the errors of the leases that did not move on
// meanwhile.
func (s *Server) loseNodeLeases(ctx context.Context, gone map[string]api.Node) []error {
	ls, err := s.st.Leases(ctx, store.LeaseFilter{NodeStates: []api.NodeState{api.NodeDown, api.NodeRemoved},
		States: []api.LeaseState{api.LeaseReserved, api.LeaseActive, api.LeaseReleasing}})
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, l := range ls {
		done := map[string]bool{}
		for _, p := range l.Parts {
			n, ok := gone[p.NodeID]
			if !ok || done[n.ID] || p.Lost() {
				continue
			}
			done[n.ID] = true
			next, _, err := s.apply(ctx, l, lifecycle.NodeDown{NodeID: n.ID, Name: n.Name, Removed: n.State == api.NodeRemoved})
			if err != nil {
				if !movedOn(err) {
					errs = append(errs, err)
				}
				break // the next sweep reads it again
			}
			l = next
		}
	}
	return errs
}
