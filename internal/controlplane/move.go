package controlplane

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/lifecycle"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/resource"
)

// Moving a lease's part to another lender while its borrower uses it
// (docs/operations.md, "Moving leases and draining nodes"). A move is
// placed and written open at once (lifecycle.MoveStarted: the destination
// is held in the store), then run in the background by the control plane:
//
//  1. the destination receives (POST /agent/v1/transfers/in: a range
//     served under a token for this transfer only);
//  2. the source copies to it (POST /agent/v1/transfers/out) in passes,
//     holds the borrower's writes for the last one and reports "ready";
//  3. the control plane seals the source (no lapse any more), commits the
//     destination (it serves the part under a new export name until the
//     lease's expiry, which the commit brings: the lease may have been
//     renewed since the TransferIn), points
//     the lease at it (lifecycle.MoveDone: the commit point) and commits
//     the source (it retires the old export cleanly, tears it down and
//     wipes it);
//  4. anything going wrong before the commit point aborts both lenders
//     (lifecycle.MoveFailed): the part is served where it was.
//
// The moves of one request run one part after the other. Moves are
// recorded in the store (lease_moves), their progress in memory; a
// control-plane restart aborts the moves that had not committed and
// finishes those that had (recoverMoves).

// Move timing.
const (
	// moveMaxTime bounds a move: the destination gives it up (and wipes)
	// after it.
	moveMaxTime = 6 * time.Hour
	// moveHold is how long a source holds the borrower's writes, once
	// ready, for the control plane to seal (api.TransferOutRequest).
	moveHold = 30 * time.Second
	// moveCallTimeout bounds one call to a lender during a move. No call
	// waits for a borrower's write payload, which may take longer: the
	// source answers TransferOut at once and starts marking the writes in
	// the background (a write under way whose payload still arrives is
	// waited for up to a minute: nbd.Server.MoveWaitLimit,
	// donor.RefusalWaitLimit), as it copies and holds the writes for the
	// last pass (the same wait), all followed through TransferStatus. A
	// source's commit finds the writes held (none under way): the old
	// export's retirement waits for the reads under way and the replies,
	// within the call's bound for NBD (the connections close when it
	// ends), RefusalWait (5 s) at most for memory.
	moveCallTimeout = 30 * time.Second
	// keepMoves is how long an ended move stays in memory (its progress).
	keepMoves = time.Hour
	// moveTouch is how often a replica of a shared store records that its
	// open moves still run (touchMoves); moveOrphanAfter is how long an
	// open move may go untouched before the elected replica takes it for
	// abandoned and ends it (recoverMoves).
	moveTouch       = followRefresh
	moveOrphanAfter = 6 * moveTouch
	// moveTenant is the tenant moves place under: a move's destination
	// is the lease's part again, not a new lease of its tenant's quota.
	moveTenant = "rialto/move"
)

// runner owns background goroutines: it cancels them and waits for them
// at close.
type runner struct {
	mu      sync.Mutex
	cancels map[*struct{}]context.CancelCauseFunc
	closed  bool
	wg      sync.WaitGroup
}

// errStopped is why the work of a control plane that stops is given up.
var errStopped = errors.New("the control plane stopped")

// start runs f in a goroutine the runner owns; stop ends it early, with
// a cause (context.Cause of f's ctx). ok is false once the runner is
// closed.
func (rn *runner) start(f func(ctx context.Context)) (stop context.CancelCauseFunc, ok bool) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.closed {
		return func(error) {}, false
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	key := new(struct{})
	if rn.cancels == nil {
		rn.cancels = map[*struct{}]context.CancelCauseFunc{}
	}
	rn.cancels[key] = cancel
	rn.wg.Add(1)
	go func() {
		defer rn.wg.Done()
		defer func() {
			rn.mu.Lock()
			delete(rn.cancels, key)
			rn.mu.Unlock()
			cancel(nil)
		}()
		f(ctx)
	}()
	return cancel, true
}

// close stops the goroutines and waits for them.
func (rn *runner) close() {
	rn.mu.Lock()
	rn.closed = true
	for _, c := range rn.cancels {
		c(errStopped)
	}
	rn.mu.Unlock()
	rn.wg.Wait()
}

// movers is the server's moves under way (and ended recently) and the
// goroutines that run them.
type movers struct {
	runner
	mu        sync.Mutex
	runs      map[string]*moveRun
	recovered bool

	moves  *prometheus.CounterVec
	bytes  prometheus.Counter
	active prometheus.Gauge
}

// moveRun is one move: its record and live progress.
type moveRun struct {
	mu sync.Mutex
	m  api.Move
	// wmu orders the run's writes of its state to the store with the
	// touches of a replica (touchMoves): the last written is the latest.
	wmu sync.Mutex
	// lastEvent: the progress last reported in the event stream.
	lastPass    int
	lastPercent int
}

func (r *moveRun) get() api.Move {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m
}

func (r *moveRun) update(f func(m *api.Move)) api.Move {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(&r.m)
	r.m.UpdatedAt = time.Now().UTC()
	return r.m
}

func (ms *movers) init(reg prometheus.Registerer) {
	ms.moves = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_moves_total",
		Help: "Lease part moves by result (done, failed)."}, []string{"result"})
	ms.bytes = prometheus.NewCounter(prometheus.CounterOpts{Name: "rialto_moved_bytes_total",
		Help: "Bytes the lenders sent moving lease parts (every pass), as they reported them."})
	ms.active = prometheus.NewGauge(prometheus.GaugeOpts{Name: "rialto_moves_active", Help: "Lease part moves under way."})
	reg.MustRegister(ms.moves, ms.bytes, ms.active)
	for _, r := range []string{"done", "failed"} {
		ms.moves.WithLabelValues(r)
	}
}

