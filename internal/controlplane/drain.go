package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/lifecycle"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/resource"
)

// Cordon and drain (docs/operations.md, "Moving leases and draining
// nodes"): a cordoned node gets no new part (placement skips it; the flag
// is stored on the node); a drain cordons the node and moves every lease
// off it before a deadline — block and memory leases part by part while
// their borrowers use them (move.go), accelerator leases of a stateless
// role by placing their slots again elsewhere with their role and config
// (the borrower is told: an event, and the lease's new URI) — and ends
// with the node holding nothing, or with the list of what was left in
// place and why, each lease's tenant told in the event stream. Drains live
// in memory: a control-plane restart ends them (the node stays cordoned;
// drain it again).

// Drain timing.
const (
	defaultDrainDeadline = 10 * time.Minute
	maxDrainDeadline     = 24 * time.Hour
	drainPoll            = 500 * time.Millisecond
	// drainRetry is how soon a lease that could not start moving is
	// tried again.
	drainRetry = 3 * time.Second
	// drainAbortWait bounds the wait, after the deadline, for the moves
	// given up to end.
	drainAbortWait = time.Minute
)

// drains is the server's node drains.
type drains struct {
	runner
	mu sync.Mutex
	m  map[string]*drainRun // latest, by node ID
}

// drainRun is one node's drain.
type drainRun struct {
	mu sync.Mutex
	d  api.Drain
	// per lease: when to try again, and how to stop its moves.
	next  map[string]time.Time
	stops map[string]context.CancelCauseFunc
}

func (dr *drainRun) get() api.Drain {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	d := dr.d
	d.Leases = append([]api.DrainLease(nil), dr.d.Leases...)
	return d
}

// lease returns the drain's entry for lease id (adding it).
func (dr *drainRun) lease(l api.Lease) *api.DrainLease {
	for i := range dr.d.Leases {
		if dr.d.Leases[i].LeaseID == l.ID {
			return &dr.d.Leases[i]
		}
	}
	dr.d.Leases = append(dr.d.Leases, api.DrainLease{LeaseID: l.ID, Kind: l.Kind, Tenant: l.Tenant, Action: drainAction(l), State: api.DrainLeasePending})
	return &dr.d.Leases[len(dr.d.Leases)-1]
}

// drainAction is what a drain does with a lease.
func drainAction(l api.Lease) string {
	switch l.Kind {
	case api.KindBlock, api.KindMemory:
		return api.DrainMove
	case api.KindAccel:
		return api.DrainReplace
	}
	return api.DrainLeave
}

// cordonNode sets or clears a node's cordon (POST /v1/nodes/{id}/cordon,
// /uncordon).
func (s *Server) cordonNode(ctx context.Context, ref string, cordon bool) (api.Node, error) {
	mv, err := s.mover()
	if err != nil {
		return api.Node{}, err
	}
	n, err := s.findNode(ctx, ref)
	if err != nil {
		return n, err
	}
	if !cordon {
		if dr := s.drains.get(n.ID); dr != nil && dr.get().State == api.DrainRunning {
			return n, fmt.Errorf("%w: node %s is being drained; it stays cordoned until the drain ends", ErrConflict, n.Name)
		}
	}
	if n.Cordoned == cordon {
		return n, nil
	}
	ev := api.Event{At: s.now(), Type: "node.uncordoned", Message: n.Name + ": placement may use it again", State: string(n.State)}
	if cordon {
		ev.Type, ev.Message = "node.cordoned", n.Name+": no new part is placed on it; its leases stay"
	}
	out, err := mv.SetNodeCordon(ctx, n.ID, cordon, ev)
	s.invalidate() // placement must see it
	if err == nil {
		s.log.Info(strings.TrimPrefix(ev.Type, "node."), "node", n.ID, "name", n.Name)
	}
	return out, err
}

func (ds *drains) get(nodeID string) *drainRun {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.m[nodeID]
}

