package placement

// The candidates stage of Index.Place: the usable devices for a request,
// nearest the borrower first.

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

// cand is a usable device for the request at hand, with what its order
// (cmpCand) and the options built from it need.
type cand struct {
	k1       uint64 // hops, latency, link band, packing: see candKey
	dev      int32
	dist     fabric.Distance
	latency  time.Duration // path + device
	linkUtil float64       // worst current utilisation on the path
	nLeases  int
}

// rejections collects why devices were ruled out: the first MaxRejections
// in full, and a count per constraint.
type rejections struct {
	list   []Rejection
	counts map[string]int
}

func (r *rejections) add(c, constraint, reason string) {
	r.addRejection(Rejection{Candidate: c, Constraint: constraint, Reason: reason})
}

// addDev records why device ds was ruled out, naming it as explanations
// do.
func (r *rejections) addDev(x *Index, ds *devState, constraint, reason string) {
	if len(r.list) >= MaxRejections {
		r.counts[constraint]++ // not listed: no need to name it
		return
	}
	r.addRejection(x.devRejection(ds, constraint, reason))
}

func (r *rejections) addRejection(rj Rejection) {
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[rj.Constraint]++
	if len(r.list) < MaxRejections {
		r.list = append(r.list, rj)
	}
}

// top is the constraint that ruled out the most devices (ties: the first
// in name order).
func (r *rejections) top() string {
	best, name := 0, ConstraintKind
	keys := make([]string, 0, len(r.counts))
	for k := range r.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if r.counts[k] > best {
			best, name = r.counts[k], k
		}
	}
	return name
}

// candidateList is the candidates stage of Place: the usable devices of
// q's kind nearest the borrower vertex bv, and how many devices were
// examined, or an *InfeasibleError saying why none is usable. The list is
// left unsorted (Place selects the few it needs in candidate order,
// cmpCand, without sorting them all); x.candPos maps each device on it to
// its position.
func (x *Index) candidateList(q *req, bv int32, sc *scope) ([]cand, int, error) {
	cands, _, examined := x.candidates(q, bv, sc, false)
	if len(cands) == 0 {
		return nil, examined, x.noCandidate(q, bv, sc)
	}
	if len(x.candPos) < len(x.devs) {
		x.candPos = make([]int32, len(x.devs))
	}
	for i := range cands {
		x.candPos[cands[i].dev] = int32(i)
	}
	return cands, examined, nil
}

// candidates walks devices of the kind nearest first (by fabric anchor
// group), or only the pinned ones. With detail it records why each device
// was rejected (used to explain an infeasible request; the fast path skips
// the formatting).
func (x *Index) candidates(q *req, bv int32, sc *scope, detail bool) ([]cand, rejections, int) {
	w := candWalk{x: x, q: *q, sc: *sc, bv: bv, detail: detail}
	kg := x.groups[q.Kind]
	if kg == nil {
		w.rej.add(q.Kind, ConstraintKind, "no device of kind "+q.Kind)
		return nil, w.rej, 0
	}
	order := x.groupOrder(x.anchor[bv], q.Kind)
	if len(order) < len(kg.anchors) {
		if detail {
			w.rej.add(fmt.Sprintf("%d device groups", len(kg.anchors)-len(order)), ConstraintReach, "no fabric path from "+q.borrowerName())
		}
	}
	w.out = x.candBuf[:0]
	defer func() { x.candBuf = w.out[:0] }()
	w.bt = x.tree(x.coreOf[x.anchor[bv]])
	if x.uEpoch++; x.uEpoch == 0 {
		clear(x.uStamp)
		x.uEpoch = 1
	}
	if len(x.uStamp) < x.g.Len() {
		x.uStamp = make([]uint32, x.g.Len())
		x.uVal = make([]float64, x.g.Len())
	}
	if len(q.Devices) > 0 {
		w.pinned()
	} else {
		w.nearest(kg, order)
	}
	for i := range w.out {
		w.out[i].k1 = candKey(&w.out[i], q.strategy)
	}
	return w.out, w.rej, w.examined
}

