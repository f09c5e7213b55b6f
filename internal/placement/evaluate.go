package placement

// The evaluation stage of Index.Place: each option's predicted bandwidth,
// completion and impact on running leases.

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
	"github.com/rialto-project/rialto/internal/resource"
)

// result is an option's predicted outcome and ranking figures (less), or
// its rejection.
type result struct {
	opt       option
	offStart  int32 // parts' offsets: x.offArena[offStart:][:len(opt.devs)]
	impStart  int32 // leases slowed: x.impArena[impStart:impEnd]
	impEnd    int32
	parts     []Part   // set by finish
	impacts   []Impact // set by finish
	rate      float64
	compl     time.Duration
	unmet     int
	modeRank  int
	hops      int
	latency   time.Duration
	linkBand  int
	linkUtil  float64
	pack1     float64
	pack2     float64
	slowdown  float64
	name      string
	rejection *Rejection
}

// span is a used range of a device: a lease's part, and the lease's
// gateway key (a shared accel lease's; "" for any other).
type span struct {
	off, end int64
	gw       string
}

// hole finds the first aligned free range of n units on device di.
func (x *Index) hole(di int32, n, align int64) (int64, bool) {
	ds := &x.devs[di]
	off := int64(0)
	for _, u := range ds.spans { // sorted by offset; among equal offsets any order gives this result
		if u.off-off >= n {
			return off, true
		}
		if e := roundUp(u.end, align); e > off {
			off = e
		}
	}
	return off, ds.dev.Capacity-off >= n
}

// slotHole finds room for a gateway share of n units on accel device di:
// inside one slot (x.slotUnits units from a multiple of them) whose parts
// all belong to leases of gateway gw. A slot gw already shares comes
// first (the share joins the slot the gateway holds), then an empty slot;
// a slot holding any other lease's part (another gateway's share, or
// dedicated slots) is never used. Within a slot the share takes the
// first gap that fits.
func (x *Index) slotHole(di int32, n int64, gw string) (int64, bool) {
	ds := &x.devs[di]
	sp, unit := ds.spans, x.slotUnits
	empty := int64(-1)
	k := 0
	for lo := int64(0); lo+n <= ds.dev.Capacity; lo += unit {
		hi := min(lo+unit, ds.dev.Capacity)
		for k < len(sp) && sp[k].end <= lo {
			k++
		}
		off, found, used, ours := lo, int64(-1), false, true
		for j := k; j < len(sp) && sp[j].off < hi; j++ {
			if sp[j].end <= lo {
				continue // an earlier span (spans are sorted by offset only)
			}
			used = true
			if sp[j].gw != gw {
				ours = false
				break
			}
			if found < 0 && sp[j].off-off >= n {
				found = off
			}
			off = max(off, sp[j].end)
		}
		switch {
		case !ours:
		case !used:
			if empty < 0 {
				empty = lo
			}
		case found >= 0:
			return found, true
		case hi-off >= n:
			return off, true
		}
	}
	return empty, empty >= 0
}

// impRef is a running lease an option slows (eval keeps them in
// x.impArena; finish turns the chosen option's into Impacts).
type impRef struct {
	lease int32
	after float64
}

// finish builds the parts and impacts of the chosen option from what eval
// kept of them.
func (x *Index) finish(res *result) {
	res.parts = make([]Part, len(res.opt.devs))
	for i, di := range res.opt.devs {
		ds := &x.devs[di]
		res.parts[i] = Part{NodeID: ds.dev.Node, DeviceID: ds.dev.ID, Offset: x.offArena[int(res.offStart)+i], Length: res.opt.partLen}
	}
	if res.impEnd == res.impStart {
		return
	}
	res.impacts = make([]Impact, 0, res.impEnd-res.impStart)
	for _, ir := range x.impArena[res.impStart:res.impEnd] {
		ls := &x.leases[ir.lease]
		before, after := ls.rate, ir.after
		im := Impact{LeaseID: ls.l.ID, Kind: x.leaseKind(&ls.l), BandwidthBefore: before, BandwidthAfter: after,
			CompletionBefore: completion(ls.l.Remaining, before), CompletionAfter: completion(ls.l.Remaining, after)}
		im.MissesDeadline = ls.l.Deadline > 0 && ls.l.Remaining > 0 && x.now+im.CompletionAfter > ls.l.Deadline
		res.impacts = append(res.impacts, im)
	}
	if len(res.impacts) > 1 {
		slices.SortFunc(res.impacts, func(a, b Impact) int { return strings.Compare(a.LeaseID, b.LeaseID) })
	}
}

// evalAll is the evaluation stage of Place: each option's predicted
// outcome, in option order, and the rejection of each option that breaks
// a constraint. The results live in x.resBuf until release.
func (x *Index) evalAll(q *req, bv int32, opts []option, cands []cand) ([]result, []Rejection) {
	x.offArena, x.impArena = x.offArena[:0], x.impArena[:0]
	results := x.resBuf[:0]
	var rejected []Rejection
	for _, o := range opts {
		res := x.eval(q, bv, o, cands)
		if res.rejection != nil {
			rejected = append(rejected, *res.rejection)
			continue
		}
		results = append(results, res)
	}
	return results, rejected
}

