package controlplane

import (
	"context"
	"fmt"
	"math/big"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/lifecycle"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// hRemoveNode removes a node (DELETE /v1/nodes/{id}, an admin token): its
// leases become lost, every certificate the cluster CA issued to it is
// revoked, and the store retires it (its credential forgotten). A node
// that still heartbeats is refused unless ?force=true: its agent would join
// again at once, as the same node, with a new certificate.
func (s *Server) hRemoveNode(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	if !p.admin {
		return 0, nil, fmt.Errorf("%w: removing a node needs an admin token", ErrForbidden)
	}
	force := false
	if v := r.URL.Query().Get("force"); v != "" {
		var err error
		if force, err = strconv.ParseBool(v); err != nil {
			return 0, nil, fmt.Errorf("%w: force=%q: want true or false", ErrInvalid, v)
		}
	}
	out, err := s.removeNode(ctx, r.PathValue("id"), force)
	return http.StatusOK, out, err
}

func (s *Server) removeNode(ctx context.Context, id string, force bool) (api.NodeRemoval, error) {
	rm, ok := s.st.(store.NodeRemover)
	if !ok {
		return api.NodeRemoval{}, fmt.Errorf("%w: this control plane's store cannot remove nodes", ErrUnavailable)
	}
	rec, err := s.st.Node(ctx, id)
	if err != nil {
		return api.NodeRemoval{}, err
	}
	n := rec.Node
	if (n.State == api.NodeReady || n.State == api.NodeSuspect) && !force {
		return api.NodeRemoval{}, fmt.Errorf("%w: %s; or force the removal (its leases are lost, and a running agent joins again as this node with the bootstrap token)",
			ErrConflict, s.notDownYet(n))
	}
	// Its leases are lost, as when a node goes down: those with a part
	// on it. A lease whose only tie to the node is a move's destination
	// there is not (the move fails at its commit, the part stays at its
	// source: Core.FinishMove refuses a removed node), nor one that ended
	// meanwhile; a lease that takes a part there in a race with the
	// removal is lost by the next sweep (sweepNodes).
	var lost []string
	ls, err := s.st.Leases(ctx, store.LeaseFilter{NodeID: n.ID, States: []api.LeaseState{api.LeaseReserved, api.LeaseActive, api.LeaseReleasing}})
	if err != nil {
		return api.NodeRemoval{}, err
	}
	for _, l := range ls {
		_, _, err := s.apply(ctx, l, lifecycle.NodeDown{NodeID: n.ID, Name: n.Name, Removed: true})
		if !movedOn(err) {
			return api.NodeRemoval{}, err
		}
		if err == nil {
			lost = append(lost, l.ID)
		}
	}
	// Its certificates go on the revocation list before its credential is
	// forgotten: from here on neither opens anything.
	var serials []*big.Int
	if s.cfg.CA != nil {
		if serials, err = s.revokeCerts(ctx, n.ID, nil); err != nil {
			return api.NodeRemoval{}, fmt.Errorf("controlplane: revoke node %s's certificates: %w", n.ID, err)
		}
	}
	revoked := len(serials)
	// The serials go with the removal into the store: the replica that
	// calls the removed node's agent later (a failed move's destination
	// there: dropDestination) accepts them.
	removed, err := rm.RemoveNode(ctx, n.ID, serialTexts(serials), api.Event{At: s.now(), Type: "node.removed", Subject: n.ID, State: string(api.NodeRemoved),
		Message: fmt.Sprintf("%s removed; %d certificate(s) revoked, %d lease(s) lost", n.Name, revoked, len(lost))})
	if err != nil {
		return api.NodeRemoval{}, err
	}
	s.live.forget(n.ID)
	s.unserved.forget(n.ID)
	s.auth.dropNode(n.ID) // its credential stops working at once
	// Its ranges being wiped are no longer waited for (the store forgot
	// them with the node; a view in memory forgets them here).
	s.res.WipedOn(n.ID, func(string) bool { return false })
	s.invalidate()
	if s.cfg.CA != nil {
		// A renewal authenticated before the removal may have issued a
		// certificate since the revocation above; one that issues from
		// now on sees the node removed and revokes its certificate
		// itself (hNodeCertificate).
		more, err := s.revokeCerts(ctx, n.ID, nil)
		if err != nil {
			return api.NodeRemoval{}, fmt.Errorf("controlplane: node %s removed, but revoking the certificates issued to it during the removal failed: %w", n.ID, err)
		}
		serials = append(serials, more...)
		revoked += len(more)
		if err := rm.AddRemovalRevoked(ctx, n.ID, serialTexts(more)); err != nil {
			// This replica's teardowns below accept them; a failed
			// move's destination torn down later, here or on another
			// replica, does not (its agent, should it present one of
			// these, is told after its next join).
			s.log.Warn("recording the certificates revoked during a node's removal", "node", n.ID, "certificates", len(more), "err", err)
		}
	}
	// And on every other replica before this returns (revoke.go).
	if late := s.broadcastRevocation(ctx, n.ID, serials); len(late) > 0 {
		s.log.Warn("replicas did not acknowledge the node's removal in time; they trust no cache until they hear the others again",
			"node", n.ID, "replicas", late)
	}
	nodes, err := s.st.Nodes(ctx)
	if err == nil {
		s.peers.set(nodes)
	}
	if n.State != api.NodeDown {
		// Forced: its agent may still run. Once the removal holds
		// everywhere (this replica's view, the other replicas): the
		// teardowns may take PrepareTimeout for every
		// maxRemovedTeardowns of them.
		s.dropRemoved(ctx, rec, serials, lost)
	}
	s.log.Warn("node removed", "node", n.ID, "name", n.Name, "revoked_certificates", revoked, "lost_leases", len(lost))
	if lost == nil {
		lost = []string{}
	}
	return api.NodeRemoval{Node: removed, Revoked: revoked, Lost: lost}, nil
}

// dropRemoved tells the agent of node rec, removed while it was ready or
// suspect (--force: its agent may still run), to tear down the leases
// lost with it: its heartbeats, whose answers would tell it, are refused
// from now on, and an agent cut off from the control plane (the bootstrap
// token rotated as well) would serve them, and keep their tenants' bytes
// on its devices, until their expiry, or until it joined again. The
// teardowns wipe their ranges. They are teardownRemoved's calls (at most
// maxRemovedTeardowns under way, each within PrepareTimeout from its
// start, accepting the certificates the removal revoked: revoked, their
// serial numbers); dropRemoved returns once every lease was torn down or
// its call timed out: against an agent that does not answer, the removal
// takes PrepareTimeout for every maxRemovedTeardowns leases. A lender that
// does not answer is left to its next join, whose heartbeats' answers
// tell it.
func (s *Server) dropRemoved(ctx context.Context, rec store.NodeRecord, revoked []*big.Int, lost []string) {
	// The removal is committed: its teardowns are not given up with a
	// request whose caller went away.
	ctx = context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, id := range lost {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Never given up (ctx is not cancelled): a call that hangs
			// holds its slot for PrepareTimeout at most.
			if err := s.teardownRemoved(ctx, rec, revoked, api.TeardownRequest{LeaseID: id}); err != nil {
				s.log.Warn("the agent of a removed node did not tear a lost lease down; it is told once it joins again", "node", rec.ID, "lease", id, "err", err)
			}
		}()
	}
	wg.Wait()
}