func (ms *movers) add(r *moveRun) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.runs == nil {
		ms.runs = map[string]*moveRun{}
	}
	ms.runs[r.m.ID] = r
	// Forget moves ended long ago.
	for id, o := range ms.runs {
		if m := o.get(); m.Done() && time.Since(m.UpdatedAt) > keepMoves {
			delete(ms.runs, id)
		}
	}
}

func (ms *movers) run(id string) *moveRun {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.runs[id]
}

// incomingParts returns, by lease, the destinations on node of the moves
// under way: its heartbeat may list a lease before the lease points at
// the part it received, which it must keep serving.
func (ms *movers) incomingParts(nodeID string) map[string][]api.PartRef {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var out map[string][]api.PartRef
	for _, r := range ms.runs {
		if m := r.get(); m.To.NodeID == nodeID && !m.Done() {
			if out == nil {
				out = map[string][]api.PartRef{}
			}
			out[m.LeaseID] = append(out[m.LeaseID], api.PartRef{DeviceID: m.To.DeviceID, Offset: m.To.Offset, Length: m.To.Length})
		}
	}
	return out
}

// Close stops the moves and drains under way (their lenders are told to
// give them up) and waits for them. The server still answers requests.
func (s *Server) Close() error {
	s.drains.close()
	s.mv.close()
	return nil
}

func (s *Server) mover() (store.Mover, error) {
	m, ok := s.st.(store.Mover)
	if !ok {
		return nil, fmt.Errorf("%w: this control plane's store cannot record moves", ErrUnavailable)
	}
	return m, nil
}

func (s *Server) xlender() transferLender { return s.xfer }

// beginMove performs lifecycle.BeginMove.
func (s *Server) beginMove(ctx context.Context, a lifecycle.BeginMove) error {
	mv, err := s.mover()
	if err == nil {
		err = mv.BeginMove(ctx, a.Move, a.Event)
	}
	s.res.Invalidate() // the destination is held in the store now
	return err
}

// finishMove performs lifecycle.FinishMove.
func (s *Server) finishMove(ctx context.Context, l api.Lease, a lifecycle.FinishMove) (api.Lease, error) {
	mv, err := s.mover()
	if err != nil {
		return l, err
	}
	out, err := mv.FinishMove(ctx, a.Move.ID, a.URI, a.Event.At, a.Event)
	s.res.Invalidate()
	if err == nil {
		s.log.Info("lease part moved", "lease", l.ID, "part", a.Move.Part, "from", a.Move.From.NodeID, "to", a.Move.To.NodeID)
	}
	return out, err
}

// adoptPart performs lifecycle.AdoptPart.
func (s *Server) adoptPart(ctx context.Context, a lifecycle.AdoptPart) (api.Lease, error) {
	mv, err := s.mover()
	if err != nil {
		return api.Lease{}, err
	}
	out, err := mv.AdoptPart(ctx, a.Move, a.URI, a.Event)
	s.res.Invalidate()
	if err == nil {
		s.log.Warn("lease part adopted where it is served: its recorded lender does not serve it (the control plane's database restored from an older backup?)",
			"lease", a.Move.LeaseID, "part", a.Move.Part, "from", a.Move.From.NodeID, "to", a.Move.To.NodeID)
	}
	return out, err
}

// endMove performs lifecycle.EndMove (failures are logged: the move's
// record stays open and the next restart's recovery ends it).
func (s *Server) endMove(ctx context.Context, a lifecycle.EndMove) {
	mv, err := s.mover()
	if err == nil {
		ev := a.Event
		err = mv.EndMove(ctx, a.Move.ID, a.State, a.Error, a.Move.Copied, s.now(), &ev)
	}
	if err != nil {
		s.log.Warn("recording the end of a move", "move", a.Move.ID, "err", err)
	}
	s.res.Invalidate()
	if r := s.mv.run(a.Move.ID); r != nil {
		r.update(func(m *api.Move) {
			if !m.Done() {
				m.State, m.Error = a.State, a.Error
			}
		})
	}
	if s.mv.moves != nil {
		s.mv.moves.WithLabelValues(a.State).Inc()
	}
}

