package placement

// The last stage of Index.Place: the plan and its explanation, and the
// explanations of infeasible requests.

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rialto-project/rialto/internal/resource"
)

// plan builds the Plan of the best result, top[0], and explains the
// choice.
func (x *Index) plan(q *req, sc *scope, top []*result, nresults int, rejected []Rejection, cands []cand, examined int) Plan {
	best := top[0]
	x.finish(best)
	p := Plan{
		Mode:                best.opt.mode,
		Parts:               best.parts,
		Hops:                best.hops,
		Latency:             best.latency,
		PredictedBandwidth:  best.rate,
		PredictedCompletion: best.compl,
		Impacts:             best.impacts,
	}
	p.Explanation = x.explain(q, top, nresults, rejected, len(cands), examined)
	if sc.share || sc.compose {
		nx := 0
		for i := range cands {
			if x.devs[cands[i].dev].exclusive {
				nx++
			}
		}
		if nx > 0 {
			p.Explanation = append(p.Explanation, fmt.Sprintf("exclusive: %d of %d candidate devices are lent whole only (never shared or composed)", nx, len(cands)))
		}
	}
	return p
}

// noCandidate explains why no device is usable for q: it walks the
// devices again, recording each rejection.
func (x *Index) noCandidate(q *req, bv int32, sc *scope) *InfeasibleError {
	_, rej, examined := x.candidates(q, bv, sc, true)
	detail := fmt.Sprintf("no %s device for %s among %d examined", q.Kind, q.borrowerName(), examined)
	if len(q.Devices) > 0 {
		detail = fmt.Sprintf("no %s device for %s among the %d pinned", q.Kind, q.borrowerName(), examined)
	}
	top := rej.top()
	if top == ConstraintRole {
		// Name what the cluster offers: a role that is not there is most
		// often a typo.
		offered := "none lists a role"
		if rs := x.offeredRoles(q.Kind); len(rs) > 0 {
			offered = "roles offered: " + strings.Join(rs, ", ")
		}
		if n := rej.counts[ConstraintRole]; n < examined {
			detail += fmt.Sprintf("; %d do not offer role %s (%s)", n, q.Role, offered)
		} else {
			detail = fmt.Sprintf("no %s device offers role %s (%s)", q.Kind, q.Role, offered)
		}
	}
	return newInfeasible(detail, rej.list, top)
}

// noOption explains why no candidate holds any option in q's scope: each
// candidate, in candidate order, with its free capacity.
func (x *Index) noOption(q *req, sc *scope, cands []cand) *InfeasibleError {
	sorted := slices.Clone(cands)
	slices.SortFunc(sorted, func(a, b cand) int { return x.cmpCand(&a, &b) })
	what := fmt.Sprintf("a %s lease of %s", modeList(sc.dedicate, sc.share, sc.compose), x.amount(q.Kind, q.Size))
	if q.Whole {
		what = fmt.Sprintf("a whole-device lease of at least %s", x.amount(q.Kind, q.Size))
	}
	switch {
	case q.Kind == KindNIC && sc.compose && !sc.share && !sc.dedicate:
		what += fmt.Sprintf(" (a bond of %d needs as many different lenders with room)", sc.minW)
	case !q.Whole && sc.compose && !sc.share && !sc.dedicate && sc.minW == sc.maxW:
		what += fmt.Sprintf(" (%d parts of %s need as many devices with room)", sc.minW, x.amount(q.Kind, sc.partLen(q.Size, sc.minW)))
	}
	return newInfeasible("no device can hold "+what, x.modeRejections(sorted), ConstraintMode)
}

// modeList names the modes d(edicated), s(hared) and c(omposed) allowed.
func modeList(d, s, c bool) string {
	var m []string
	if d {
		m = append(m, ModeDedicated)
	}
	if s {
		m = append(m, ModeShared)
	}
	if c {
		m = append(m, ModeComposed)
	}
	return strings.Join(m, " or ")
}

// modeRejections is a rejection per candidate: its free capacity, or that
// it is lent whole only.
func (x *Index) modeRejections(cands []cand) []Rejection {
	var out []Rejection
	for _, c := range cands {
		ds := &x.devs[c.dev]
		r := x.devRejection(ds, ConstraintCapacity,
			fmt.Sprintf("%s free of %s, %s", x.amount(ds.dev.Kind, ds.free), x.amount(ds.dev.Kind, ds.dev.Capacity), leasesText(len(ds.leases))))
		if ds.dev.Kind == KindNIC && r.Name == "" {
			r.Reason += " (on " + ds.dev.Node + ")" // a name says the node
		}
		if ds.exclusive {
			r.Constraint, r.Reason = ConstraintExclusive, "exclusive (lent whole only): "+r.Reason
		}
		out = append(out, r)
	}
	return out
}