// drainNode starts draining a node (POST /v1/nodes/{id}/drain); a drain
// under way is returned as it is.
func (s *Server) drainNode(ctx context.Context, ref string, req api.DrainRequest) (api.Drain, error) {
	if req.DeadlineSeconds < 0 || req.DeadlineSeconds > maxDrainDeadline.Seconds() {
		return api.Drain{}, fmt.Errorf("%w: deadline_seconds must be between 0 and %.0f", ErrInvalid, maxDrainDeadline.Seconds())
	}
	n, err := s.findNode(ctx, ref)
	if err != nil {
		return api.Drain{}, err
	}
	if n.State == api.NodeRemoved {
		return api.Drain{}, fmt.Errorf("%w: node %s (%s) is removed: it holds no lease to drain", ErrConflict, n.Name, n.ID)
	}
	deadline := defaultDrainDeadline
	if req.DeadlineSeconds > 0 {
		deadline = time.Duration(req.DeadlineSeconds * float64(time.Second))
	}
	s.drains.mu.Lock()
	if dr := s.drains.m[n.ID]; dr != nil && dr.get().State == api.DrainRunning {
		s.drains.mu.Unlock()
		return dr.get(), nil
	}
	now := s.now()
	dr := &drainRun{d: api.Drain{NodeID: n.ID, NodeName: n.Name, State: api.DrainRunning, StartedAt: now, Deadline: now.Add(deadline), Leases: []api.DrainLease{}},
		next: map[string]time.Time{}, stops: map[string]context.CancelCauseFunc{}}
	if s.drains.m == nil {
		s.drains.m = map[string]*drainRun{}
	}
	s.drains.m[n.ID] = dr
	s.drains.mu.Unlock()
	if _, err := s.cordonNode(ctx, n.ID, true); err != nil {
		s.drains.mu.Lock()
		delete(s.drains.m, n.ID)
		s.drains.mu.Unlock()
		return api.Drain{}, err
	}
	ls, err := s.st.Leases(ctx, store.LeaseFilter{NodeID: n.ID, States: []api.LeaseState{api.LeaseReserved, api.LeaseActive, api.LeaseReleasing}})
	if err != nil {
		return api.Drain{}, err
	}
	dr.mu.Lock()
	for _, l := range ls {
		if onNodeParts(l, n.ID) != nil {
			dr.lease(l)
		}
	}
	dr.mu.Unlock()
	s.event(ctx, api.Event{Type: "node.drain.started", Subject: n.ID, State: string(n.State),
		Message: fmt.Sprintf("%s: moving %d lease(s) off it before %s", n.Name, len(dr.get().Leases), dr.d.Deadline.Format(time.RFC3339))})
	if _, ok := s.drains.start(func(ctx context.Context) { s.runDrain(ctx, dr, n) }); !ok {
		return api.Drain{}, fmt.Errorf("%w: the control plane is stopping", ErrUnavailable)
	}
	return dr.get(), nil
}

// nodeDrain answers GET /v1/nodes/{id}/drain.
func (s *Server) nodeDrain(ctx context.Context, ref string) (api.Drain, error) {
	n, err := s.findNode(ctx, ref)
	if err != nil {
		return api.Drain{}, err
	}
	dr := s.drains.get(n.ID)
	if dr == nil {
		return api.Drain{}, fmt.Errorf("%w: node %s has not been drained since the control plane started", ErrNotFound, n.Name)
	}
	return dr.get(), nil
}

// event appends an event, stamped now.
func (s *Server) event(ctx context.Context, ev api.Event) {
	ev.At = s.now()
	if _, err := s.st.AppendEvent(ctx, ev); err != nil {
		s.log.Warn("event", "type", ev.Type, "err", err)
	}
}

// onNodeParts are the indices of l's parts on node.
func onNodeParts(l api.Lease, node string) []int {
	var out []int
	for i, p := range l.Parts {
		if p.NodeID == node {
			out = append(out, i)
		}
	}
	return out
}

// runDrain moves the node's leases off it until none is left or the
// deadline passes.
func (s *Server) runDrain(ctx context.Context, dr *drainRun, n api.Node) {
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for {
		left, stuck, err := s.drainRound(ctx, dr, n)
		if err != nil {
			s.log.Warn("drain round", "node", n.ID, "err", err)
		}
		if err == nil && left == 0 {
			s.finishDrain(ctx, dr, n, "")
			return
		}
		if err == nil && stuck {
			// Only leases that cannot move are left: waiting for the
			// deadline changes nothing.
			s.finishDrain(ctx, dr, n, "they cannot move")
			return
		}
		if !s.now().Before(dr.get().Deadline) {
			s.finishDrain(ctx, dr, n, "the drain's deadline passed")
			return
		}
		select {
		case <-ctx.Done():
			s.finishDrain(context.Background(), dr, n, context.Cause(ctx).Error())
			return
		case <-t.C:
		}
	}
}