// teardownRemoved tells the agent of rec, a removed node, to tear a lease
// down (req): a lease lost with the node (dropRemoved), a failed move's
// destination there (dropDestination). The call waits for one of the
// node's maxRemovedTeardowns slots (removedCalls), or for ctx to end, and
// is bounded by PrepareTimeout from when it has one. The node's removal
// has revoked its certificates (revoked: their serial numbers), which the
// agent presents to a control plane with a cluster CA: the call accepts
// them, and no other revoked one (removalLender).
func (s *Server) teardownRemoved(ctx context.Context, rec store.NodeRecord, revoked []*big.Int, req api.TeardownRequest) error {
	release, err := s.removed.acquire(ctx, rec.ID)
	if err != nil {
		return err
	}
	defer release()
	tctx, cancel := context.WithTimeout(ctx, s.cfg.PrepareTimeout)
	defer cancel()
	if rl, ok := s.lender.(removalLender); ok {
		return rl.TeardownRemoved(tctx, rec.Node, rec.AgentKey, revoked, req)
	}
	return s.lender.Teardown(tctx, rec.Node, rec.AgentKey, req)
}

// removalRevoked returns the serial numbers of the certificates that the
// removal of node id revoked (those of its removals since its last join),
// as the store recorded them (RemoveNode, AddRemovalRevoked): whichever
// replica removed the node, before or after this one started. None
// without a cluster CA, or for a node that is not removed; a store that
// cannot say is logged, and none returned (the call then refuses the
// agent's revoked certificate, as before).
func (s *Server) removalRevoked(ctx context.Context, id string) []*big.Int {
	rm, ok := s.st.(store.NodeRemover)
	if !ok || s.cfg.CA == nil {
		return nil
	}
	texts, err := rm.RemovalRevoked(ctx, id)
	if err != nil {
		s.log.Warn("reading the certificates a node's removal revoked", "node", id, "err", err)
		return nil
	}
	return parseSerials(texts)
}