// whyLost names the first ranking figure on which b lost to a.
func whyLost(a, b *result, strategy string) string {
	switch {
	case a.unmet != b.unmet:
		return "it leaves " + strconv.Itoa(b.unmet) + " requirement(s) unmet, the choice " + strconv.Itoa(a.unmet)
	case a.modeRank != b.modeRank:
		return "mode preference"
	case strategy == Spread && a.slowdown != b.slowdown:
		return "more slowdown (" + fmtF(100*b.slowdown, 1) + "% vs " + fmtF(100*a.slowdown, 1) + "%)"
	case a.hops != b.hops:
		return strconv.Itoa(b.hops) + " hops vs " + strconv.Itoa(a.hops)
	case a.latency != b.latency:
		return "latency " + b.latency.String() + " vs " + a.latency.String()
	case a.linkBand != b.linkBand:
		return "link load " + fmtF(100*b.linkUtil, 0) + "% vs " + fmtF(100*a.linkUtil, 0) + "%"
	case a.pack1 != b.pack1 || a.pack2 != b.pack2:
		if strategy == Spread {
			return "device utilisation " + fmtF(100*b.pack1, 0) + "% vs " + fmtF(100*a.pack1, 0) + "%"
		}
		return "packing (binpack prefers devices already in use, then the tightest fit)"
	case a.slowdown != b.slowdown:
		return "more slowdown (" + fmtF(100*b.slowdown, 1) + "% vs " + fmtF(100*a.slowdown, 1) + "%)"
	case a.linkUtil != b.linkUtil:
		return "link load " + fmtF(100*b.linkUtil, 1) + "% vs " + fmtF(100*a.linkUtil, 1) + "%"
	}
	return "name order"
}

// explain describes the choice: top is the best and the runners-up in
// ranking order, nresults how many options were predicted and kept.
func (x *Index) explain(q *req, top []*result, nresults int, rejected []Rejection, ncand, examined int) []string {
	best := top[0]
	e := make([]string, 0, 6+min(len(best.impacts), 9)+len(top)+min(len(rejected), 5))
	need := "no bandwidth requirement"
	switch {
	case q.hard:
		kind := "relaxed"
		if q.tight {
			kind = "tight"
		}
		need = "deadline " + q.Deadline.String() + " for " + resource.FormatSize(q.Work) + " needs " + rateText(q.Kind, q.need) + " (" + kind + ")"
	case q.need > 0:
		need = "wants " + rateText(q.Kind, q.need) + " without slowdown"
	}
	size := x.amount(q.Kind, q.Size)
	if q.Whole {
		size = "whole device"
		if q.Size > 0 {
			size += " of at least " + x.amount(q.Kind, q.Size)
		}
	}
	e = append(e, "request: "+q.Kind+" "+size+" for "+q.borrowerName()+", "+need+", strategy "+q.strategy)
	if len(q.Labels) > 0 || len(q.Devices) > 0 {
		var sel []string
		for k, v := range q.Labels {
			sel = append(sel, k+"="+v)
		}
		sort.Strings(sel)
		c := "selector:"
		if len(sel) > 0 {
			c += " labels " + strings.Join(sel, ",")
		}
		if len(q.Devices) > 0 {
			pins := make([]string, len(q.Devices))
			for i, id := range q.Devices {
				pins[i] = id
				if di, ok := x.devByID[id]; ok {
					pins[i] = x.devText(&x.devs[di])
				}
			}
			c += " pinned to " + strings.Join(pins, ",")
		}
		e = append(e, c)
	}
	e = append(e, "candidates: "+plural(ncand, "usable device")+" of "+strconv.Itoa(examined)+" examined; "+
		plural(nresults+len(rejected), "option")+" predicted, "+strconv.Itoa(len(rejected))+" rejected")
	compl := ""
	if q.Work > 0 && !math.IsInf(best.rate, 1) {
		compl = ", completion " + best.compl.Round(time.Millisecond).String()
	}
	e = append(e, "chose "+x.optionText(best)+": "+strconv.Itoa(best.hops)+" hops, "+best.latency.String()+", "+
		predictedText(q.Kind, best.rate, true)+compl+", link load "+fmtF(100*best.linkUtil, 0)+"%")
	switch {
	case q.Whole:
		e = append(e, "mode: a whole device was asked for, so dedicated")
	case q.Mode != "":
		e = append(e, "mode: "+q.Mode+" was asked for")
	case q.tight:
		e = append(e, "mode: tight deadline, so dedicated is preferred, then composed, then shared (isolation from later arrivals)")
	case q.strategy == Spread:
		e = append(e, "mode: spread, so the least slowdown, then the nearest, then the least utilised devices win")
	default:
		e = append(e, "mode: binpack, so shared is preferred, then composed, then dedicated, while every requirement holds")
	}
	if len(best.impacts) == 0 {
		e = append(e, "impact: no running lease slowed")
	}
	for i, im := range best.impacts {
		if i == 8 {
			e = append(e, fmt.Sprintf("impact: … %d more", len(best.impacts)-8))
			break
		}
		s := "impact: " + im.LeaseID + " " + rateText(im.Kind, im.BandwidthBefore) + " → " + rateText(im.Kind, im.BandwidthAfter)
		if im.CompletionAfter > 0 {
			s += ", completion " + im.CompletionBefore.Round(time.Millisecond).String() + " → " + im.CompletionAfter.Round(time.Millisecond).String()
		}
		if im.MissesDeadline {
			s += " (misses its deadline)"
		}
		e = append(e, s)
	}
	for _, ru := range top[1:] {
		e = append(e, "runner-up "+x.optionText(ru)+": "+predictedText(q.Kind, ru.rate, false)+", lost on "+whyLost(best, ru, q.strategy))
	}
	for i, r := range rejected {
		if i == 4 {
			e = append(e, fmt.Sprintf("rejected: … %d more", len(rejected)-4))
			break
		}
		e = append(e, "rejected "+r.Text()+": "+r.Reason)
	}
	return e
}