// drainRound looks at the leases still on the node and gets each one
// moving; it returns how many are left on the node, and stuck when every
// one of them is left for good (it cannot move).
func (s *Server) drainRound(ctx context.Context, dr *drainRun, n api.Node) (left int, stuck bool, err error) {
	ls, err := s.st.Leases(ctx, store.LeaseFilter{NodeID: n.ID, States: []api.LeaseState{api.LeaseReserved, api.LeaseActive, api.LeaseReleasing}})
	if err != nil {
		return -1, false, err
	}
	still := map[string]bool{}
	for _, l := range ls {
		parts := onNodeParts(l, n.ID)
		if len(parts) == 0 {
			continue // only a move's destination is on the node
		}
		left++
		still[l.ID] = true
		dr.mu.Lock()
		e := dr.lease(l)
		st, next := e.State, dr.next[l.ID]
		dr.mu.Unlock()
		if st == api.DrainLeaseLeft || s.now().Before(next) {
			continue
		}
		switch {
		case l.State != api.LeaseActive:
			s.setDrainLease(dr, l.ID, api.DrainLeasePending, "waiting for the lease to become active or end ("+string(l.State)+")")
		case e.Action == api.DrainMove:
			s.drainMove(ctx, dr, l, n, parts)
		case e.Action == api.DrainReplace:
			s.drainReplace(ctx, dr, l, n, parts)
		default:
			s.setDrainLease(dr, l.ID, api.DrainLeaseLeft, fmt.Sprintf("%s leases do not move", l.Kind))
		}
	}
	// Leases no longer on the node: moved, or ended meanwhile.
	s.drainGone(ctx, dr, still)
	dr.mu.Lock()
	stuck = left > 0
	for i := range dr.d.Leases {
		e := &dr.d.Leases[i]
		if still[e.LeaseID] && e.State != api.DrainLeaseLeft {
			stuck = false
		}
	}
	dr.mu.Unlock()
	return left, stuck, nil
}

// drainGone marks done the drain's leases that are no longer on the node
// (still: those that are), each with what became of it: moved off (no
// reason), or ended there without moving — lost with the node (it went
// down or was removed), released, expired — which its reason says, so
// that the drain's record does not count it moved.
func (s *Server) drainGone(ctx context.Context, dr *drainRun, still map[string]bool) {
	dr.mu.Lock()
	var gone []string
	for _, e := range dr.d.Leases {
		if !still[e.LeaseID] && e.State != api.DrainLeaseDone && e.State != api.DrainLeaseLeft {
			gone = append(gone, e.LeaseID)
		}
	}
	dr.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	ended := map[string]string{}
	ls, err := s.st.Leases(ctx, store.LeaseFilter{IDs: gone})
	if err != nil {
		s.log.Warn("drain: reading the leases that left the node", "err", err)
	}
	for _, l := range ls {
		switch l.State {
		case api.LeaseReserved, api.LeaseActive, api.LeaseReleasing:
			continue
		}
		why := "not moved: the lease became " + string(l.State)
		if l.Reason != "" {
			why += " (" + l.Reason + ")"
		}
		ended[l.ID] = why
	}
	dr.mu.Lock()
	defer dr.mu.Unlock()
	for i := range dr.d.Leases {
		e := &dr.d.Leases[i]
		if !slices.Contains(gone, e.LeaseID) || e.State == api.DrainLeaseDone || e.State == api.DrainLeaseLeft {
			continue
		}
		e.State, e.Reason = api.DrainLeaseDone, ""
		if why, ok := ended[e.LeaseID]; ok && !s.movedOff(e.Moves) {
			e.Reason = why
		}
	}
}

// movedOff reports whether one of the moves ids (a drain's of a lease)
// is done: the lease left the node by it, whatever became of it after.
func (s *Server) movedOff(ids []string) bool {
	for _, id := range ids {
		if r := s.mv.run(id); r != nil && r.get().State == api.MoveDone {
			return true
		}
	}
	return false
}