// movedExport is the export name of part i of a lease after move id: a
// new name, so that the old URI stops working and a borrower can tell the
// part moved (stripe's attachments count no write lost then).
func movedExport(credential string, i int, id string) string {
	m := hmac.New(sha256.New, []byte(credential))
	m.Write([]byte("part/" + strconv.Itoa(i) + "/move/" + id))
	return "rlp_" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// exportOf is the export name (the credential) in a part's URI.
func exportOf(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil || u.Path == "" || u.Path == "/" {
		return "", errors.New("the part has no usable URI")
	}
	return strings.TrimPrefix(u.Path, "/"), nil
}

// moveTarget is where a move may go: a node or a device (else placement
// chooses, away from the part's node). exclusive: the device is lent
// whole only.
type moveTarget struct {
	node, device string
	exclusive    bool
	// role is an accel part's role and config (read from its lender):
	// its new slot must be on a device that offers the role and, for a
	// share, be empty or serve the same gateway.
	role *api.RoleConfigResponse
}

// wholePart reports whether l's parts are whole devices: a dedicated
// block or memory lease, whose part may move onto a whole device.
func wholePart(l api.Lease) bool {
	return l.Mode == api.ModeDedicated && (l.Kind == api.KindBlock || l.Kind == api.KindMemory)
}

// moveLease starts moving parts of lease id (POST /v1/leases/{id}/move).
func (s *Server) moveLease(ctx context.Context, p principal, id string, req api.MoveRequest) ([]api.Move, error) {
	if _, err := s.mover(); err != nil {
		return nil, err
	}
	l, err := s.getLease(ctx, p, id)
	if err != nil {
		return nil, err
	}
	if l.State != api.LeaseActive {
		return nil, fmt.Errorf("%w: lease %s is %s; only an active lease moves", ErrConflict, id, l.State)
	}
	if l.Kind != api.KindBlock && l.Kind != api.KindMemory {
		return nil, fmt.Errorf("%w: lease %s is %s %s lease; block and memory leases move (an accelerator lease's slot is placed again by a node's drain)", ErrInvalid, id, l.Kind.Article(), l.Kind)
	}
	var parts []int
	if req.Part != nil {
		if *req.Part < 0 || *req.Part >= len(l.Parts) {
			return nil, fmt.Errorf("%w: lease %s has %d part(s), not a part %d", ErrInvalid, id, len(l.Parts), *req.Part)
		}
		parts = []int{*req.Part}
	} else {
		for i := range l.Parts {
			parts = append(parts, i)
		}
	}
	t, err := s.resolveTarget(ctx, l, parts, req)
	if err != nil {
		return nil, err
	}
	who := "moved by tenant " + p.tenant
	return s.startMoves(ctx, l, parts, t, who)
}

// resolveTarget checks a move request's destination for parts of l.
func (s *Server) resolveTarget(ctx context.Context, l api.Lease, parts []int, req api.MoveRequest) (moveTarget, error) {
	var t moveTarget
	kind := l.Kind
	if req.ToDevice != "" {
		devs, err := s.st.Devices(ctx)
		if err != nil {
			return t, err
		}
		for _, d := range devs {
			if d.ID == req.ToDevice {
				if d.Kind != kind {
					return t, fmt.Errorf("%w: device %s is %s, not %s", ErrInvalid, d.ID, d.Kind, kind)
				}
				if req.ToNode != "" && req.ToNode != d.NodeID {
					return t, fmt.Errorf("%w: device %s is not on node %s", ErrInvalid, d.ID, req.ToNode)
				}
				if d.Sharing == "exclusive" && !wholePart(l) {
					// An exclusive device is lent whole only: a part of a
					// shared or composed lease would hold it whole.
					return t, fmt.Errorf("%w: device %s is exclusive (lent whole only): only the part of a whole-device (dedicated) lease moves onto it; lease %s is %s",
						ErrInvalid, d.ID, l.ID, l.Mode)
				}
				if d.Sharing == "exclusive" && len(parts) > 1 {
					return t, fmt.Errorf("%w: device %s is exclusive: move one part onto it (--part)", ErrInvalid, d.ID)
				}
				t.device, t.exclusive = d.ID, d.Sharing == "exclusive"
				return t, nil
			}
		}
		return t, fmt.Errorf("%w: device %s not found", ErrNotFound, req.ToDevice)
	}
	if req.ToNode != "" {
		n, err := s.findNode(ctx, req.ToNode)
		if err != nil {
			return t, err
		}
		t.node = n.ID
	}
	return t, nil
}

// findNode finds a node by ID or name (pickNode).
func (s *Server) findNode(ctx context.Context, ref string) (api.Node, error) {
	nodes, err := s.st.Nodes(ctx)
	if err != nil {
		return api.Node{}, err
	}
	return pickNode(nodes, ref)
}

// pickNode finds the node ref names among nodes: the node of that ID, or
// else the one of that name. Names are not unique (another machine may
// join under a removed node's name): a node that is not removed is
// preferred to removed ones, and a name that still names several is
// ambiguous (409: give the ID).
func pickNode(nodes []api.Node, ref string) (api.Node, error) {
	switch ns := api.NodesNamed(nodes, ref); len(ns) {
	case 0:
		return api.Node{}, fmt.Errorf("%w: node %s not found", ErrNotFound, ref)
	case 1:
		return ns[0], nil
	default:
		return api.Node{}, fmt.Errorf("%w: node name %s is ambiguous: nodes %s have it; give the node's ID", ErrConflict, ref, api.NodeIDsAndStates(ns))
	}
}

// startMoves places and opens a move for each of l's parts listed (all or
// none: a part that cannot be placed ends the moves already opened) and
// runs them in the background, one after the other.
func (s *Server) startMoves(ctx context.Context, l api.Lease, parts []int, t moveTarget, reason string) ([]api.Move, error) {
	ms, _, err := s.startMovesStop(ctx, l, parts, t, reason)
	return ms, err
}

// startMovesStop is startMoves; stop gives the moves up (those not yet
// committed fail, the parts staying where they are).
func (s *Server) startMovesStop(ctx context.Context, l api.Lease, parts []int, t moveTarget, reason string) ([]api.Move, context.CancelCauseFunc, error) {
	var runs []*moveRun
	undo := func(why string) {
		for _, r := range runs {
			m := r.get()
			s.endMove(ctx, lifecycle.MoveEnded(l, m, api.MoveFailed, why, s.now()))
		}
	}
	for _, i := range parts {
		to, err := s.placeMove(ctx, l, i, t)
		if err != nil {
			undo("another part of the request could not be placed")
			return nil, nil, err
		}
		now := s.now()
		m := api.Move{ID: resource.NewID("move"), LeaseID: l.ID, Part: i, Kind: l.Kind, State: api.MovePending,
			From: stripURI(l.Parts[i]), To: to, Size: l.Parts[i].Length, Reason: reason, StartedAt: now, UpdatedAt: now}
		if _, _, err := s.apply(ctx, l, lifecycle.MoveStarted{Move: m}); err != nil {
			undo("another part of the request could not start")
			if errors.Is(err, store.ErrConflict) || errors.Is(err, lifecycle.ErrRefused) {
				return nil, nil, fmt.Errorf("%w: %v", ErrConflict, refused(err))
			}
			if errors.Is(err, store.ErrCapacity) {
				return nil, nil, fmt.Errorf("%w: the destination was taken meanwhile; try again", ErrUnavailable)
			}
			return nil, nil, err
		}
		r := &moveRun{m: m}
		s.mv.add(r)
		runs = append(runs, r)
	}
	s.mv.active.Add(float64(len(runs)))
	stop, ok := s.mv.start(func(ctx context.Context) {
		for _, r := range runs {
			s.runMove(ctx, r)
		}
	})
	if !ok {
		s.mv.active.Add(-float64(len(runs)))
		undo("the control plane is stopping")
		return nil, nil, fmt.Errorf("%w: the control plane is stopping", ErrUnavailable)
	}
	out := make([]api.Move, len(runs))
	for i, r := range runs {
		out[i] = r.get()
	}
	return out, stop, nil
}

func stripURI(p api.Part) api.Part { p.URI = ""; return p }

// placeMove finds a destination for part i of l: a range of the same
// length on a device of the same kind, where t says, else anywhere but
// the part's node (placement skips cordoned nodes). The part of a
// whole-device lease may also go to a whole unused device at least as
// large, exclusive ones included (named by t, or when no range fits):
// it then takes that device whole, its first Length bytes holding the
// part, so the lease keeps its size.
// skipPartLender is why a move's placement skips the part's own node
// (snapshot says it per device in its own words).
const skipPartLender = "the part's lender"

func (s *Server) placeMove(ctx context.Context, l api.Lease, i int, t moveTarget) (api.Part, error) {
	p := l.Parts[i]
	req := api.LeaseRequest{Kind: l.Kind, Mode: api.ModeShared, Size: p.Length, Count: 1, Borrower: l.Borrower}
	var skip map[string]string
	switch {
	case t.device != "":
		req.Affinity = []string{t.device}
	case t.node != "":
		req.Affinity = []string{t.node}
	default:
		skip = map[string]string{p.NodeID: skipPartLender}
	}
	if l.Kind == api.KindAccel {
		req.Mode, req.Size, req.Count = "", 0, int(p.Length/api.SlotUnits)
		if t.role != nil {
			// Dedicated slots too: only a device that offers the role
			// (placement.Device.Roles) may take them.
			req.Role, req.RoleConfig = t.role.Role, t.role.RoleConfig
		}
		if l.Mode == api.ModeShared {
			if t.role == nil {
				return api.Part{}, fmt.Errorf("%w: part %d of lease %s is a share of a gateway's slot: it moves only with its role (a drain places it again)", ErrInvalid, i, l.ID)
			}
			req.Mode, req.Count, req.Share = api.ModeShared, 1, float64(p.Length)/api.SlotUnits
		}
	}
	var plan api.Plan
	var err error
	if !t.exclusive {
		plan, err = s.placeDestination(ctx, l.Kind, req, skip)
	}
	if wholePart(l) && (t.exclusive || err != nil) {
		whole := req
		whole.Mode, whole.Whole = api.ModeDedicated, true
		wplan, werr := s.placeDestination(ctx, l.Kind, whole, skip)
		if werr == nil && len(wplan.Parts) == 1 && wplan.Parts[0].Length >= p.Length {
			to := wplan.Parts[0]
			to.Offset, to.Length = 0, p.Length
			return to, nil
		}
		if t.exclusive {
			plan, err = wplan, werr
		}
	}
	if err != nil {
		why := err.Error()
		if len(plan.Explanation) > 0 {
			// One line: the explanation's indented lines, unindented.
			lines := make([]string, len(plan.Explanation))
			for k, e := range plan.Explanation {
				lines[k] = strings.TrimSpace(e)
			}
			why = strings.Join(lines, "; ")
		}
		return api.Part{}, fmt.Errorf("%w: no destination for part %d of lease %s: %s", ErrInfeasible, i, l.ID, why)
	}
	if len(plan.Parts) != 1 || plan.Parts[0].Length != p.Length {
		return api.Part{}, fmt.Errorf("%w: no destination of %d for part %d of lease %s (placement offered %d part(s))", ErrInfeasible, p.Length, i, l.ID, len(plan.Parts))
	}
	return plan.Parts[0], nil
}

// placeDestination places a move's destination, holding nothing (the
// move's write holds it: BeginMove).
func (s *Server) placeDestination(ctx context.Context, kind api.Kind, req api.LeaseRequest, skip map[string]string) (api.Plan, error) {
	id := resource.NewID("place")
	// A shared accel destination is held with its gateway key, so that no
	// other gateway's share takes its slot before the move is written.
	plan, err := s.res.Place(ctx, hold{id: id, tenant: moveTenant, kind: kind, demand: store.Demand{Gateway: requestGateway(req)}}, req, skip, s.now())
	s.res.Release(id)
	return plan, err
}

// runMove runs one move to its end.
func (s *Server) runMove(ctx context.Context, r *moveRun) {
	defer s.mv.active.Add(-1)
	m := r.get()
	if err := s.transfer(ctx, r); err != nil {
		m = r.get()
		if ctx.Err() != nil {
			err = fmt.Errorf("given up: %w", context.Cause(ctx))
		}
		s.log.Warn("lease part move failed; the part stays where it was", "move", m.ID, "lease", m.LeaseID, "part", m.Part, "err", err)
		s.abortMove(m)
		actx, cancel := context.WithTimeout(context.Background(), moveCallTimeout)
		defer cancel()
		s.dropDestination(actx, m)
		l, lerr := s.st.Lease(actx, m.LeaseID)
		if lerr != nil {
			l = api.Lease{ID: m.LeaseID}
		}
		// The move's error and event say it in plain words (the log has
		// the whole error).
		if _, todo, _ := s.apply(actx, l, lifecycle.MoveFailed{Move: m, Why: plainText(err)}); len(todo) > 0 {
			s.moveActions(todo)
		}
	}
}

// moveActions performs the actions a move step leaves to its caller.
func (s *Server) moveActions(todo []lifecycle.Action) {
	for _, a := range todo {
		if a, ok := a.(lifecycle.AbortMove); ok {
			s.abortMove(a.Move)
		}
	}
}

// dropDestination tears lease m.LeaseID down on the destination of move
// m, which failed, when nothing of the lease is to stay there: its node
// was removed (whatever of a lease is on a removed node is lost), or the
// lease is no longer reserved or active. A destination that took the
// part over (its commit answered) before the lease could be pointed at it
// serves the part under the move's export name, which no lease names, and
// refuses the move's abort (a committed transfer is done); the answers to
// its heartbeats would tell it to drop the export (it serves no part of
// the lease), but a removed node's heartbeats are refused, and its agent,
// cut off from the control plane, would keep the part, served, until the
// lease's expiry or until it joined again. The teardown wipes the range;
// an agent that had not taken the part over gives the transfer up and
// wipes what it received, as the abort would have had it (an abort a
// removed node's agent may not have had: see below). The range, which the
// move's end frees, stays marked as being wiped until the destination
// answers (a removed node's ranges left the pool with it; a node down is
// told by its heartbeats' answers once it is back). The destination of a
// live lease on a node that is not removed is left to its heartbeats'
// answers, which keep only the lease's parts there: a teardown of the
// lease there would also tear down a part the lease may have there.
//
// With a cluster CA, the removal revoked the certificates of the node,
// which its agent still presents: the move's calls to it (its commit) are
// refused on any connection opened since, and so would a plain Teardown
// be. The teardown of a removed destination is teardownRemoved's, as a
// removal's own are (dropRemoved), and the move's abort before it is
// abortRemoved's: with the node's other calls of the kind, at most
// maxRemovedTeardowns at a time, each accepts the certificates the
// removal revoked, as the store recorded them with the removal
// (removalRevoked), whichever replica removed the node and whichever runs
// the move, before or after a restart (recoverMoves). A node that joined again since is not removed: it is
// called as any other, its agent presenting the certificate of that join.
func (s *Server) dropDestination(ctx context.Context, m api.Move) {
	rec, err := s.st.Node(ctx, m.To.NodeID)
	if err != nil {
		s.log.Warn("a failed move's destination: its node", "move", m.ID, "node", m.To.NodeID, "err", err)
		return
	}
	l, err := s.st.Lease(ctx, m.LeaseID)
	if err != nil {
		s.log.Warn("a failed move's destination: its lease", "move", m.ID, "lease", m.LeaseID, "err", err)
		return
	}
	removed := rec.State == api.NodeRemoved
	if !removed && (l.State == api.LeaseReserved || l.State == api.LeaseActive) {
		return
	}
	to := api.Part{NodeID: m.To.NodeID, DeviceID: m.To.DeviceID, Offset: m.To.Offset, Length: m.To.Length}
	if !removed {
		// With the lease's own ranges there, marked by its end already:
		// the mark of the lease on a node is one.
		on := api.Lease{ID: l.ID, Kind: l.Kind, Mode: l.Mode}
		for _, p := range l.Parts {
			if p.NodeID == to.NodeID && !p.Lost() && (p.DeviceID != to.DeviceID || p.Offset != to.Offset) {
				on.Parts = append(on.Parts, p)
			}
		}
		on.Parts = append(on.Parts, to)
		s.markWiping(ctx, on, "")
	}
	if rec.State == api.NodeDown {
		return
	}
	req := api.TeardownRequest{LeaseID: l.ID}
	if removed {
		// With the node's other teardowns (its removal's, other failed
		// moves'), accepting the certificates its removal revoked, as
		// the store recorded them: this replica may not be the one that
		// removed the node.
		if err := s.teardownRemoved(ctx, rec, s.removalRevoked(ctx, rec.ID), req); err != nil {
			s.log.Warn("a failed move's destination, removed, did not tear its lease down; it is told once it joins again", "move", m.ID, "lease", l.ID, "node", rec.ID, "err", err)
			return
		}
	} else {
		tctx, cancel := context.WithTimeout(ctx, s.cfg.PrepareTimeout)
		err := s.lender.Teardown(tctx, rec.Node, rec.AgentKey, req)
		cancel()
		if err != nil {
			s.log.Warn("a failed move's destination did not tear its lease down; its heartbeats' answers will tell it", "move", m.ID, "lease", l.ID, "node", rec.ID, "err", err)
			return
		}
	}
	if !removed {
		s.wiped(ctx, l.ID, rec.ID) // the lender answers a teardown once its wipes are done
	}
	s.log.Info("a failed move's destination tore its lease down", "move", m.ID, "lease", l.ID, "node", rec.ID, "removed", removed)
}

// abortMove tells both lenders to give move m up (best effort: a lender
// that misses it gives up on its own, the destination at the transfer's
// expiry, the source when its hold lapses or its export's teardown).
//
// A lender whose node was removed meanwhile (the destination, typically:
// a move onto a node removed before its commit) is told as the store
// reads it now, not as the move's cache of nodes may still hold it, with
// abortRemoved: with a cluster CA, the removal revoked the certificates
// its agent still presents, which a plain TransferAbort refuses on any
// connection opened since, and the abort accepts those the store
// recorded with the removal (removalRevoked), on whichever replica runs
// the move. The agent stops receiving and wipes what it received at
// once, before the failed move's teardown (dropDestination) comes.
func (s *Server) abortMove(m api.Move) {
	ctx, cancel := context.WithTimeout(context.Background(), moveCallTimeout)
	defer cancel()
	x := s.xlender()
	for _, nodeID := range []string{m.From.NodeID, m.To.NodeID} {
		n, err := s.nodeRecord(ctx, nodeID)
		if err != nil {
			continue
		}
		if now, err := s.st.Node(ctx, nodeID); err == nil && now.State == api.NodeRemoved {
			if err := s.abortRemoved(ctx, now, s.removalRevoked(ctx, nodeID), m.ID); err != nil {
				s.log.Debug("aborting a transfer on a removed node", "move", m.ID, "node", nodeID, "err", err)
			}
			continue
		}
		if _, err := x.TransferAbort(ctx, n.Node, n.AgentKey, m.ID); err != nil {
			s.log.Debug("aborting a transfer", "move", m.ID, "node", nodeID, "err", err)
		}
	}
}

// transfer drives one move on its two lenders (see the file's comment);
// an error means the lease does not point at the destination.
func (s *Server) transfer(ctx context.Context, r *moveRun) error {
	x := s.xlender()
	m := r.get()
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, moveCallTimeout) }
	l, err := s.st.Lease(ctx, m.LeaseID)
	if err != nil {
		return err
	}
	if l.State != api.LeaseActive || m.Part >= len(l.Parts) {
		return fmt.Errorf("the lease is %s", l.State)
	}
	src, err := s.nodeRecord(ctx, m.From.NodeID)
	if err != nil {
		return err
	}
	dst, err := s.nodeRecord(ctx, m.To.NodeID)
	if err != nil {
		return err
	}
	oldExport, err := exportOf(l.Parts[m.Part].URI)
	if err != nil {
		return err
	}
	s.setMoveState(ctx, r, api.MoveCopying)
	devName := s.res.DeviceNames(ctx)[m.To.DeviceID]
	// The call's bound starts before Now is stamped: the destination
	// deducts it (Part.TimeoutSeconds) from the times left.
	cctx, cancel := call()
	now := s.now()
	part := api.PrepareRequest{LeaseID: l.ID, Kind: l.Kind, Mode: l.Mode, DeviceID: m.To.DeviceID, DeviceName: devName,
		Offset: m.To.Offset, Length: m.To.Length, Export: movedExport(l.Credential, m.Part, m.ID), ExpiresAt: l.ExpiresAt, Now: now,
		TimeoutSeconds: moveCallTimeout.Seconds(), BandwidthCap: l.BandwidthCap, IOPSCap: l.IOPSCap}
	in, err := x.TransferIn(cctx, dst.Node, dst.AgentKey, api.TransferInRequest{ID: m.ID, Token: resource.NewSecret("rmt"), Part: part,
		ExpiresAt: now.Add(moveMaxTime), Now: now})
	cancel()
	if err != nil {
		return fmt.Errorf("the destination did not receive: %w", err)
	}
	// Answered at once: a start that fails (the destination out of
	// reach, the writes not marked) shows in the status followed below.
	cctx, cancel = call()
	_, err = x.TransferOut(cctx, src.Node, src.AgentKey, api.TransferOutRequest{ID: m.ID, LeaseID: l.ID, Export: oldExport, DestURI: in.URI,
		HoldSeconds: moveHold.Seconds()})
	cancel()
	if err != nil {
		return fmt.Errorf("the source did not start copying: %w", err)
	}
	// Follow the copy until the source is ready (writes held, copy
	// durable at the destination).
	state := api.TransferCopying
	failures := 0
	for state != api.TransferReady {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wctx, cancel := context.WithTimeout(ctx, moveCallTimeout+time.Minute)
		st, err := x.TransferStatus(wctx, src.Node, src.AgentKey, m.ID, state)
		cancel()
		if err != nil {
			if failures++; failures > 5 {
				return fmt.Errorf("the source stopped answering: %w", err)
			}
			t := time.NewTimer(time.Duration(failures) * 200 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			continue
		}
		failures = 0
		s.progress(ctx, r, st)
		switch st.State {
		case api.TransferCopying, api.TransferReady:
			state = st.State
		default:
			return errors.New(transferError(src.Node, dst.Node, st))
		}
	}
	// A destination removed (or down) meanwhile does not take the part:
	// the store would refuse the commit point anyway (Core.FinishMove),
	// after the destination began to serve it.
	if err := s.destinationUsable(ctx, dst.Node); err != nil {
		return err
	}
	s.setMoveState(ctx, r, api.MoveSwitching)
	cctx, cancel = call()
	_, err = x.TransferSeal(cctx, src.Node, src.AgentKey, m.ID)
	cancel()
	if err != nil {
		return fmt.Errorf("sealing the source: %w", err)
	}
	// The destination serves the part from the commit on: it learns the
	// lease's expiry as it is now (renewed since the TransferIn, maybe:
	// a lender that only receives a part of the lease does not report
	// it, and no heartbeat answer renewed it there), counted as a
	// prepare's (Now stamped after the call's bound starts).
	if l, err = s.st.Lease(ctx, m.LeaseID); err != nil {
		return err
	}
	if l.State != api.LeaseActive {
		// Lost (its source removed or down), released or expired while it
		// moved: the destination does not serve it, not for a moment.
		return fmt.Errorf("the lease became %s during the move", l.State)
	}
	cctx, cancel = call()
	cr, err := x.TransferCommit(cctx, dst.Node, dst.AgentKey, m.ID, api.TransferCommitRequest{ExpiresAt: l.ExpiresAt, Now: s.now(),
		TimeoutSeconds: moveCallTimeout.Seconds()})
	cancel()
	if err != nil {
		return fmt.Errorf("the destination did not take the part over: %w", err)
	}
	// The commit point: the lease points at the destination.
	if l, err = s.st.Lease(ctx, m.LeaseID); err != nil {
		return err
	}
	m = r.get()
	if _, todo, err := s.apply(ctx, l, lifecycle.MoveDone{Move: m, URI: cr.URI}); err != nil {
		s.moveActions(todo)
		return fmt.Errorf("pointing the lease at the destination: %w", err)
	}
	s.releaseSource(ctx, r, src)
	return nil
}