// amount formats n units of a device of kind: a count (bytes, slots), for
// a nic a rate in bytes/s shown as a link rate, for accel with
// Snapshot.SlotUnits > 1 slots and shares of one.
func (x *Index) amount(kind string, n int64) string {
	switch {
	case kind == KindNIC:
		return resource.FormatLinkRate(float64(n))
	case kind == KindAccel && x.slotUnits > 1:
		return FormatSlots(n, x.slotUnits)
	case kind == KindBlock || kind == KindMemory:
		return resource.FormatSize(n)
	}
	return strconv.FormatInt(n, 10)
}

// FormatSlots formats n accel units, units a slot, as slots: "0.25 slot",
// "2 slots", "1.5 slots".
func FormatSlots(n, units int64) string {
	s := strconv.FormatFloat(float64(n)/float64(max(units, 1)), 'f', -1, 64)
	if n > 0 && n <= max(units, 1) {
		return s + " slot"
	}
	return s + " slots"
}

// fmtBW formats a rate in bytes/s as rates print (resource.FormatRate:
// "477MB/s"), or "no known limit" for +Inf: nothing on the path has a
// known rate.
func fmtBW(b float64) string {
	if math.IsInf(b, 1) {
		return "no known limit"
	}
	return resource.FormatRate(b)
}

// rateText formats a rate in bytes/s of a lease of kind: a nic's as a
// link rate (resource.FormatLinkRate: "500Mbit/s", as its size prints),
// any other's as fmtBW does.
func rateText(kind string, b float64) string {
	if kind == KindNIC && !math.IsInf(b, 1) {
		return resource.FormatLinkRate(b)
	}
	return fmtBW(b)
}

// predictedText is an option's predicted rate, of a lease of kind, as an
// explanation gives it: "predicted 477MB/s" ("predicted 500Mbit/s" for a
// nic), or, when neither the device (no profile, no declared bandwidth)
// nor any link on the path has a known rate, that no rate was predicted,
// and (why) why not.
func predictedText(kind string, rate float64, why bool) string {
	if !math.IsInf(rate, 1) {
		return "predicted " + rateText(kind, rate)
	}
	if why {
		return "bandwidth not predicted (no rate known for the device or its links)"
	}
	return "bandwidth not predicted"
}

// plural is "1 option", "3 options".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// fmtF is fmt's %.<prec>f (strconv formats floats the same way, Inf and
// NaN included).
func fmtF(v float64, prec int) string {
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// leasesText is "1 lease", "3 leases".
func leasesText(n int) string {
	if n == 1 {
		return "1 lease"
	}
	return strconv.Itoa(n) + " leases"
}

// borrowerName is how explanations name r's borrower: its BorrowerName
// (Index.admit sets it to "node n2 (node-…)" for a named node), or its ID.
func (r *Request) borrowerName() string {
	if r.BorrowerName != "" {
		return r.BorrowerName
	}
	return r.Borrower
}