func (s *Server) setDrainLease(dr *drainRun, id, state, reason string) {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	for i := range dr.d.Leases {
		if dr.d.Leases[i].LeaseID == id {
			dr.d.Leases[i].State, dr.d.Leases[i].Reason = state, reason
		}
	}
}

// drainMove gets a block or memory lease's parts on the node moving, or
// follows the moves under way.
func (s *Server) drainMove(ctx context.Context, dr *drainRun, l api.Lease, n api.Node, parts []int) {
	dr.mu.Lock()
	e := dr.lease(l)
	ids := append([]string(nil), e.Moves...)
	dr.mu.Unlock()
	running, done := false, len(ids) > 0
	var failed []string
	for _, id := range ids {
		if r := s.mv.run(id); r != nil {
			m := r.get()
			switch m.State {
			case api.MoveFailed:
				failed = append(failed, m.Error)
				done = false
			case api.MoveDone:
			default:
				running, done = true, false
			}
		}
	}
	if running || done {
		return // the next round finds the lease off the node
	}
	if len(failed) > 0 {
		s.setDrainLease(dr, l.ID, api.DrainLeasePending, "a move failed ("+failed[0]+"); trying again")
	}
	ms, stop, err := s.startMovesStop(ctx, l, parts, moveTarget{}, "drain of node "+n.Name)
	dr.mu.Lock()
	defer dr.mu.Unlock()
	e = dr.lease(l)
	if err != nil {
		s.log.Info("drain: a lease cannot move yet", "node", n.ID, "lease", l.ID, "err", err)
		e.State, e.Reason = api.DrainLeasePending, "cannot move yet: "+plainText(err)
		dr.next[l.ID] = s.now().Add(drainRetry)
		return
	}
	e.State, e.Reason = api.DrainLeaseMoving, ""
	e.Moves = nil
	for _, m := range ms {
		e.Moves = append(e.Moves, m.ID)
	}
	dr.stops[l.ID] = stop
}

// drainReplace places an accelerator lease's slots on the node again
// elsewhere, with their role and config (read from the node's agent: the
// control plane does not keep them): a role that keeps state in its slot
// (a Wasm module's memory) is left in place. The borrower is told by an
// event; the lease's URI changes.
func (s *Server) drainReplace(ctx context.Context, dr *drainRun, l api.Lease, n api.Node, parts []int) {
	leave := func(why string) { s.setDrainLease(dr, l.ID, api.DrainLeaseLeft, why) }
	// A drain's record says why in plain words (plainText); the log has
	// the whole error.
	retry := func(why string, err error) {
		if err != nil {
			s.log.Info("drain: a lease cannot be placed again yet", "node", n.ID, "lease", l.ID, "err", err)
			why += plainText(err)
		}
		s.setDrainLease(dr, l.ID, api.DrainLeasePending, why)
		dr.mu.Lock()
		dr.next[l.ID] = s.now().Add(drainRetry)
		dr.mu.Unlock()
	}
	src, err := s.nodeRecord(ctx, n.ID)
	if err != nil {
		retry("", err)
		return
	}
	export, err := exportOf(l.Parts[parts[0]].URI)
	if err != nil {
		leave("its slot has no URI to read its role from")
		return
	}
	cctx, cancel := context.WithTimeout(ctx, moveCallTimeout)
	rc, err := s.xlender().RoleConfig(cctx, src.Node, src.AgentKey, api.RoleConfigRequest{LeaseID: l.ID, Export: export})
	cancel()
	switch {
	case err != nil:
		retry("reading its role from the lender: ", err)
		return
	case rc.Role == "":
		leave("no role was loaded through the control plane: what its slot holds is unknown, so it is not placed again")
		return
	case rc.Role == "wasm":
		leave("role wasm keeps state in its slot's memory between requests: it is not placed again without it")
		return
	}
	s.setDrainLease(dr, l.ID, api.DrainLeaseMoving, "")
	var moved []string
	for _, i := range parts {
		to, err := s.replaceSlot(ctx, l, i, n, rc)
		if err != nil {
			retry("cannot place its slot again yet: ", err)
			return
		}
		moved = append(moved, to)
		if l, err = s.st.Lease(ctx, l.ID); err != nil {
			retry("", err)
			return
		}
	}
	// Every slot left the node: the old ones stop.
	if onNodeParts(l, n.ID) == nil {
		tctx, cancel := context.WithTimeout(ctx, moveCallTimeout)
		if err := s.lender.Teardown(tctx, src.Node, src.AgentKey, api.TeardownRequest{LeaseID: l.ID}); err != nil {
			s.log.Warn("tearing down a re-placed slot; the lender's heartbeat will", "lease", l.ID, "node", n.ID, "err", err)
		}
		cancel()
	}
	s.event(ctx, api.Event{Type: "lease.replaced", Subject: l.ID, State: string(l.State),
		Message: fmt.Sprintf("accelerator slot(s) placed again on %s by the drain of node %s, role %s loaded: the lease's URI changed (read the lease again); requests in flight to the old slot fail",
			strings.Join(moved, ", "), n.Name, rc.Role)})
	s.setDrainLease(dr, l.ID, api.DrainLeaseDone, "")
}