// maxRemovedTeardowns is how many teardown calls the control plane has
// under way at once to the agent of a removed node (removedCalls): a
// forced removal loses every lease on the node at once (dropRemoved), and
// the moves to the node fail together (dropDestination). One call each,
// all at once, would open as many connections to the agent and have it
// tear down and wipe as many leases at once, each call's PrepareTimeout
// running while it waits there for the others.
const maxRemovedTeardowns = 8

// removedCalls bounds the teardown calls under way to each removed node's
// agent (maxRemovedTeardowns); a call waits for a slot, and its own
// timeout starts once it has one.
type removedCalls struct {
	mu    sync.Mutex
	nodes map[string]*removedSlots // forgotten once no call holds or waits for a slot
}

type removedSlots struct {
	sem     chan struct{}
	users   int // calls holding or waiting for a slot
	waiting int // calls waiting for one
}

// acquire waits until a call to node's agent may start, or ctx ends; the
// call returns its slot with release.
func (r *removedCalls) acquire(ctx context.Context, node string) (release func(), err error) {
	r.mu.Lock()
	if r.nodes == nil {
		r.nodes = map[string]*removedSlots{}
	}
	sl := r.nodes[node]
	if sl == nil {
		sl = &removedSlots{sem: make(chan struct{}, maxRemovedTeardowns)}
		r.nodes[node] = sl
	}
	sl.users++
	sl.waiting++
	r.mu.Unlock()
	leave := func(waited bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if waited {
			sl.waiting--
		}
		if sl.users--; sl.users == 0 {
			delete(r.nodes, node)
		}
	}
	select {
	case sl.sem <- struct{}{}:
		r.mu.Lock()
		sl.waiting--
		r.mu.Unlock()
		return func() { <-sl.sem; leave(false) }, nil
	case <-ctx.Done():
		leave(true)
		return nil, fmt.Errorf("controlplane: waiting to call removed node %s's agent: %w", node, context.Cause(ctx))
	}
}

// waiting returns how many calls to node's agent wait for a slot.
func (r *removedCalls) waiting(node string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sl := r.nodes[node]; sl != nil {
		return sl.waiting
	}
	return 0
}

// removalLender is a Lender that still reaches the agent of a node whose
// removal revoked its certificates (revoked: their serial numbers), to
// tell it to tear a lease down (TLSLender). A Lender without it is called
// with Teardown.
type removalLender interface {
	TeardownRemoved(ctx context.Context, node api.Node, agentKey string, revoked []*big.Int, req api.TeardownRequest) error
}

// notDownYet says why a node that is ready or suspect cannot be removed
// without force, and when it can be: an agent that has just stopped
// leaves its node ready, then suspect, until its silence passes the
// grace period (the stretched DownAfter the sweep judges by).
func (s *Server) notDownYet(n api.Node) string {
	last := n.LastHeartbeat
	if t, ok := s.live.lastSeen(n.ID); ok && t.After(last) {
		last = t
	}
	silent := max(s.now().Sub(last), 0).Round(time.Second)
	downAfter := stretch(s.cfg.DownAfter, s.heartbeatStretch())
	if n.State == api.NodeReady {
		return fmt.Sprintf("node %s (%s) is ready: its agent heartbeated %v ago; stop the agent, and remove the node once it is down (after %v without a heartbeat)",
			n.Name, n.ID, silent, downAfter)
	}
	return fmt.Sprintf("node %s (%s) is %s: no heartbeat for %v; it is down, and can be removed, after %v without one",
		n.Name, n.ID, n.State, silent, downAfter)
}
