package placement

// The first stages of Index.Place: validate the request, admit the borrower
// and the tenant, and work out the scope (the modes the request allows and
// the parts they take).

import (
	"fmt"
	"math"
)

// req is a validated request with derived figures.
type req struct {
	Request
	demand   float64 // +Inf when elastic
	need     float64 // rate that meets the requirement (0: none)
	hard     bool    // need comes from a deadline
	tight    bool
	align    int64
	strategy string
}

// validate checks r's fields (an error matching ErrInvalid names the first
// wrong one) and derives the figures placement needs from them.
func (x *Index) validate(r Request) (req, error) {
	q := req{Request: r, demand: demandOf(r.Bandwidth), align: defaultAlignBytes, strategy: r.Strategy}
	switch r.Kind {
	case KindBlock, KindMemory:
	case KindAccel:
		// Whole slots, unless a share of one slot for a gateway.
		q.align = x.slotUnits
		switch {
		case r.Gateway != "" && r.Mode != ModeShared:
			return q, fmt.Errorf("%w: a gateway share is mode shared, not %q", ErrInvalid, r.Mode)
		case r.Gateway != "" && r.Size > x.slotUnits:
			return q, fmt.Errorf("%w: a gateway share of %s is more than one slot", ErrInvalid, x.amount(KindAccel, r.Size))
		case r.Gateway != "":
			q.align = 1
		case !r.Whole && r.Size%x.slotUnits != 0:
			return q, fmt.Errorf("%w: %s is not whole slots (only a shared lease with a gateway takes a share of one)", ErrInvalid, x.amount(KindAccel, r.Size))
		}
	case KindNIC:
		// A rate in bytes/s: any amount, held exactly (the lenders cap
		// the lease at it), and wanted in full unless a lower bandwidth
		// is asked for.
		q.align = 1
		if !r.Whole {
			q.Exact = true
			q.demand = min(q.demand, float64(r.Size))
		}
	default:
		return q, fmt.Errorf("%w: unknown kind %q", ErrInvalid, r.Kind)
	}
	switch {
	case r.Whole && r.Size < 0:
		return q, fmt.Errorf("%w: size must not be negative", ErrInvalid)
	case !r.Whole && r.Size <= 0:
		return q, fmt.Errorf("%w: size must be positive (or ask for a whole device)", ErrInvalid)
	}
	if r.StripeUnit < 0 {
		return q, fmt.Errorf("%w: stripe unit must not be negative", ErrInvalid)
	}
	switch r.Mode {
	case "", ModeDedicated, ModeShared, ModeComposed:
	default:
		return q, fmt.Errorf("%w: unknown mode %q", ErrInvalid, r.Mode)
	}
	if r.Whole && r.Mode != "" && r.Mode != ModeDedicated {
		return q, fmt.Errorf("%w: a whole device is dedicated, not %s (a %s lease needs a size)", ErrInvalid, r.Mode, r.Mode)
	}
	switch r.Strategy {
	case "":
		q.strategy = Binpack
	case Binpack, Spread:
	default:
		return q, fmt.Errorf("%w: unknown strategy %q", ErrInvalid, r.Strategy)
	}
	if r.Width < 0 || r.Width == 1 || (r.Width > 0 && r.Mode != ModeComposed) {
		return q, fmt.Errorf("%w: width %d needs mode composed and at least 2", ErrInvalid, r.Width)
	}
	if r.Deadline < 0 || r.Work < 0 || r.Bandwidth < 0 || r.MaxLatency < 0 {
		return q, fmt.Errorf("%w: negative deadline, work, bandwidth or latency", ErrInvalid)
	}
	if r.Deadline > 0 && r.Work == 0 {
		return q, fmt.Errorf("%w: a deadline needs work", ErrInvalid)
	}
	if r.Deadline > 0 {
		q.need = float64(r.Work) / r.Deadline.Seconds()
		q.hard = true
		if !math.IsInf(q.demand, 1) && q.need >= TightDeadlineRatio*q.demand {
			q.tight = true
		}
	} else if !math.IsInf(q.demand, 1) {
		q.need = q.demand
	}
	return q, nil
}

func roundUp(n, a int64) int64 { return (n + a - 1) / a * a }

