package placement

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

type cand struct {
	k1       uint64 // hops, latency, link band, packing: see candKey
	dev      int32
	dist     fabric.Distance
	latency  time.Duration // path + device
	linkUtil float64       // worst current utilisation on the path
	nLeases  int
}

type rejections struct {
	list   []Rejection
	counts map[string]int
}

func (r *rejections) add(c, constraint, reason string) {
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[constraint]++
	if len(r.list) < MaxRejections {
		r.list = append(r.list, Rejection{Candidate: c, Constraint: constraint, Reason: reason})
	}
}

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

// candidates walks devices of the kind nearest first (by fabric anchor
// group). With detail it records why each device was rejected (used to
// explain an infeasible request; the fast path skips the formatting).
func (x *Index) candidates(q req, bv int32, allowDed bool, minNeed int64, detail bool) ([]cand, rejections, int) {
	var rej rejections
	kg := x.groups[q.Kind]
	if kg == nil {
		rej.add(q.Kind, ConstraintKind, "no device of kind "+q.Kind)
		return nil, rej, 0
	}
	order := x.groupOrder(x.anchor[bv], q.Kind)
	if len(order) < len(kg.anchors) {
		if detail {
			rej.add(fmt.Sprintf("%d device groups", len(kg.anchors)-len(order)), ConstraintReach, "no fabric path from "+q.Borrower)
		}
	}
	out := x.candBuf[:0]
	defer func() { x.candBuf = out[:0] }()
	examined := 0
	bt := x.tree(x.coreOf[x.anchor[bv]]) // the tree dist and route use from bv
	if x.uEpoch++; x.uEpoch == 0 {
		clear(x.uStamp)
		x.uEpoch = 1
	}
	if len(x.uStamp) < x.g.Len() {
		x.uStamp = make([]uint32, x.g.Len())
		x.uVal = make([]float64, x.g.Len())
	}
	check := func(di int32) {
		examined++
		ds := &x.devs[di]
		if ds.usable != "" {
			if detail {
				rej.add(ds.dev.ID, ds.usable, x.unusableReason(ds))
			}
			return
		}
		if ds.dedicated {
			if detail {
				reason := "dedicated to another lease"
				if ds.exclusive {
					reason = fmt.Sprintf("exclusive, held whole by %d lease(s)", len(ds.leases))
				}
				rej.add(ds.dev.ID, ConstraintCapacity, reason)
			}
			return
		}
		if !((ds.free >= minNeed && !ds.exclusive) || (allowDed && x.dedicable(ds, &q))) {
			if detail {
				constraint, reason := ConstraintCapacity, fmt.Sprintf("%d free, needs %d", ds.free, minNeed)
				switch {
				case ds.exclusive && !allowDed:
					constraint, reason = ConstraintExclusive, "lent whole only, and a "+modeList(false, true, true)+" lease takes a part"
				case minNeed == math.MaxInt64 || ds.exclusive:
					reason = x.notWholeReason(ds, q.Size)
				}
				rej.add(ds.dev.ID, constraint, reason)
			}
			return
		}
		if !x.affine(q.Request, ds) {
			if detail {
				rej.add(ds.dev.ID, ConstraintAffinity, "node "+ds.dev.Node+" fails affinity")
			}
			return
		}
		if len(q.Labels) > 0 && !x.labelled(q.Labels, ds) {
			if detail {
				rej.add(ds.dev.ID, ConstraintLabels, "node "+ds.dev.Node+" lacks label "+x.missingLabel(q.Labels, ds))
			}
			return
		}
		d := x.distFrom(bt, bv, ds.vertex)
		if d == fabric.Unreachable {
			if detail {
				rej.add(ds.dev.ID, ConstraintReach, "no fabric path")
			}
			return
		}
		lat := d.Latency + x.devLatency(ds)
		if q.MaxLatency > 0 && lat > q.MaxLatency {
			if detail {
				rej.add(ds.dev.ID, ConstraintLatency, fmt.Sprintf("latency %v > %v", lat, q.MaxLatency))
			}
			return
		}
		out = append(out, cand{dev: di, dist: d, latency: lat, linkUtil: x.routeUtil(bt, bv, ds.vertex), nLeases: len(ds.leases)})
	}
	if len(q.Devices) > 0 {
		// Pinned: only the named devices, each once.
		seen := make(map[string]bool, len(q.Devices))
		for _, id := range q.Devices {
			if seen[id] {
				continue
			}
			seen[id] = true
			di, ok := x.devByID[id]
			switch {
			case !ok:
				examined++
				if detail {
					rej.add(id, ConstraintPin, "no such device")
				}
			case x.devs[di].dev.Kind != q.Kind:
				examined++
				if detail {
					rej.add(id, ConstraintPin, "pinned device is "+x.devs[di].dev.Kind+", not "+q.Kind)
				}
			default:
				check(int32(di))
			}
		}
		for i := range out {
			out[i].k1 = candKey(&out[i], q.strategy)
		}
		return out, rej, examined
	}
	// Devices on the borrower itself first: they are nearest of all.
	for _, di := range x.local[localKey{bv, q.Kind}] {
		check(di)
	}
	goal := max(defaultCandidateGoal, 2*q.Width)
	budget := 4 * goal
	t := x.tree(x.coreOf[x.anchor[bv]])
	lastHops := -1
groups:
	for _, a := range order {
		gh := t.Dist[x.coreOf[a]].Hops
		if len(out) >= goal && (gh != lastHops || examined >= budget) {
			break
		}
		lastHops = gh
		if len(kg.devs[a]) > 16 && kg.maxFree[a] < minNeed && !(allowDed && kg.empty[a] > 0) {
			n := len(kg.devs[a])
			examined += n
			if detail {
				rej.add(fmt.Sprintf("%d devices at %s", n, x.g.ID(int(a))), ConstraintCapacity, "none free or usable enough")
			}
			continue
		}
		if len(kg.devs[a]) > 16 && len(q.Labels) > 0 && !x.labelGroup(q.Labels, a) {
			n := len(kg.devs[a])
			examined += n
			if detail {
				rej.add(fmt.Sprintf("%d devices at %s", n, x.g.ID(int(a))), ConstraintLabels, "no node there carries every selected label")
			}
			continue
		}
		for _, di := range kg.devs[a] {
			if x.devs[di].vertex == bv {
				continue // already checked
			}
			// Enough candidates: stop within a large group too. Devices
			// of one group are equally far up to their own leaf link.
			if len(out) >= goal && examined >= budget {
				break groups
			}
			check(di)
		}
	}
	for i := range out {
		out[i].k1 = candKey(&out[i], q.strategy)
	}
	// Left unsorted: Place selects the few it needs in candidate order
	// (cmpCand) without sorting them all.
	return out, rej, examined
}

func (x *Index) unusableReason(ds *devState) string {
	if ds.usable == ConstraintHealth {
		return "device is " + ds.dev.State
	}
	if ds.node < 0 {
		return "node " + ds.dev.Node + " unknown"
	}
	return "node " + ds.dev.Node + " is " + x.nodes[ds.node].State
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