// destinationUsable returns an error that says why a move's destination,
// node dst as the move read it, may not take the part now: it was removed
// or went down since.
func (s *Server) destinationUsable(ctx context.Context, dst api.Node) error {
	rec, err := s.st.Node(ctx, dst.ID)
	if err != nil {
		return fmt.Errorf("reading the destination %s: %w", nodeName(dst), err)
	}
	switch rec.State {
	case api.NodeRemoved:
		return fmt.Errorf("the destination %s was removed during the move", nodeName(rec.Node))
	case api.NodeDown:
		return fmt.Errorf("the destination %s went down during the move", nodeName(rec.Node))
	}
	return nil
}

// releaseSource commits a move on its source (which retires the old
// export, tears it down and wipes it) and ends the move: the lease already
// points at the destination, so the move is done whatever the source says;
// a source that does not answer is told again by recoverMoves after a
// restart, and drops the old export at its next heartbeat, whose answer
// lists the lease's parts it is to serve (none, or others: KeepOn.Parts).
func (s *Server) releaseSource(ctx context.Context, r *moveRun, src store.NodeRecord) {
	x := s.xlender()
	m := r.get()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, moveCallTimeout)
		_, err = x.TransferCommit(cctx, src.Node, src.AgentKey, m.ID, api.TransferCommitRequest{})
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		t := time.NewTimer(time.Duration(attempt+1) * 200 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	why := ""
	if err != nil {
		why = "moved; the old lender did not confirm it let go of the part: " + plainText(err)
		s.log.Warn("the old lender of a moved part did not confirm", "move", m.ID, "node", src.ID, "err", err)
	}
	l, lerr := s.st.Lease(ctx, m.LeaseID)
	if lerr != nil {
		l = api.Lease{ID: m.LeaseID}
	}
	end := lifecycle.MoveEnded(l, m, api.MoveDone, "", s.now())
	if why != "" {
		end.Error = why
	}
	s.endMove(ctx, end)
}

