package sim

import (
	"math"

	"github.com/rialto-project/rialto/internal/fabric"
)

// Profile gives the fraction of a resource's nominal capacity that it
// delivers when n flows use it at once (a characterization profile: delivered
// bandwidth versus concurrency). A nil Profile delivers the full capacity.
type Profile interface {
	Delivered(n int) float64
}

// Table is a Profile from measured points: Table[i] is the delivered fraction
// at concurrency i+1; concurrency beyond the table uses the last entry.
type Table []float64

// Delivered implements Profile.
func (t Table) Delivered(n int) float64 {
	if len(t) == 0 || n <= 0 {
		return 1
	}
	if n > len(t) {
		return t[len(t)-1]
	}
	return t[n-1]
}

// Resource is something flows share: a link direction, a device, a host's
// memory bus. Capacity is in bytes per second at concurrency 1 (0: unlimited).
type Resource struct {
	Name     string
	Capacity float64
	Profile  Profile

	flows []*Flow
	// Bytes counts bytes delivered through the resource (settled lazily).
	Bytes float64
	// Busy accumulates virtual seconds during which at least one flow was active.
	Busy Time

	mark    uint64
	idx     int
	lastSet Time
}

// Active reports how many flows use the resource now.
func (r *Resource) Active() int { return len(r.flows) }

// Delivered reports the capacity delivered at the current concurrency.
func (r *Resource) Delivered() float64 {
	if r.Capacity <= 0 {
		return math.Inf(1)
	}
	c := r.Capacity
	if r.Profile != nil {
		c *= r.Profile.Delivered(len(r.flows))
	}
	return c
}

// Flow moves Size bytes across every resource of Path at one rate, set by
// max-min fair sharing among the flows active on those resources and by the
// flow's own Cap (0: uncapped). Coef, when set, says how many bytes of
// Path[i] each byte of the flow takes (a tunnel's framing on the links it
// crosses, a header per packet); nil means 1 everywhere.
type Flow struct {
	Path []*Resource
	Coef []float64
	Cap  float64
	Size float64

	remaining float64
	rate      float64
	last      Time
	started   Time
	ver       uint64
	done      func(*Flow)
	mark      uint64
	live      bool
	scheduled bool
	prev      float64
	pos       []int // index of the flow in each Path resource's flows
}

// Rate reports the flow's current rate in bytes per second.
func (f *Flow) Rate() float64 { return f.rate }

// Started reports when the flow started.
func (f *Flow) Started() Time { return f.started }

// Remaining reports the bytes left as of the last rate change.
func (f *Flow) Remaining() float64 { return f.remaining }

// Net keeps the active flows of a simulation and recomputes their rates when
// flows start or finish: only the connected component of flows that share
// resources with the change is recomputed, and changes that happen at the same
// virtual time are recomputed once.
type Net struct {
	eng     *Engine
	epoch   uint64
	dirty   []*Resource
	pending bool
	// Recomputes counts rate recomputations (components solved).
	Recomputes uint64
	// Started and Finished count flows.
	Started, Finished uint64

	// scratch
	compR  []*Resource
	compF  []*Flow
	solver fabric.Solver
	caps   []float64
	loads  []float64
	fflows []fabric.Flow
	uses   []fabric.Use
	rates  []float64
}

// NewNet returns a flow network driven by eng.
func NewNet(eng *Engine) *Net { return &Net{eng: eng} }

// Start starts a flow of size bytes along path; done runs when its last byte
// is delivered. A flow with an empty path runs at cap (which must then be
// positive) and otherwise completes at once.
func (n *Net) Start(size float64, path []*Resource, cap float64, done func(*Flow)) *Flow {
	return n.StartCoef(size, path, nil, cap, done)
}

// StartCoef is Start for a flow that takes coef[i] bytes of path[i] per
// byte it moves (nil: 1 everywhere; otherwise as long as path, each > 0).
func (n *Net) StartCoef(size float64, path []*Resource, coef []float64, cap float64, done func(*Flow)) *Flow {
	if coef != nil && len(coef) != len(path) {
		panic("sim: StartCoef: coef and path differ in length")
	}
	f := &Flow{Path: path, Coef: coef, Cap: cap, Size: size, remaining: size, last: n.eng.now, started: n.eng.now, done: done, live: true}
	n.Started++
	if len(path) == 0 {
		d := 0.0
		if cap > 0 {
			d = size / cap
		}
		f.rate = cap
		n.eng.After(d, func() {
			f.live = false
			f.remaining = 0
			n.Finished++
			if f.done != nil {
				f.done(f)
			}
		})
		return f
	}
	f.pos = make([]int, len(path))
	for i, r := range path {
		r.settle(n.eng.now)
		f.pos[i] = len(r.flows)
		r.flows = append(r.flows, f)
	}
	n.markDirty(path)
	return f
}

// Cancel stops a live flow without calling its done function.
func (n *Net) Cancel(f *Flow) {
	if !f.live {
		return
	}
	f.remaining -= f.rate * (n.eng.now - f.last)
	n.remove(f)
}

func (n *Net) remove(f *Flow) {
	f.live = false
	f.ver++
	for i, r := range f.Path {
		r.settle(n.eng.now)
		p := f.pos[i]
		last := len(r.flows) - 1
		if p != last {
			g := r.flows[last]
			r.flows[p] = g
			for j, gr := range g.Path {
				if gr == r {
					g.pos[j] = p
					break
				}
			}
		}
		r.flows[last] = nil
		r.flows = r.flows[:last]
	}
	n.markDirty(f.Path)
}