// replaceSlot places part i of accelerator lease l (on node n) again
// elsewhere with role rc, and points the lease at it; it returns where.
func (s *Server) replaceSlot(ctx context.Context, l api.Lease, i int, n api.Node, rc api.RoleConfigResponse) (string, error) {
	to, err := s.placeMove(ctx, l, i, moveTarget{role: &rc})
	if err != nil {
		return "", err
	}
	now := s.now()
	m := api.Move{ID: resource.NewID("move"), LeaseID: l.ID, Part: i, Kind: l.Kind, State: api.MoveSwitching,
		From: stripURI(l.Parts[i]), To: to, Size: l.Parts[i].Length, Reason: "drain of node " + n.Name, StartedAt: now, UpdatedAt: now}
	if _, _, err := s.apply(ctx, l, lifecycle.MoveStarted{Move: m}); err != nil {
		return "", err
	}
	r := &moveRun{m: m}
	s.mv.add(r)
	fail := func(err error) (string, error) {
		s.log.Warn("placing an accelerator slot again failed; it stays", "move", m.ID, "lease", l.ID, "part", i, "err", err)
		if _, todo, _ := s.apply(ctx, l, lifecycle.MoveFailed{Move: m, Why: plainText(err)}); len(todo) > 0 {
			s.moveActions(todo)
		}
		return "", err
	}
	dst, err := s.nodeRecord(ctx, to.NodeID)
	if err != nil {
		return fail(err)
	}
	// The call's bound starts before Now is stamped: the lender deducts
	// it (TimeoutSeconds) from the time left.
	bound := s.cfg.PrepareTimeout + moveCallTimeout
	pctx, cancel := context.WithTimeout(ctx, bound)
	resp, err := s.lender.Prepare(pctx, dst.Node, dst.AgentKey, api.PrepareRequest{LeaseID: l.ID, Kind: l.Kind, Mode: l.Mode,
		DeviceID: to.DeviceID, DeviceName: s.res.DeviceNames(ctx)[to.DeviceID], Offset: to.Offset, Length: to.Length,
		Export: movedExport(l.Credential, i, m.ID), Role: rc.Role, RoleConfig: rc.RoleConfig, Gateway: rc.Gateway,
		ExpiresAt: l.ExpiresAt, Now: s.now(), TimeoutSeconds: bound.Seconds()})
	cancel()
	if err != nil {
		return fail(fmt.Errorf("the new lender did not prepare the slot: %w", err))
	}
	if _, todo, err := s.apply(ctx, l, lifecycle.MoveDone{Move: m, URI: resp.URI}); err != nil {
		s.moveActions(todo)
		return "", err
	}
	s.endMove(ctx, lifecycle.MoveEnded(l, m, api.MoveDone, "", s.now()))
	return dst.Name, nil
}