// setMoveState records a move's state (in memory and in the store).
func (s *Server) setMoveState(ctx context.Context, r *moveRun, state string) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	m := r.update(func(m *api.Move) { m.State = state })
	if mv, err := s.mover(); err == nil {
		if err := mv.SetMoveState(ctx, m.ID, state, m.Copied, s.now()); err != nil {
			s.log.Debug("recording a move's state", "move", m.ID, "err", err)
		}
	}
}

// progress records the source's counters and reports progress in the
// event stream at each pass and every quarter of the first.
func (s *Server) progress(ctx context.Context, r *moveRun, st api.Transfer) {
	var sent int64
	m := r.update(func(m *api.Move) {
		sent = st.Copied - m.Copied
		m.Copied, m.Skipped, m.Dirty, m.Pass, m.HeldMillis = st.Copied, st.Skipped, st.Dirty, st.Pass, st.HeldMillis
	})
	if sent > 0 {
		s.mv.bytes.Add(float64(sent))
	}
	pct := 0
	if m.Size > 0 {
		pct = int(100 * min(m.Copied+m.Skipped, m.Size) / m.Size)
	}
	r.mu.Lock()
	report := m.Pass != r.lastPass || pct/25 > r.lastPercent/25
	if report {
		r.lastPass, r.lastPercent = m.Pass, pct
	}
	r.mu.Unlock()
	if !report {
		return
	}
	msg := fmt.Sprintf("part %d: pass %d, %d%% of %s copied (%s sent, %s written meanwhile)", m.Part, max(m.Pass, 1), min(pct, 100),
		resource.FormatSize(m.Size), resource.FormatSize(m.Copied), resource.FormatSize(m.Dirty))
	if st.State == api.TransferReady {
		msg = fmt.Sprintf("part %d: copied in %d pass(es), %s sent; writes held for the switch", m.Part, m.Pass, resource.FormatSize(m.Copied))
	}
	if _, err := s.st.AppendEvent(ctx, api.Event{At: s.now(), Type: "lease.move.progress", Subject: m.LeaseID, Message: msg, State: string(api.LeaseActive)}); err != nil {
		s.log.Debug("move progress event", "err", err)
	}
}

