package controlplane

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
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
	removed, gen, err := rm.RemoveNode(ctx, n.ID, serialTexts(serials), api.Event{At: s.now(), Type: "node.removed", Subject: n.ID, State: string(api.NodeRemoved),
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
	if s.removalCommitted != nil {
		if err := s.removalCommitted(ctx, n.ID); err != nil {
			return api.NodeRemoval{}, err
		}
	}
	if s.cfg.CA != nil {
		// A renewal authenticated before the removal may have issued a
		// certificate since the revocation above; one that issues from
		// now on sees the node removed and revokes its certificate
		// itself (hNodeCertificate). Should this replica stop before
		// this pass, any replica revokes those at its start or its next
		// sweep (finishRemovals).
		again, err := s.revokeCerts(ctx, n.ID, nil)
		if err != nil {
			return api.NodeRemoval{}, fmt.Errorf("controlplane: node %s removed, but revoking the certificates issued to it during the removal failed: %w", n.ID, err)
		}
		// Those the first pass did not name.
		var more []*big.Int
		for _, x := range again {
			if !slices.ContainsFunc(serials, func(y *big.Int) bool { return x.Cmp(y) == 0 }) {
				more = append(more, x)
			}
		}
		revoked += len(more)
		// Recorded with the removal's own (a store that fails the write
		// is tried again: recordLateRevoked).
		s.recordLateRevoked(ctx, rm, n.ID, gen, serialTexts(more))
		serials = append(serials, more...)
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
// destination there (dropDestination). It is callRemoved's call: the
// node's removal has revoked its certificates (revoked: their serial
// numbers), which the agent presents to a control plane with a cluster
// CA, and the call accepts them, and no other revoked one
// (removalLender).
func (s *Server) teardownRemoved(ctx context.Context, rec store.NodeRecord, revoked []*big.Int, req api.TeardownRequest) error {
	return s.callRemoved(ctx, rec.ID, func(ctx context.Context) error {
		if rl, ok := s.lender.(removalLender); ok {
			return rl.TeardownRemoved(ctx, rec.Node, rec.AgentKey, revoked, req)
		}
		return s.lender.Teardown(ctx, rec.Node, rec.AgentKey, req)
	})
}

// abortRemoved tells the agent of rec, a removed node, to give transfer
// id up: a failed move's, with an end on the node (abortMove). It is
// callRemoved's call, accepting the certificates the node's removal
// revoked (revoked: their serial numbers), as teardownRemoved's does
// (removalAborter).
func (s *Server) abortRemoved(ctx context.Context, rec store.NodeRecord, revoked []*big.Int, id string) error {
	return s.callRemoved(ctx, rec.ID, func(ctx context.Context) error {
		x := s.xlender()
		if ra, ok := x.(removalAborter); ok {
			_, err := ra.TransferAbortRemoved(ctx, rec.Node, rec.AgentKey, revoked, id)
			return err
		}
		_, err := x.TransferAbort(ctx, rec.Node, rec.AgentKey, id)
		return err
	})
}

// callRemoved makes call, a call to the agent of node, a removed node:
// it waits for one of the node's maxRemovedTeardowns slots
// (removedCalls), or for ctx to end, and is bounded by PrepareTimeout
// from when it has one.
func (s *Server) callRemoved(ctx context.Context, node string, call func(ctx context.Context) error) error {
	release, err := s.removed.acquire(ctx, node)
	if err != nil {
		return err
	}
	defer release()
	tctx, cancel := context.WithTimeout(ctx, s.cfg.PrepareTimeout)
	defer cancel()
	return call(tctx)
}

// removalRevoked returns the serial numbers of the certificates that the
// removal of node id revoked (those of its removals since its last join),
// as the store recorded them (RemoveNode, AddRemovalRevoked): whichever
// replica removed the node, before or after this one started; with those
// a removal on this replica revoked after its commit that the store has
// not taken yet, or that this replica found again at its start, held by
// a replica that stopped (unrecordedRevoked). None without a cluster CA, or for a
// node that is not removed; a store that cannot say is logged, and only
// those held here returned (the call then refuses the agent's other
// revoked certificates, as before).
func (s *Server) removalRevoked(ctx context.Context, id string) []*big.Int {
	rm, ok := s.st.(store.NodeRemover)
	if !ok || s.cfg.CA == nil {
		return nil
	}
	rec, err := rm.RemovalRevoked(ctx, id)
	if err != nil {
		s.log.Warn("reading the certificates a node's removal revoked", "node", id, "err", err)
		rec = store.RemovalRecord{}
	}
	texts := rec.Revoked
	if u, ok := s.unrecorded.get(id); ok && (err != nil || u.gen == rec.Gen) {
		// Held here for a removal that the store still has, or that the
		// store cannot say.
		for _, x := range u.late {
			if !slices.Contains(texts, x) {
				texts = append(texts, x)
			}
		}
	}
	return parseSerials(texts)
}

// lateRevokedTries bounds the attempts a removal makes to record the
// serials its second revocation pass revoked (recordLateRevoked), and
// lateRevokedBackoff is the first wait between them (doubled each time).
const (
	lateRevokedTries   = 5
	lateRevokedBackoff = 50 * time.Millisecond
)

// recordLateRevoked records late, the serials (hex) of the certificates
// the removal of node id revoked after its commit, with those it recorded
// with the removal (in the node's removal record of generation gen, which
// RemoveNode returned; none once the node joined again): the replicas that
// call the removed node's agent later accept them (removalRevoked). A write the store fails is
// tried again, lateRevokedTries times at most, with a backoff, while ctx
// (the removal's request) lasts; then the serials are held here
// (unrecordedRevoked), accepted by this replica's calls meanwhile, and
// written again by its background duties (retryLateRevoked: every sweep,
// or every followRefresh on a replica that does not sweep) until the
// store takes them. A restart of this replica before then does not lose
// them: the store has them revoked and recorded as issued to the node,
// and every replica that starts finds them again (recoverLateRevoked).
func (s *Server) recordLateRevoked(ctx context.Context, rm store.NodeRemover, id string, gen int64, late []string) {
	if len(late) == 0 {
		return
	}
	wait := lateRevokedBackoff
	var err error
	for attempt := 1; ; attempt++ {
		if err = rm.AddRemovalRevoked(ctx, id, gen, late); err == nil || errors.Is(err, store.ErrNotFound) {
			return
		}
		if attempt == lateRevokedTries || ctx.Err() != nil {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		wait *= 2
	}
	s.unrecorded.add(id, gen, late)
	s.log.Warn("recording the certificates revoked during a node's removal failed; this replica holds them, accepts them, and records them at its next sweep",
		"node", id, "certificates", len(late), "err", err)
}

// retryLateRevoked records the serials held in unrecordedRevoked, and
// forgets those recorded, and those of a removal the store no longer has
// (the node joined again since: its removal record is of another
// generation; or it is unknown). Until recoverLateRevoked succeeded once
// in this process, it tries that first.
func (s *Server) retryLateRevoked(ctx context.Context) error {
	rm, ok := s.st.(store.NodeRemover)
	if !ok {
		return nil
	}
	var errs []error
	if err := s.recoverLateRevoked(ctx); err != nil {
		errs = append(errs, err)
	}
	for id, u := range s.unrecorded.all() {
		rec, err := rm.RemovalRevoked(ctx, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			s.unrecorded.done(id, u)
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("controlplane: the certificates revoked during node %s's removal: %w", id, err))
			continue
		case rec.Gen != u.gen:
			s.unrecorded.done(id, u)
			continue
		}
		// Added only to that record still (the store checks it again).
		if err := rm.AddRemovalRevoked(ctx, id, u.gen, u.late); err != nil && !errors.Is(err, store.ErrNotFound) {
			errs = append(errs, fmt.Errorf("controlplane: recording the certificates revoked during node %s's removal: %w", id, err))
			continue
		}
		s.unrecorded.done(id, u)
		s.log.Info("recorded the certificates revoked during a node's removal", "node", id, "certificates", len(u.late))
	}
	return errors.Join(errs...)
}

// finishRemovals revokes the certificates recorded as issued to a
// removed node that no revocation names (store.NodeRemover.
// UnrevokedRemoved): those a renewal signed during the node's removal,
// before its commit, that the removal's second pass would have revoked
// had its replica not stopped first (removeNode). Every certificate the
// control plane issues is recorded before it is handed out (recordIssued),
// and one issued at a join once the join committed, the node no longer
// removed: a node that joined again keeps the certificates issued to it
// since, and those read as a removed node's are revoked by serial, not by
// the node's name. It records them with the node's removal record
// (recordLateRevoked: the calls to the removed node's agent accept them)
// and tells the other replicas (broadcastRevocation), as the removal
// would have. It runs at every replica's start (New) and at every sweep
// (the elected replica's, with a shared store). It takes those expired
// less than revokedExpiryGrace ago too, as the revocation list keeps
// them: a peer whose clock is behind this replica's by less still
// accepts them until it refuses them (recordIssued keeps their record
// that long).
func (s *Server) finishRemovals(ctx context.Context) error {
	rm, ok := s.st.(store.NodeRemover)
	if !ok || s.cfg.CA == nil {
		return nil
	}
	found, err := rm.UnrevokedRemoved(ctx, s.now().Add(-revokedExpiryGrace))
	if err != nil {
		return fmt.Errorf("controlplane: the certificates issued to removed nodes that no revocation names: %w", err)
	}
	var errs []error
	for id, u := range found {
		serials := parseSerials(u.Serials)
		if _, err := s.revokeCerts(ctx, "", serials); err != nil {
			errs = append(errs, fmt.Errorf("controlplane: revoke the certificates issued to removed node %s that its removal did not revoke: %w", id, err))
			continue
		}
		s.log.Warn("revoked certificates issued to a removed node during its removal that its replica did not revoke (it stopped first)",
			"node", id, "certificates", len(serials))
		s.recordLateRevoked(ctx, rm, id, u.Gen, u.Serials)
		if late := s.broadcastRevocation(ctx, id, serials); len(late) > 0 {
			s.log.Warn("replicas did not acknowledge the revocation of a removed node's certificates in time; they trust no cache until they hear the others again",
				"node", id, "replicas", late)
		}
	}
	return errors.Join(errs...)
}

// recoverLateRevoked finds again the serials that removals revoked after
// their commit and that the store did not take with the removal's record
// (recordLateRevoked), whichever replica held them in memory and stopped
// since: those of the certificates the store recorded as issued to a
// removed node, revoked, that its removal record does not name
// (store.NodeRemover.UnrecordedRemovalRevoked). Every certificate the
// control plane issues is recorded there before it is handed out
// (recordIssued), those a removal revokes after its commit too; and they
// are revoked in the store before the removal records them. It holds
// them as recordLateRevoked does, with their record's generation: this
// replica's calls to the node's agent accept them at once, and
// retryLateRevoked records them. It runs once per process, at start
// (New), or at the next background duty if that failed. Besides those,
// it finds only certificates revoked under the removed node's name
// otherwise (a renewal that found the node removed once it signed, and
// revoked its own certificate: hNodeCertificate), which the removal's
// passes would have named too: they name every certificate issued to the
// node not expired, or expired less than revokedExpiryGrace ago
// (revokeCerts).
func (s *Server) recoverLateRevoked(ctx context.Context) error {
	if s.unrecorded.recovered.Load() {
		return nil
	}
	rm, ok := s.st.(store.NodeRemover)
	if !ok || s.cfg.CA == nil {
		s.unrecorded.recovered.Store(true)
		return nil
	}
	found, err := rm.UnrecordedRemovalRevoked(ctx)
	if err != nil {
		return fmt.Errorf("controlplane: the certificates revoked during nodes' removals that the store did not record with them: %w", err)
	}
	for id, rec := range found {
		s.unrecorded.merge(id, rec.Gen, rec.Revoked)
		s.log.Warn("found certificates revoked during a node's removal that the store did not record with it; this replica holds them, accepts them, and records them at its next sweep",
			"node", id, "certificates", len(rec.Revoked))
	}
	s.unrecorded.recovered.Store(true)
	return nil
}

// unrecordedRevoked holds, per removed node, the serials (hex) of the
// certificates its removal on this replica revoked after its commit that
// the store did not take (recordLateRevoked), and those found again at
// start (recoverLateRevoked), until the store takes them.
type unrecordedRevoked struct {
	mu sync.Mutex
	m  map[string]*lateRevoked
	// recovered: recoverLateRevoked ran in this process.
	recovered atomic.Bool
}

// lateRevoked is what a removal revoked after its commit, not recorded
// yet (late), and the generation of the node's removal record it belongs
// to (gen: a join since raised it, and a later removal records its own).
type lateRevoked struct {
	gen  int64
	late []string
}

func (u *unrecordedRevoked) add(id string, gen int64, late []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[string]*lateRevoked{}
	}
	// A later removal of the node (it joined again meanwhile) replaces
	// an earlier one's.
	u.m[id] = &lateRevoked{gen: gen, late: slices.Clone(late)}
}

// merge adds late to what is held for node id's removal record of
// generation gen; what is held for a later record (a higher generation)
// stays, and replaces one held for an earlier record.
func (u *unrecordedRevoked) merge(id string, gen int64, late []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[string]*lateRevoked{}
	}
	l := &lateRevoked{gen: gen, late: slices.Clone(late)}
	if old := u.m[id]; old != nil {
		if old.gen > gen {
			return
		}
		if old.gen == gen {
			l.late = slices.Clone(old.late)
			for _, x := range late {
				if !slices.Contains(l.late, x) {
					l.late = append(l.late, x)
				}
			}
		}
	}
	u.m[id] = l
}

func (u *unrecordedRevoked) get(id string) (lateRevoked, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if l := u.m[id]; l != nil {
		return *l, true
	}
	return lateRevoked{}, false
}

// all returns what is held, per node.
func (u *unrecordedRevoked) all() map[string]*lateRevoked {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make(map[string]*lateRevoked, len(u.m))
	for id, l := range u.m {
		out[id] = l
	}
	return out
}

// done forgets what was held for node id, if it is still l (not replaced
// by a later removal's).
func (u *unrecordedRevoked) done(id string, l *lateRevoked) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m[id] == l {
		delete(u.m, id)
	}
}

// maxRemovedTeardowns is how many teardown (and abort) calls the control
// plane has under way at once to the agent of a removed node
// (removedCalls): a forced removal loses every lease on the node at once
// (dropRemoved), and the moves to the node fail together (abortMove,
// dropDestination). One call each, all at once, would open as many
// connections to the agent and have it tear down and wipe as many leases
// at once, each call's PrepareTimeout running while it waits there for
// the others.
const maxRemovedTeardowns = 8

// removedCalls bounds the teardown and abort calls under way to each
// removed node's agent (maxRemovedTeardowns); a call waits for a slot,
// and its own timeout starts once it has one.
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

// removalAborter is a transferLender that still reaches the agent of a
// node whose removal revoked its certificates (revoked: their serial
// numbers), to tell it to give a transfer up (TLSLender). One without it
// is called with TransferAbort.
type removalAborter interface {
	TransferAbortRemoved(ctx context.Context, node api.Node, agentKey string, revoked []*big.Int, id string) (api.Transfer, error)
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