// release hands evalAll's results back to x.resBuf for the next Place,
// cleared so that they keep nothing alive.
func (x *Index) release(results []result) {
	clear(results)
	x.resBuf = results[:0]
}

// eval predicts the outcome of one option: where its parts go, whether the
// tenant's quota holds it, the rates it and the running leases it slows
// would get, and the figures that rank it.
func (x *Index) eval(q *req, bv int32, o option, cands []cand) result {
	res := result{opt: o, offStart: int32(len(x.offArena))}
	reject := func(c, reason string) result {
		res.rejection = &Rejection{Candidate: x.name(&res), Name: x.label(&res), Constraint: c, Reason: reason}
		return res
	}
	ch, c, why := x.evalParts(&res, q, cands)
	if c != "" {
		return reject(c, why)
	}
	if c, why := x.overQuota(q, &ch); c != "" {
		return reject(c, why)
	}
	uses := x.usesFor(bv, o.devs, x.evalUses[:0])
	x.evalUses = uses
	sol := x.localSolve(uses, q.demand, -1)
	if c, why := x.evalRates(&res, q, &sol); c != "" {
		return reject(c, why)
	}
	x.evalFigures(&res, q, uses, &sol)
	return res
}

// evalParts finds each part's offset (kept in x.offArena: finish builds
// the chosen plan's parts), the option's hops and latency (its farthest
// part's) and what it would charge the tenant. A part with no room is a
// capacity rejection.
func (x *Index) evalParts(res *result, q *req, cands []cand) (ch usage, constraint, reason string) {
	o := &res.opt
	for _, di := range o.devs {
		ds := &x.devs[di]
		off, length := int64(0), o.partLen
		if o.mode != ModeDedicated && q.Kind == KindAccel && q.Gateway != "" {
			var ok bool
			off, ok = x.slotHole(di, o.partLen, q.Gateway)
			if !ok {
				return ch, ConstraintCapacity, fmt.Sprintf("%s has %s free but no slot with %s free that is empty or shared by the same gateway (a shared slot serves one role and role config)",
					x.devText(ds), x.amount(q.Kind, ds.free), x.amount(q.Kind, o.partLen))
			}
		} else if o.mode != ModeDedicated {
			var ok bool
			off, ok = x.hole(di, o.partLen, q.align)
			if !ok {
				return ch, ConstraintCapacity, fmt.Sprintf("%s has %s free but no contiguous %s", x.devText(ds), x.amount(q.Kind, ds.free), x.amount(q.Kind, o.partLen))
			}
		}
		x.offArena = append(x.offArena, off)
		switch q.Kind {
		case KindAccel:
			ch.slots += length
		case KindNIC:
			ch.rate += length
		default:
			ch.bytes += length
		}
		c := &cands[x.candPos[di]]
		if c.dist.Hops > res.hops {
			res.hops = c.dist.Hops
		}
		if c.latency > res.latency {
			res.latency = c.latency
		}
	}
	ch.bandwidth = q.Bandwidth
	if q.Kind == KindNIC {
		// The rate the parts hold, or the lower bandwidth asked for: what
		// the lease's Demand becomes once it runs (nicDemand).
		ch.bandwidth = float64(ch.rate)
		if q.Bandwidth > 0 && q.Bandwidth < ch.bandwidth {
			ch.bandwidth = q.Bandwidth
		}
	}
	return ch, "", ""
}

// overQuota names the tenant quota (bytes, slots, bandwidth) that charging
// ch would break, if any.
func (x *Index) overQuota(q *req, ch *usage) (constraint, reason string) {
	qt, ok := x.quota(q.Tenant)
	if !ok {
		return "", ""
	}
	u := x.tenants[q.Tenant]
	if u == nil {
		u = &usage{}
	}
	switch {
	case qt.Bytes > 0 && u.bytes+ch.bytes > qt.Bytes:
		return ConstraintQuota, fmt.Sprintf("tenant %s would hold %s of %s", q.Tenant, resource.FormatSize(u.bytes+ch.bytes), resource.FormatSize(qt.Bytes))
	case qt.Slots > 0 && u.slots+ch.slots > qt.Slots:
		if x.slotUnits > 1 {
			return ConstraintQuota, fmt.Sprintf("tenant %s would hold %s of %s", q.Tenant, x.amount(KindAccel, u.slots+ch.slots), x.amount(KindAccel, qt.Slots))
		}
		return ConstraintQuota, fmt.Sprintf("tenant %s would hold %d of %d slots", q.Tenant, u.slots+ch.slots, qt.Slots)
	case qt.Bandwidth > 0 && u.bandwidth+ch.bandwidth > qt.Bandwidth:
		return ConstraintQuota, fmt.Sprintf("tenant %s would use %s of %s%s", q.Tenant, fmtBW(u.bandwidth+ch.bandwidth), fmtBW(qt.Bandwidth), nicCharge(q.Kind, ch.bandwidth))
	}
	return "", ""
}