// listMoves answers GET /v1/moves: the store's moves of the last hour (or
// of one lease, all of them) with the progress of those under way, that
// p may see.
func (s *Server) listMoves(ctx context.Context, p principal, leaseID string) ([]api.Move, error) {
	mv, err := s.mover()
	if err != nil {
		return nil, err
	}
	f := store.MoveFilter{LeaseID: leaseID}
	if leaseID != "" {
		if _, err := s.getLease(ctx, p, leaseID); err != nil {
			return nil, err
		}
	} else {
		f.Since = s.now().Add(-keepMoves)
	}
	recs, err := mv.Moves(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]api.Move, 0, len(recs))
	owner := map[string]bool{}
	for _, rec := range recs {
		m := rec.Move
		if r := s.mv.run(m.ID); r != nil {
			m = r.get()
		}
		if !p.admin && leaseID == "" {
			ok, done := owner[m.LeaseID]
			if !done {
				l, err := s.st.Lease(ctx, m.LeaseID)
				ok = err == nil && p.canSee(l)
				owner[m.LeaseID] = ok
			}
			if !ok {
				continue
			}
		}
		out = append(out, m)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].StartedAt.Before(out[j].StartedAt) })
	return out, nil
}

// getMove answers GET /v1/moves/{id}.
func (s *Server) getMove(ctx context.Context, p principal, id string) (api.Move, error) {
	mv, err := s.mover()
	if err != nil {
		return api.Move{}, err
	}
	if r := s.mv.run(id); r != nil {
		m := r.get()
		if _, err := s.getLease(ctx, p, m.LeaseID); err != nil {
			return api.Move{}, fmt.Errorf("%w: move %s not found", ErrNotFound, id)
		}
		return m, nil
	}
	recs, err := mv.Moves(ctx, store.MoveFilter{})
	if err != nil {
		return api.Move{}, err
	}
	for _, rec := range recs {
		if rec.ID == id {
			if _, err := s.getLease(ctx, p, rec.LeaseID); err != nil {
				break
			}
			return rec.Move, nil
		}
	}
	return api.Move{}, fmt.Errorf("%w: move %s not found", ErrNotFound, id)
}