// finishDrain ends a drain: what is still on the node is left in place,
// its moves given up, each lease's tenant told; why is the reason ("" if
// nothing is left).
func (s *Server) finishDrain(ctx context.Context, dr *drainRun, n api.Node, why string) {
	dr.mu.Lock()
	stops := dr.stops
	dr.stops = map[string]context.CancelCauseFunc{}
	dr.mu.Unlock()
	if why != "" {
		for _, stop := range stops {
			stop(errors.New(why))
		}
		// Wait for the moves given up to end (their parts stay).
		deadline := time.Now().Add(drainAbortWait)
		for time.Now().Before(deadline) {
			busy := false
			for _, e := range dr.get().Leases {
				for _, id := range e.Moves {
					if r := s.mv.run(id); r != nil && !r.get().Done() {
						busy = true
					}
				}
			}
			if !busy {
				break
			}
			t := time.NewTimer(100 * time.Millisecond)
			<-t.C
		}
	}
	// What is on the node now decides.
	onNode := map[string]bool{}
	if ls, err := s.st.Leases(ctx, store.LeaseFilter{NodeID: n.ID, States: []api.LeaseState{api.LeaseReserved, api.LeaseActive, api.LeaseReleasing}}); err == nil {
		for _, l := range ls {
			if onNodeParts(l, n.ID) != nil {
				onNode[l.ID] = true
			}
		}
	}
	s.drainGone(ctx, dr, onNode)
	dr.mu.Lock()
	var left []api.DrainLease
	moved, ended := 0, 0
	for i := range dr.d.Leases {
		e := &dr.d.Leases[i]
		switch {
		case !onNode[e.LeaseID]:
			if e.State != api.DrainLeaseDone {
				e.State, e.Reason = api.DrainLeaseDone, ""
			}
			if e.Reason == "" {
				moved++
			} else {
				ended++
			}
		case e.State != api.DrainLeaseLeft:
			e.State = api.DrainLeaseLeft
			reason := why
			if e.Reason != "" {
				reason += " (" + e.Reason + ")"
			}
			e.Reason = reason
		case e.Reason == "":
			e.Reason = why
		}
		if e.State == api.DrainLeaseLeft {
			left = append(left, *e)
		}
	}
	// The drain's record shows its end only once its events are in the
	// log: a client that sees the drain incomplete (rialto node drain
	// exits then) finds each left lease's lease.drain.left already there.
	d := dr.d
	d.FinishedAt = s.now()
	if len(left) == 0 {
		d.State = api.DrainDone
	} else {
		d.State = api.DrainIncomplete
	}
	dr.mu.Unlock()
	defer func() {
		dr.mu.Lock()
		dr.d.FinishedAt, dr.d.State = d.FinishedAt, d.State
		dr.mu.Unlock()
	}()
	sort.Slice(left, func(i, j int) bool { return left[i].LeaseID < left[j].LeaseID })
	for _, e := range left {
		// The tenant's event stream is how its borrower learns.
		s.event(ctx, api.Event{Type: "lease.drain.left", Subject: e.LeaseID, State: string(api.LeaseActive),
			Message: fmt.Sprintf("node %s is being drained, but this lease stays on it: %s", n.Name, e.Reason)})
	}
	if d.State == api.DrainDone {
		var what []string
		if moved > 0 || ended == 0 {
			what = append(what, fmt.Sprintf("%d lease(s) moved off it", moved))
		}
		if ended > 0 {
			// Lost with the node, released or expired: the drain's record
			// says which (GET /v1/nodes/{id}/drain), each tenant its
			// lease's events.
			what = append(what, fmt.Sprintf("%d lease(s) ended on it without moving", ended))
		}
		s.event(ctx, api.Event{Type: "node.drained", Subject: n.ID, State: string(n.State),
			Message: fmt.Sprintf("%s holds nothing: %s in %v; it stays cordoned", n.Name, strings.Join(what, ", "), d.FinishedAt.Sub(d.StartedAt).Round(time.Millisecond))})
		s.log.Info("node drained", "node", n.ID, "leases", len(d.Leases), "moved", moved, "ended", ended)
		return
	}
	// A node's events are every tenant's: they name no lease (each
	// lease's tenant has its lease.drain.left above, the operator the
	// drain's record, GET /v1/nodes/{id}/drain).
	s.event(ctx, api.Event{Type: "node.drain.incomplete", Subject: n.ID, State: string(n.State),
		Message: fmt.Sprintf("%s: %d lease(s) left on it: %s", n.Name, len(left), why)})
	s.log.Warn("node drain incomplete", "node", n.ID, "left", len(left), "why", why)
}
