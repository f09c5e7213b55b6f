package placement

import (
	"fmt"
	"math"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

type localSol struct {
	newRate  float64
	affected []int32
	rates    []float64 // per affected lease, after
}

// localSolve re-solves max-min sharing around a change: a new flow with
// uses and demand joins (when uses is non-nil), and/or lease drop leaves
// (drop >= 0). It starts from the leases on the touched devices and on
// touched links that are (or become) saturated, solves that neighbourhood
// with the rest of the fabric's load fixed, and widens it through every
// saturated resource a changed lease uses until no change crosses the
// boundary; the result equals a global solve (Predict) up to rounding.
func (x *Index) localSolve(uses []fabric.Use, demand float64, drop int32) localSol {
	x.epoch++
	ep := x.epoch
	if len(x.lsStamp) < len(x.leases) {
		x.lsStamp = append(x.lsStamp, make([]uint32, len(x.leases)-len(x.lsStamp))...)
	}
	sol := localSol{affected: x.affBuf[:0]}
	defer func() { x.affBuf = sol.affected[:0] }()
	addLeases := func(r int) bool {
		added := false
		for _, li := range x.res[r].leases {
			if li == drop || !x.leases[li].live || x.lsStamp[li] == ep {
				continue
			}
			x.lsStamp[li] = ep
			sol.affected = append(sol.affected, li)
			added = true
		}
		return added
	}
	touch := func(u fabric.Use, d float64) {
		r := u.Resource
		if r < len(x.devs) {
			addLeases(r)
			return
		}
		c := x.resCap(r, 0)
		if math.IsInf(c, 1) {
			return
		}
		slack := c - x.res[r].load
		if math.IsInf(d, 1) || slack < u.Coef*d*(1+1e-9)+1e-6 {
			addLeases(r)
		}
	}
	for _, u := range uses {
		touch(u, demand)
	}
	if drop >= 0 {
		for _, u := range x.leases[drop].uses {
			// Anyone sharing a device, or a link that was full, may speed up.
			touch(u, 0)
		}
	}
	var rates []float64
	for iter := 0; ; iter++ {
		var capacity []float64
		var global []int
		rates, capacity, global = x.solveSet(sol.affected, uses, demand, drop)
		if iter == 16 || len(sol.affected) > 20000 {
			break
		}
		// Loads after, per local resource.
		after := grow(&x.afterBuf, len(global))
		for k, li := range sol.affected {
			if math.IsInf(rates[k], 0) {
				continue
			}
			for _, u := range x.leases[li].uses {
				after[x.resLocal[u.Resource]] += u.Coef * rates[k]
			}
		}
		if uses != nil && !math.IsInf(rates[len(sol.affected)], 0) {
			for _, u := range uses {
				after[x.resLocal[u.Resource]] += u.Coef * rates[len(sol.affected)]
			}
		}
		grew := false
		n := len(sol.affected)
		for k := 0; k < n; k++ {
			li := sol.affected[k]
			before := x.leases[li].rate
			if rates[k] == before || math.Abs(rates[k]-before) <= 1e-9*math.Max(1, math.Abs(before)) {
				continue
			}
			for _, u := range x.leases[li].uses {
				r := u.Resource
				lr := x.resLocal[r]
				satAfter := after[lr] >= capacity[lr]*(1-1e-9)-1e-6
				nb := len(x.res[r].leases)
				if r < len(x.devs) {
					nb = x.liveOn(r)
				}
				cb := x.resCap(r, nb)
				satBefore := !math.IsInf(cb, 1) && x.res[r].load >= cb*(1-1e-9)-1e-6
				if (satAfter || satBefore) && addLeases(r) {
					grew = true
				}
			}
		}
		if !grew {
			break
		}
	}
	sol.rates = rates[:len(sol.affected)]
	if uses != nil {
		sol.newRate = rates[len(sol.affected)]
	}
	return sol
}

// solveSet solves max-min over the affected leases (plus the new flow) with
// every other lease's load fixed. It returns the rates (affected first, the
// new flow last), the local capacities and the global IDs of the local
// resources (x.resLocal maps back).
func (x *Index) solveSet(affected []int32, uses []fabric.Use, demand float64, drop int32) ([]float64, []float64, []int) {
	x.rEpoch++
	ep := x.rEpoch
	global := x.globBuf[:0]
	local := func(r int) int32 {
		if x.resStamp[r] != ep {
			x.resStamp[r] = ep
			x.resLocal[r] = int32(len(global))
			global = append(global, r)
		}
		return x.resLocal[r]
	}
	nu := len(uses)
	for _, li := range affected {
		nu += len(x.leases[li].uses)
	}
	if cap(x.useBuf) < nu {
		x.useBuf = make([]fabric.Use, 0, 2*nu)
	}
	ub := x.useBuf[:0]
	flows := x.flowBuf[:0]
	for _, li := range affected {
		ls := &x.leases[li]
		st := len(ub)
		for _, u := range ls.uses {
			ub = append(ub, fabric.Use{Resource: int(local(u.Resource)), Coef: u.Coef})
		}
		flows = append(flows, fabric.Flow{Demand: demandOf(ls.l.Demand), Uses: ub[st:len(ub):len(ub)]})
	}
	if uses != nil {
		st := len(ub)
		for _, u := range uses {
			ub = append(ub, fabric.Use{Resource: int(local(u.Resource)), Coef: u.Coef})
		}
		flows = append(flows, fabric.Flow{Demand: demand, Uses: ub[st:len(ub):len(ub)]})
	}
	x.flowBuf, x.useBuf = flows, ub
	if drop >= 0 {
		for _, u := range x.leases[drop].uses {
			local(u.Resource)
		}
	}
	x.globBuf = global
	capacity := grow(&x.capBuf, len(global))
	affLoad := grow(&x.loadBuf, len(global))
	for _, li := range affected {
		ls := &x.leases[li]
		if math.IsInf(ls.rate, 0) {
			continue
		}
		for _, u := range ls.uses {
			affLoad[x.resLocal[u.Resource]] += u.Coef * ls.rate
		}
	}
	if drop >= 0 && !math.IsInf(x.leases[drop].rate, 0) {
		for _, u := range x.leases[drop].uses {
			affLoad[x.resLocal[u.Resource]] += u.Coef * x.leases[drop].rate
		}
	}
	for i, r := range global {
		n := len(x.res[r].leases)
		if r < len(x.devs) {
			n = x.liveOn(r)
			if uses != nil && hasRes(uses, r) {
				n++
			}
			if drop >= 0 && hasRes(x.leases[drop].uses, r) {
				n--
			}
		}
		c := x.resCap(r, n)
		if !math.IsInf(c, 1) {
			c -= x.res[r].load - affLoad[i]
			if c < 0 {
				c = 0
			}
		}
		capacity[i] = c
	}
	x.rateBuf = x.solver.Solve(capacity, flows, x.rateBuf)
	return x.rateBuf, capacity, global
}

// grow returns (*b)[:n] zeroed, reallocating when needed.
func grow(b *[]float64, n int) []float64 {
	if cap(*b) < n {
		*b = make([]float64, n, 2*n)
	}
	s := (*b)[:n]
	for i := range s {
		s[i] = 0
	}
	return s
}

func (x *Index) liveOn(di int) int {
	n := 0
	for _, li := range x.devs[di].leases {
		if x.leases[li].live {
			n++
		}
	}
	return n
}

func hasRes(uses []fabric.Use, r int) bool {
	for _, u := range uses {
		if u.Resource == r {
			return true
		}
	}
	return false
}

// Lease turns a plan into a running lease with the given ID, as the index
// and the next snapshot should record it.
func (p Plan) Lease(id string, r Request, now time.Duration) Lease {
	l := Lease{ID: id, Tenant: r.Tenant, Kind: r.Kind, Borrower: r.Borrower, Mode: p.Mode,
		Parts: append([]Part(nil), p.Parts...), Demand: r.Bandwidth, Remaining: r.Work, Gateway: r.Gateway}
	if r.Deadline > 0 {
		l.Deadline = now + r.Deadline
	}
	return l
}

// Add records a running lease (typically Plan.Lease of an accepted plan) in
// the index and updates the predicted rates of the leases it shares devices
// or saturated links with.
func (x *Index) Add(l Lease) error {
	if _, ok := x.leaseByID[l.ID]; ok {
		return fmt.Errorf("%w: lease %q already in the index", ErrInvalid, l.ID)
	}
	x.nicDemand(&l)
	uses := x.leaseUses(l.Borrower, l.Parts, nil)
	sol := x.localSolve(uses, demandOf(l.Demand), -1)
	x.noteDevs(l.Parts)
	li := x.insertLease(l)
	for len(x.lsStamp) < len(x.leases) {
		x.lsStamp = append(x.lsStamp, 0)
	}
	x.setRates(sol)
	x.leases[li].rate = sol.newRate
	x.addLoad(li, sol.newRate, 1)
	x.refreshDevs()
	return nil
}

// Remove drops a lease from the index, freeing its parts and letting the
// leases it shared with speed up.
func (x *Index) Remove(id string) error {
	li, ok := x.leaseByID[id]
	if !ok {
		return fmt.Errorf("%w: lease %q not in the index", ErrInvalid, id)
	}
	sol := x.localSolve(nil, 0, int32(li))
	ls := &x.leases[li]
	x.noteDevs(ls.l.Parts)
	x.addLoad(li, ls.rate, -1)
	ls.live = false
	delete(x.leaseByID, id)
	x.charge(ls.l.Tenant, x.leaseCharge(ls.l), -1)
	for _, u := range ls.uses {
		x.res[u.Resource].leases = without(x.res[u.Resource].leases, int32(li))
		if u.Resource < len(x.devs) {
			x.devs[u.Resource].leases = without(x.devs[u.Resource].leases, int32(li))
		}
	}
	for _, p := range ls.l.Parts {
		if di, ok := x.devByID[p.DeviceID]; ok {
			x.dropSpan(di, p)
			x.devs[di].free += p.Length
			if ds := &x.devs[di]; ls.l.Mode == ModeDedicated || ds.exclusive {
				ds.dedicated = ds.exclusive && len(ds.leases) > 0
			}
		}
	}
	x.setRates(sol)
	x.refreshDevs()
	// Free the slot for the next insertLease, keeping its uses' storage.
	x.leases[li] = leaseState{uses: ls.uses[:0]}
	x.freeSlots = append(x.freeSlots, int32(li))
	return nil
}

func without(s []int32, v int32) []int32 {
	for i, e := range s {
		if e == v {
			return append(s[:i], s[i+1:]...)
		}
	}
	return s
}

func (x *Index) setRates(sol localSol) {
	for k, li := range sol.affected {
		x.addLoad(int(li), x.leases[li].rate, -1)
		x.leases[li].rate = sol.rates[k]
		x.addLoad(int(li), sol.rates[k], 1)
	}
}

// devNote is a device's state as its group summary counts it, before a
// change.
type devNote struct {
	dev    int32
	elig   bool // counted: usable and not dedicated
	free   int64
	leases int
}

// noteDevs records the state of the devices parts name, before a change
// that refreshDevs then folds into their groups' summaries.
func (x *Index) noteDevs(parts []Part) {
	x.notes = x.notes[:0]
parts:
	for _, p := range parts {
		di, ok := x.devByID[p.DeviceID]
		if !ok {
			continue
		}
		for _, n := range x.notes {
			if n.dev == int32(di) {
				continue parts
			}
		}
		ds := &x.devs[di]
		x.notes = append(x.notes, devNote{dev: int32(di), elig: ds.usable == "" && !ds.dedicated, free: ds.free, leases: len(ds.leases)})
	}
}

// refreshDevs updates the group summaries (refreshGroup's figures) for the
// devices noteDevs recorded, rescanning a group only when the device that
// held its most free capacity lost some.
func (x *Index) refreshDevs() {
	for _, n := range x.notes {
		ds := &x.devs[n.dev]
		kg := x.groups[ds.dev.Kind]
		if kg == nil {
			continue
		}
		a := ds.anchor
		elig := ds.usable == "" && !ds.dedicated
		if n.elig && n.leases == 0 {
			kg.empty[a]--
		}
		if elig && len(ds.leases) == 0 {
			kg.empty[a]++
		}
		mf := kg.maxFree[a]
		switch {
		case ds.exclusive: // never counted in maxFree
		case elig && ds.free > mf:
			kg.maxFree[a] = ds.free
		case n.elig && n.free == mf && !(elig && ds.free >= n.free):
			x.refreshGroup(kg, a)
		}
	}
	x.notes = x.notes[:0]
}

// Now is the index's clock (Snapshot.Now, moved by Advance).
func (x *Index) Now() time.Duration { return x.now }

// Advance moves the index's clock to now (a virtual clock: the simulator's)
// and takes from every running lease's Remaining the bytes it moved at its
// predicted rate since the previous clock. Leases that finish are not
// removed: call Remove when the caller retires them. An earlier now is
// ignored.
func (x *Index) Advance(now time.Duration) {
	dt := now - x.now
	if dt <= 0 {
		return
	}
	x.now = now
	for i := range x.leases {
		ls := &x.leases[i]
		if !ls.live || ls.l.Remaining <= 0 {
			continue
		}
		moved := ls.rate * dt.Seconds()
		if math.IsInf(moved, 1) || moved >= float64(ls.l.Remaining) {
			ls.l.Remaining = 0
			continue
		}
		ls.l.Remaining -= int64(moved)
	}
}

// Prediction returns a running lease's current predicted rate and
// completion, as Predictions does for all of them.
func (x *Index) Prediction(id string) (Prediction, bool) {
	li, ok := x.leaseByID[id]
	if !ok {
		return Prediction{}, false
	}
	ls := &x.leases[li]
	c := completion(ls.l.Remaining, ls.rate)
	return Prediction{LeaseID: id, Bandwidth: ls.rate, Completion: c,
		Late: ls.l.Deadline > 0 && ls.l.Remaining > 0 && x.now+c > ls.l.Deadline}, true
}