// recoverMoves ends the moves a previous run of the control plane left
// open (the first sweep): one that committed is finished (its source told
// again to let go), the others are aborted on both lenders. Replicas of a
// shared store run each other's moves: there, the elected replica ends at
// every sweep the open moves that no replica touched for moveOrphanAfter
// (touchMoves: the replica that ran them died or lost the database).
func (s *Server) recoverMoves(ctx context.Context) error {
	shared := s.shared()
	s.mv.mu.Lock()
	done := s.mv.recovered && !shared
	s.mv.recovered = true
	s.mv.mu.Unlock()
	mv, ok := s.st.(store.Mover)
	if done || !ok {
		return nil
	}
	open, err := mv.Moves(ctx, store.MoveFilter{Open: true})
	if err != nil {
		return err
	}
	for _, rec := range open {
		if s.mv.run(rec.ID) != nil {
			continue // started by this run
		}
		if shared && s.now().Sub(rec.UpdatedAt) < moveOrphanAfter {
			continue // another replica's, touched lately
		}
		s.log.Info("ending a move no control plane runs any more", "move", rec.ID, "lease", rec.LeaseID, "committed", rec.Committed)
		l, err := s.st.Lease(ctx, rec.LeaseID)
		if err != nil {
			l = api.Lease{ID: rec.LeaseID}
		}
		if rec.Committed {
			if src, err := s.nodeRecord(ctx, rec.From.NodeID); err == nil {
				r := &moveRun{m: rec.Move}
				s.mv.add(r)
				s.releaseSource(ctx, r, src)
				continue
			}
			s.endMove(ctx, lifecycle.MoveEnded(l, rec.Move, api.MoveDone, "moved; the old lender was not reachable after a control-plane restart", s.now()))
			continue
		}
		why := "the control plane restarted while the part moved"
		if shared {
			why = "the control-plane replica that ran the move stopped"
		}
		s.abortMove(rec.Move)
		s.dropDestination(ctx, rec.Move)
		if _, todo, _ := s.apply(ctx, l, lifecycle.MoveFailed{Move: rec.Move, Why: why}); len(todo) > 0 {
			s.moveActions(todo)
		}
	}
	return nil
}