// nicCharge is what a refusal over the bandwidth quota adds for a nic
// request: its rate as a link rate, as a nic lease's size prints, with
// the bytes/s the quota (every kind's rates together) counts it as
// (" with this nic lease's 500Mbit/s (62.5MB/s)"). Other kinds: nothing.
func nicCharge(kind string, b float64) string {
	if kind != KindNIC {
		return ""
	}
	return fmt.Sprintf(" with this nic lease's %s (%s)", resource.FormatLinkRate(b), resource.FormatRate(b))
}

// evalRates takes the new lease's rate and completion from sol, counts the
// requirements the option leaves unmet and the slowdown it causes, and
// keeps the running leases it slows in x.impArena. A deadline the new
// lease would miss, or one a running lease would newly miss, rejects it.
func (x *Index) evalRates(res *result, q *req, sol *localSol) (constraint, reason string) {
	res.impStart = int32(len(x.impArena))
	res.rate = sol.newRate
	res.compl = completion(q.Work, res.rate)
	if q.hard && res.rate < q.need*(1-1e-9) {
		return ConstraintDeadline, fmt.Sprintf("predicted %s, completion %v > deadline %v", rateText(q.Kind, res.rate), res.compl.Round(time.Second), q.Deadline)
	}
	if !q.hard && q.need > 0 && res.rate < q.need*(1-SlowdownTolerance) {
		res.unmet++
	}
	if !math.IsInf(q.demand, 1) && res.rate < q.demand {
		res.slowdown += 1 - res.rate/q.demand
	}
	for k, li := range sol.affected {
		ls := &x.leases[li]
		before, after := ls.rate, sol.rates[k]
		if !(after < before*(1-1e-9)) {
			continue
		}
		if ls.l.Deadline > 0 && ls.l.Remaining > 0 {
			cb, ca := completion(ls.l.Remaining, before), completion(ls.l.Remaining, after)
			if x.now+ca > ls.l.Deadline && !(x.now+cb > ls.l.Deadline) {
				return ConstraintDeadline, fmt.Sprintf("running lease %s would miss its deadline (completion %v → %v)",
					ls.l.ID, cb.Round(time.Second), ca.Round(time.Second))
			}
		}
		if after < before*(1-SlowdownTolerance) {
			switch {
			case ls.l.Deadline > 0 && ls.l.Remaining > 0:
			case ls.l.Demand > 0:
				if after < ls.l.Demand*(1-SlowdownTolerance) {
					res.unmet++
				}
			}
		}
		if !math.IsInf(before, 1) && before > 0 {
			res.slowdown += 1 - after/before
		}
		x.impArena = append(x.impArena, impRef{li, after})
	}
	res.impEnd = int32(len(x.impArena))
	return "", ""
}

// evalFigures sets the ranking figures less compares beyond the unmet
// requirements and the slowdown: the mode's rank, the worst link
// utilisation once the option runs (uses are its resources, sol the
// rates), and the strategy's packing.
func (x *Index) evalFigures(res *result, q *req, uses []fabric.Use, sol *localSol) {
	o := &res.opt
	res.modeRank = modeRank(q, o.mode)
	k := float64(len(o.devs))
	add := res.rate
	if math.IsInf(add, 1) {
		add = 0
	}
	for _, u := range uses {
		capa, base, ok := x.loadedCap(u.Resource)
		if !ok {
			continue
		}
		load := x.res[u.Resource].load + u.Coef*add
		for k, ai := range sol.affected {
			b, a := x.leases[ai].rate, sol.rates[k]
			if a == b || math.IsInf(a, 0) || math.IsInf(b, 0) {
				continue
			}
			for _, au := range x.leases[ai].uses {
				if au.Resource == u.Resource {
					load += au.Coef * (a - b)
				}
			}
		}
		if v := (base + load) / capa; v > res.linkUtil {
			res.linkUtil = v
		}
	}
	leasesOn, minFree, worstUtil := 0.0, int64(math.MaxInt64), 0.0
	for _, di := range o.devs {
		ds := &x.devs[di]
		leasesOn += float64(len(ds.leases))
		if f := ds.free - o.partLen; f < minFree {
			minFree = f
		}
		if u := x.devUtil(di, q.demand/k); u > worstUtil {
			worstUtil = u
		}
	}
	res.linkBand = band(res.linkUtil)
	if q.strategy == Spread {
		res.pack1, res.pack2 = worstUtil, leasesOn/k
	} else {
		res.pack1, res.pack2 = -leasesOn/k, float64(minFree)
	}
}

// modeRank is the preference for mode (lower first): with a tight
// deadline dedicated, composed, shared (isolation from later arrivals);
// with spread shared and composed alike, then dedicated; with binpack shared,
// composed, dedicated.
func modeRank(q *req, mode string) int {
	switch {
	case q.tight:
		switch mode {
		case ModeComposed:
			return 1
		case ModeShared:
			return 2
		}
	case q.strategy == Spread:
		if mode == ModeDedicated {
			return 1
		}
	default:
		switch mode {
		case ModeComposed:
			return 1
		case ModeDedicated:
			return 2
		}
	}
	return 0
}