// candWalk is one walk over the devices for a request: what it looks for
// and what it found so far. It holds copies of the request and its scope:
// pointers would make them escape with out (escape analysis does not tell
// a struct's fields apart).
type candWalk struct {
	x        *Index
	q        req
	sc       scope
	bv       int32        // the borrower's vertex
	bt       *fabric.Tree // the tree distances and routes from bv use
	detail   bool         // record rejections
	out      []cand
	rej      rejections
	examined int
}

// pinned checks only the devices the request names, each once.
func (w *candWalk) pinned() {
	x, q := w.x, &w.q
	seen := make(map[string]bool, len(q.Devices))
	for _, id := range q.Devices {
		if seen[id] {
			continue
		}
		seen[id] = true
		di, ok := x.devByID[id]
		switch {
		case !ok:
			w.examined++
			if w.detail {
				w.rej.add(id, ConstraintPin, "no such device")
			}
		case x.devs[di].dev.Kind != q.Kind:
			w.examined++
			if w.detail {
				w.rej.addDev(x, &x.devs[di], ConstraintPin, "pinned device is "+x.devs[di].dev.Kind+", not "+q.Kind)
			}
		default:
			w.check(int32(di))
		}
	}
}

// nearest checks the devices on the borrower itself, then the anchor
// groups of kg in order (nearest first), until it has enough candidates
// (the goal) and has passed the nearest hop count or examined its budget.
// Large groups that cannot hold the request are skipped whole.
func (w *candWalk) nearest(kg *kindGroups, order []int32) {
	x, q, sc := w.x, &w.q, &w.sc
	// Devices on the borrower itself first: they are nearest of all.
	for _, di := range x.local[localKey{w.bv, q.Kind}] {
		w.check(di)
	}
	goal := max(defaultCandidateGoal, 2*q.Width)
	budget := 4 * goal
	lastHops := -1
	for _, a := range order {
		gh := w.bt.Dist[x.coreOf[a]].Hops
		if len(w.out) >= goal && (gh != lastHops || w.examined >= budget) {
			return
		}
		lastHops = gh
		if len(kg.devs[a]) > 16 && kg.maxFree[a] < sc.minNeed && !(sc.dedicate && kg.empty[a] > 0) {
			n := len(kg.devs[a])
			w.examined += n
			if w.detail {
				w.rej.add(fmt.Sprintf("%d devices at %s", n, x.vertexText(x.g.ID(int(a)))), ConstraintCapacity, "none free or usable enough")
			}
			continue
		}
		if len(kg.devs[a]) > 16 && len(q.Labels) > 0 && !x.labelGroup(q.Labels, a) {
			n := len(kg.devs[a])
			w.examined += n
			if w.detail {
				w.rej.add(fmt.Sprintf("%d devices at %s", n, x.vertexText(x.g.ID(int(a)))), ConstraintLabels, "no node there carries every selected label")
			}
			continue
		}
		for _, di := range kg.devs[a] {
			if x.devs[di].vertex == w.bv {
				continue // already checked
			}
			// Enough candidates: stop within a large group too. Devices
			// of one group are equally far up to their own leaf link.
			if len(w.out) >= goal && w.examined >= budget {
				return
			}
			w.check(di)
		}
	}
}