// touchMoves records in a shared store that this replica's open moves
// still run (their state and progress, written again with the time), so
// that the elected replica does not take them for abandoned.
func (s *Server) touchMoves(ctx context.Context) {
	mv, ok := s.st.(store.Mover)
	if !ok {
		return
	}
	s.mv.mu.Lock()
	runs := make([]*moveRun, 0, len(s.mv.runs))
	for _, r := range s.mv.runs {
		runs = append(runs, r)
	}
	s.mv.mu.Unlock()
	for _, r := range runs {
		r.wmu.Lock()
		if m := r.get(); !m.Done() {
			if err := mv.SetMoveState(ctx, m.ID, m.State, m.Copied, s.now()); err != nil {
				s.log.Debug("touching a move", "move", m.ID, "err", err)
			}
		}
		r.wmu.Unlock()
	}
}

// incomingParts returns, by lease, the destinations on node nodeID of the
// moves under way (see movers.incomingParts). Replicas of a shared store
// also look at the moves other replicas run (in the store). A store that
// cannot say fails the heartbeat's answer, which tears down nothing; the
// next heartbeat asks again.
func (s *Server) incomingParts(ctx context.Context, nodeID string) (map[string][]api.PartRef, error) {
	in := s.mv.incomingParts(nodeID)
	if !s.shared() {
		return in, nil
	}
	mv, ok := s.st.(store.Mover)
	if !ok {
		return in, nil
	}
	open, err := mv.Moves(ctx, store.MoveFilter{Open: true})
	if err != nil {
		return nil, fmt.Errorf("open moves: %w", err)
	}
	for _, m := range open {
		if m.To.NodeID != nodeID {
			continue
		}
		ref := api.PartRef{DeviceID: m.To.DeviceID, Offset: m.To.Offset, Length: m.To.Length}
		if in == nil {
			in = map[string][]api.PartRef{}
		}
		if !slices.Contains(in[m.LeaseID], ref) {
			in[m.LeaseID] = append(in[m.LeaseID], ref)
		}
	}
	return in, nil
}

// transferError is what the source's status st of a move from src to dst
// that did not end ready says, the lenders named: the agent calls them
// api.TransferThisLender and api.TransferDestination ("the destination n3
// could not be reached from n1: connection refused"); words that name
// neither say which lender gave the copy up ("the source n1 gave the copy
// up: it failed on its side (its agent's log says why)").
func transferError(src, dst api.Node, st api.Transfer) string {
	if st.Error == "" {
		return fmt.Sprintf("the source %s gave the copy up (%s)", nodeName(src), st.State)
	}
	named := strings.ReplaceAll(st.Error, api.TransferDestination, api.TransferDestination+" "+nodeName(dst))
	named = strings.ReplaceAll(named, api.TransferThisLender, nodeName(src))
	if named == st.Error {
		return fmt.Sprintf("the source %s gave the copy up: %s", nodeName(src), st.Error)
	}
	return named
}

// nodeName is how a user's words name node n: by its name, else its ID.
func nodeName(n api.Node) string {
	if n.Name != "" {
		return n.Name
	}
	return n.ID
}