// settle accounts bytes and busy time on the resource up to now.
func (r *Resource) settle(now Time) {
	dt := now - r.lastSet
	if dt > 0 && len(r.flows) > 0 {
		r.Busy += dt
		s := 0.0
		for _, f := range r.flows {
			s += f.rate * f.coefOn(r)
		}
		r.Bytes += s * dt
	}
	r.lastSet = now
}

// coefOn is the flow's coefficient on resource r (1 without Coef).
func (f *Flow) coefOn(r *Resource) float64 {
	if f.Coef == nil {
		return 1
	}
	for i, pr := range f.Path {
		if pr == r {
			return f.Coef[i]
		}
	}
	return 1
}

func (n *Net) markDirty(path []*Resource) {
	n.dirty = append(n.dirty, path...)
	if !n.pending {
		n.pending = true
		n.eng.At(n.eng.now, n.recompute)
	}
}

// recompute solves max-min fair rates for the components touched since the
// last recomputation.
func (n *Net) recompute() {
	n.pending = false
	now := n.eng.now
	n.epoch++
	ep := n.epoch
	n.compR = n.compR[:0]
	n.compF = n.compF[:0]
	for _, r := range n.dirty {
		if r.mark == ep {
			continue
		}
		r.mark = ep
		n.compR = append(n.compR, r)
	}
	n.dirty = n.dirty[:0]
	// Breadth-first over resources -> flows -> resources.
	for i := 0; i < len(n.compR); i++ {
		for _, f := range n.compR[i].flows {
			if f.mark == ep {
				continue
			}
			f.mark = ep
			n.compF = append(n.compF, f)
			for _, r := range f.Path {
				if r.mark != ep {
					r.mark = ep
					n.compR = append(n.compR, r)
				}
			}
		}
	}
	n.Recomputes++
	for _, r := range n.compR {
		r.settle(now)
	}
	for _, f := range n.compF {
		f.remaining -= f.rate * (now - f.last)
		if f.remaining < 0 {
			f.remaining = 0
		}
		f.last = now
	}
	for _, f := range n.compF {
		f.prev = f.rate
	}
	n.solve(n.compR, n.compF)
	for _, f := range n.compF {
		if f.rate == f.prev && f.scheduled {
			continue
		}
		f.scheduled = f.rate > 0
		f.ver++
		ver := f.ver
		ff := f
		if f.rate <= 0 {
			continue
		}
		d := f.remaining / f.rate
		n.eng.At(now+d, func() { n.finish(ff, ver) })
	}
}

func (n *Net) finish(f *Flow, ver uint64) {
	if !f.live || f.ver != ver {
		return
	}
	f.remaining = 0
	n.remove(f)
	n.Finished++
	if f.done != nil {
		f.done(f)
	}
}

// allAtCap sets every flow of the component to its cap and reports true
// when that is the max-min allocation with room to spare: every flow is
// capped and no resource would be full (with a margin far above rounding)
// with every flow at its cap. Progressive filling then freezes each flow at
// its demand before any resource fills, and gives it exactly its cap, so
// the result is the solver's, bit for bit, without the solver (most
// components of a large run have room: devices with one or two streams,
// links far from full). n.caps holds the resources' delivered capacities.
func (n *Net) allAtCap(fs []*Flow) bool {
	n.loads = n.loads[:0]
	for range n.caps {
		n.loads = append(n.loads, 0)
	}
	for _, f := range fs {
		if !(f.Cap > 0) || math.IsInf(f.Cap, 1) {
			return false
		}
		for i, r := range f.Path {
			c := 1.0
			if f.Coef != nil {
				c = f.Coef[i]
			}
			n.loads[r.idx] += c * f.Cap
		}
	}
	for i, c := range n.caps {
		if !math.IsInf(c, 1) && n.loads[i] > c*(1-1e-9) {
			return false
		}
	}
	for _, f := range fs {
		f.rate = f.Cap
	}
	return true
}

// solve sets the rate of every flow of the component by fabric's weighted
// max-min fair sharing (progressive filling): each resource offers its
// delivered capacity at its current concurrency, each flow asks for its Cap
// (0: as much as it can get).
func (n *Net) solve(rs []*Resource, fs []*Flow) {
	n.caps = n.caps[:0]
	for i, r := range rs {
		r.idx = i
		n.caps = append(n.caps, r.Delivered())
	}
	if n.allAtCap(fs) {
		return
	}
	if cap(n.fflows) < len(fs) {
		n.fflows = make([]fabric.Flow, len(fs))
	}
	n.fflows = n.fflows[:len(fs)]
	n.uses = n.uses[:0]
	for _, f := range fs {
		for i, r := range f.Path {
			c := 1.0
			if f.Coef != nil {
				c = f.Coef[i]
			}
			n.uses = append(n.uses, fabric.Use{Resource: r.idx, Coef: c})
		}
	}
	off := 0
	for i, f := range fs {
		n.fflows[i] = fabric.Flow{Demand: f.Cap, Uses: n.uses[off : off+len(f.Path) : off+len(f.Path)]}
		off += len(f.Path)
	}
	n.rates = n.solver.Solve(n.caps, n.fflows, n.rates)
	for i, f := range fs {
		r := n.rates[i]
		if math.IsInf(r, 1) || r < 0 {
			r = 0
		}
		f.rate = r
	}
}