// check examines device di: it becomes a candidate, or (with detail) a
// rejection says why not.
func (w *candWalk) check(di int32) {
	x, q, sc := w.x, &w.q, &w.sc
	w.examined++
	ds := &x.devs[di]
	if ds.usable != "" {
		if w.detail {
			w.rej.addDev(x, ds, ds.usable, x.unusableReason(ds))
		}
		return
	}
	if q.Role != "" && !offers(ds.dev.Roles, q.Role) {
		if w.detail {
			w.rej.addDev(x, ds, ConstraintRole, "does not offer role "+q.Role)
		}
		return
	}
	if ds.dedicated {
		if w.detail {
			reason := "dedicated to another lease"
			if ds.exclusive {
				reason = fmt.Sprintf("exclusive, held whole by %d lease(s)", len(ds.leases))
			}
			w.rej.addDev(x, ds, ConstraintCapacity, reason)
		}
		return
	}
	if !((ds.free >= sc.minNeed && !ds.exclusive) || (sc.dedicate && x.dedicable(ds, q))) {
		if w.detail {
			constraint, reason := ConstraintCapacity, fmt.Sprintf("%s free, needs %s%s", x.amount(q.Kind, ds.free), x.amount(q.Kind, sc.minNeed), sc.minNeedOf(q.Kind))
			switch {
			case ds.exclusive && !sc.dedicate:
				constraint, reason = ConstraintExclusive, "lent whole only, and a "+modeList(false, true, true)+" lease takes a part"
			case sc.minNeed == math.MaxInt64 || ds.exclusive:
				reason = x.notWholeReason(ds, q.Size)
			}
			w.rej.addDev(x, ds, constraint, reason)
		}
		return
	}
	if !x.affine(q.Request, ds) {
		if w.detail {
			w.rej.addDev(x, ds, ConstraintAffinity, x.nodeText(ds.dev.Node)+" fails affinity")
		}
		return
	}
	if len(q.Labels) > 0 && !x.labelled(q.Labels, ds) {
		if w.detail {
			w.rej.addDev(x, ds, ConstraintLabels, x.nodeText(ds.dev.Node)+" lacks label "+x.missingLabel(q.Labels, ds))
		}
		return
	}
	d := x.distFrom(w.bt, w.bv, ds.vertex)
	if d == fabric.Unreachable {
		if w.detail {
			w.rej.addDev(x, ds, ConstraintReach, "no fabric path")
		}
		return
	}
	lat := d.Latency + x.devLatency(ds)
	if q.MaxLatency > 0 && lat > q.MaxLatency {
		if w.detail {
			w.rej.addDev(x, ds, ConstraintLatency, fmt.Sprintf("latency %v > %v", lat, q.MaxLatency))
		}
		return
	}
	w.out = append(w.out, cand{dev: di, dist: d, latency: lat, linkUtil: max(x.routeUtil(w.bt, w.bv, ds.vertex), x.uplinkUtil(di)), nLeases: len(ds.leases)})
}

func (x *Index) unusableReason(ds *devState) string {
	if ds.usable == ConstraintHealth {
		return "device is " + ds.dev.State
	}
	if ds.node < 0 {
		return x.nodeText(ds.dev.Node) + " unknown"
	}
	if ds.usable == ConstraintCordon {
		return x.nodeText(ds.dev.Node) + " is cordoned"
	}
	if n := &x.nodes[ds.node]; n.Excluded != "" && (n.State == "" || n.State == NodeReady) {
		return x.nodeText(ds.dev.Node) + " is " + n.Excluded
	}
	return x.nodeText(ds.dev.Node) + " is " + x.nodes[ds.node].State
}

// offers reports whether a device offering roles can load role: it lists
// it, or lists none (nil: its roles are not known).
func offers(roles []string, role string) bool {
	return roles == nil || slices.Contains(roles, role)
}

// offeredRoles lists the roles the devices of kind offer, sorted.
func (x *Index) offeredRoles(kind string) []string {
	seen := map[string]bool{}
	for i := range x.devs {
		if d := &x.devs[i].dev; d.Kind == kind {
			for _, r := range d.Roles {
				seen[r] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for r := range seen {
		out = append(out, r)
	}
	sort.Strings(out)
	return out
}

func (x *Index) devLatency(ds *devState) time.Duration {
	if ds.dev.Latency > 0 {
		return ds.dev.Latency
	}
	if ds.hasProf {
		return ds.prof.Latency
	}
	return 0
}