// lcm is the least common multiple of two positive numbers.
func lcm(a, b int64) int64 {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}

// admit checks the borrower (a known node, ready) and the tenant's lease
// quota, and returns the borrower's fabric vertex.
func (x *Index) admit(r *Request) (int32, error) {
	bv, ok := x.borrowerVertex(r.Borrower)
	bn, nok := x.nodeByID[r.Borrower]
	if !ok || !nok {
		return 0, newInfeasible("borrower "+r.Borrower+" is not a known node", nil, ConstraintBorrower)
	}
	if r.BorrowerName == "" && x.nodes[bn].Name != "" && x.nodes[bn].Name != r.Borrower {
		r.BorrowerName = x.nodeText(r.Borrower)
	}
	if st := x.nodes[bn].State; st != "" && st != NodeReady {
		return 0, newInfeasible("borrower "+r.borrowerName()+" is "+st, nil, ConstraintBorrower)
	}
	if qt, ok := x.quota(r.Tenant); ok && qt.Leases > 0 {
		if u := x.tenants[r.Tenant]; u != nil && u.leases+1 > qt.Leases {
			return 0, newInfeasible(fmt.Sprintf("tenant %s holds %d of %d leases", r.Tenant, u.leases, qt.Leases), nil, ConstraintQuota)
		}
	}
	return bv, nil
}

// scope is what a validated request allows: the modes placement may
// choose and the parts each takes.
type scope struct {
	dedicate, share, compose bool
	minW, maxW               int   // widths of a composition
	shareLen                 int64 // a shared part
	compAlign                int64 // a composed part is a multiple of this
	minNeed                  int64 // the smallest part of any allowed sharing option (MaxInt64: none)
	minNeedW                 int   // the width of the composition minNeed is a part of (0: minNeed is a shared part)
}

// minNeedOf says what minNeed is a part of, for a rejection's "needs
// 1280MiB (a part of a 4-way composition)": a request too large for one
// device asks each device for less than its size, which a reason must say.
func (sc *scope) minNeedOf(kind string) string {
	switch {
	case sc.minNeedW == 0:
		return ""
	case kind == KindNIC:
		return fmt.Sprintf(" (a lender's part of a bond of %d)", sc.minNeedW)
	}
	return fmt.Sprintf(" (a part of a %d-way composition)", sc.minNeedW)
}

// scopeOf works out q's scope. A mode asked for is the only one allowed;
// without one, dedicated always is, shared and composed when the request
// permits them. Two kinds of request narrow it further:
//   - a whole device is dedicated, never shared or composed;
//   - an accelerator lease counts slots, so a composition has at most one
//     part per slot asked for (parts are whole slots: q.align is the
//     snapshot's SlotUnits, but 1 for a gateway share).
func scopeOf(q *req) scope {
	r := &q.Request
	sc := scope{
		dedicate: r.Mode == "" || r.Mode == ModeDedicated,
		share:    !r.Whole && (r.Mode == ModeShared || (r.Mode == "" && r.AllowShare)),
		compose:  !r.Whole && (r.Mode == ModeComposed || (r.Mode == "" && r.AllowCompose)),
		minW:     2,
		maxW:     MaxWidth,
		minNeed:  math.MaxInt64,
	}
	if r.Width > 0 {
		sc.minW, sc.maxW = r.Width, r.Width
	}
	if r.Kind == KindAccel && int64(sc.maxW) > r.Size/q.align {
		sc.maxW = int(r.Size / q.align)
	}
	sc.shareLen = roundUp(r.Size, q.align)
	if sc.share {
		sc.minNeed = sc.shareLen
	}
	sc.compAlign = q.align
	if r.StripeUnit > 0 {
		sc.compAlign = lcm(q.align, r.StripeUnit)
	}
	if sc.compose && sc.maxW >= sc.minW {
		if n := sc.partLen(r.Size, sc.maxW); n < sc.minNeed {
			sc.minNeed, sc.minNeedW = n, sc.maxW
		}
	}
	return sc
}

// partLen is the part of a composition of width w holding size.
func (sc *scope) partLen(size int64, w int) int64 {
	return roundUp((size+int64(w)-1)/int64(w), sc.compAlign)
}
