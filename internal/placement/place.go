package placement

import (
	"fmt"
	"math"
	"slices"
)

// Place decides where the lease r asks for goes in s. It is pure and
// deterministic. An impossible request gets an *InfeasibleError (matching
// ErrInfeasible) naming the constraint and each candidate's rejection; a
// malformed one gets an error matching ErrInvalid.
func Place(s *Snapshot, r Request) (Plan, error) {
	return NewIndex(s).Place(r)
}

// Place is Place against the index's snapshot (plus leases added since).
func (x *Index) Place(r Request) (Plan, error) {
	q, err := x.validate(r)
	if err != nil {
		return Plan{}, err
	}
	bv, ok := x.borrowerVertex(r.Borrower)
	bn, nok := x.nodeByID[r.Borrower]
	if !ok || !nok {
		return Plan{}, newInfeasible("borrower "+r.Borrower+" is not a known node", nil, ConstraintBorrower)
	}
	if st := x.nodes[bn].State; st != "" && st != NodeReady {
		return Plan{}, newInfeasible("borrower "+r.Borrower+" is "+st, nil, ConstraintBorrower)
	}
	if qt, ok := x.quota(r.Tenant); ok && qt.Leases > 0 {
		if u := x.tenants[r.Tenant]; u != nil && u.leases+1 > qt.Leases {
			return Plan{}, newInfeasible(fmt.Sprintf("tenant %s holds %d of %d leases", r.Tenant, u.leases, qt.Leases), nil, ConstraintQuota)
		}
	}
	allowDed := r.Mode == "" || r.Mode == ModeDedicated
	allowShare := !r.Whole && (r.Mode == ModeShared || (r.Mode == "" && r.AllowShare))
	allowComp := !r.Whole && (r.Mode == ModeComposed || (r.Mode == "" && r.AllowCompose))
	minW, maxW := 2, MaxWidth
	if r.Width > 0 {
		minW, maxW = r.Width, r.Width
	}
	if r.Kind == KindAccel && int64(maxW) > r.Size {
		maxW = int(r.Size)
	}
	shareLen := roundUp(r.Size, q.align)
	minNeed := int64(math.MaxInt64)
	if allowShare {
		minNeed = shareLen
	}
	compAlign := q.align
	if r.StripeUnit > 0 {
		compAlign = lcm(q.align, r.StripeUnit)
	}
	if allowComp && maxW >= minW {
		if n := roundUp((r.Size+int64(maxW)-1)/int64(maxW), compAlign); n < minNeed {
			minNeed = n
		}
	}

	cands, _, examined := x.candidates(q, bv, allowDed, minNeed, false)
	if len(cands) == 0 {
		var rej rejections
		_, rej, examined = x.candidates(q, bv, allowDed, minNeed, true)
		detail := fmt.Sprintf("no %s device for %s among %d examined", r.Kind, r.Borrower, examined)
		if len(r.Devices) > 0 {
			detail = fmt.Sprintf("no %s device for %s among the %d pinned", r.Kind, r.Borrower, examined)
		}
		return Plan{}, newInfeasible(detail, rej.list, rej.top())
	}

	// Candidate positions (in the unsorted list), for lookups in eval and
	// the canonical option order (candidate order, cmpCand).
	if len(x.candPos) < len(x.devs) {
		x.candPos = make([]int32, len(x.devs))
	}
	for i := range cands {
		x.candPos[cands[i].dev] = int32(i)
	}
	// Options. Each list below is what walking the candidates in order and
	// taking the first matches gives; topK selects them without a sort.
	var opts []option
	addOpt := func(o option) {
		if len(o.devs) > 1 {
			slices.SortFunc(o.devs, func(a, b int32) int { return x.cmpCand(&cands[x.candPos[a]], &cands[x.candPos[b]]) })
		}
		for _, e := range opts {
			if e.mode == o.mode && slices.Equal(e.devs, o.devs) {
				return
			}
		}
		opts = append(opts, o)
	}
	sel := x.selBuf[:0]
	// The first candidates in order: most lists below are found in it.
	prefix := x.topK(x.prefBuf[:0], cands, candPrefix, nil, false)
	x.prefBuf = prefix[:0]
	if allowDed {
		sel = x.firstK(sel, prefix, cands, 2, func(c *cand) bool {
			return x.dedicable(&x.devs[c.dev], &q)
		})
		for _, i := range sel {
			c := &cands[i]
			addOpt(option{mode: ModeDedicated, devs: []int32{c.dev}, partLen: x.devs[c.dev].dev.Capacity})
		}
	}
	// The MaxWidth least-loaded candidates, ties in candidate order.
	var byLoadBuf [MaxWidth]cand
	byLoad := byLoadBuf[:0]
	sel = x.topK(sel, cands, MaxWidth, nil, true)
	for _, i := range sel {
		byLoad = append(byLoad, cands[i])
	}
	if allowShare {
		add := func(c *cand) {
			if ds := &x.devs[c.dev]; ds.free >= shareLen && !ds.exclusive {
				addOpt(option{mode: ModeShared, devs: []int32{c.dev}, partLen: shareLen})
			}
		}
		sel = x.firstK(sel, prefix, cands, 6, x.partitionable)
		for _, i := range sel {
			add(&cands[i])
		}
		for i := 0; i < len(byLoad) && i < 2; i++ {
			add(&byLoad[i])
		}
	}
	if allowComp {
		// A block volume's parts go to w different lenders whenever w
		// lenders have room, so that their traffic shares no lender's link
		// or disks; only with fewer lenders may one hold several parts.
		// The lenders are picked from the best few candidates that could
		// hold the smallest part. (Accelerators keep to candidate order,
		// which favours slots close together.)
		var poolBuf [4 * MaxWidth]int32
		var pool []int32
		if r.Kind == KindBlock {
			least := roundUp((r.Size+int64(maxW)-1)/int64(maxW), compAlign)
			pool = x.topK(poolBuf[:0], cands, len(poolBuf), func(c *cand) bool {
				ds := &x.devs[c.dev]
				return ds.free >= least && !ds.exclusive
			}, false)
		}
		for w := minW; w <= maxW; w++ {
			pl := roundUp((r.Size+int64(w)-1)/int64(w), compAlign)
			fits := func(c *cand) bool { ds := &x.devs[c.dev]; return ds.free >= pl && !ds.exclusive }
			if devs := x.distinctLenders(len(pool), func(k int) *cand { return &cands[pool[k]] }, w, fits); devs != nil {
				addOpt(option{mode: ModeComposed, devs: devs, partLen: pl})
				if devs := x.distinctLenders(len(byLoad), func(k int) *cand { return &byLoad[k] }, w, fits); devs != nil {
					addOpt(option{mode: ModeComposed, devs: devs, partLen: pl})
				}
				continue
			}
			sel = x.firstK(sel, prefix, cands, w, fits)
			if len(sel) == w {
				devs := make([]int32, w)
				for k, i := range sel {
					devs[k] = cands[i].dev
				}
				addOpt(option{mode: ModeComposed, devs: devs, partLen: pl})
			}
			var devs []int32
			for k := range byLoad {
				if fits(&byLoad[k]) {
					devs = append(devs, byLoad[k].dev)
					if len(devs) == w {
						break
					}
				}
			}
			if len(devs) == w {
				addOpt(option{mode: ModeComposed, devs: devs, partLen: pl})
			}
		}
	}
	x.selBuf = sel[:0]
	if len(opts) == 0 {
		sorted := slices.Clone(cands)
		slices.SortFunc(sorted, func(a, b cand) int { return x.cmpCand(&a, &b) })
		what := fmt.Sprintf("a %s lease of %d", modeList(allowDed, allowShare, allowComp), r.Size)
		if r.Whole {
			what = fmt.Sprintf("a whole-device lease of at least %d", r.Size)
		}
		return Plan{}, newInfeasible("no device can hold "+what, x.modeRejections(sorted), ConstraintMode)
	}
	x.offArena, x.impArena = x.offArena[:0], x.impArena[:0]
	results := x.resBuf[:0]
	defer func() {
		clear(results)
		x.resBuf = results[:0]
	}()
	var rejected []Rejection
	for _, o := range opts {
		res := x.eval(q, bv, o, cands)
		if res.rejection != nil {
			rejected = append(rejected, *res.rejection)
			continue
		}
		results = append(results, res)
	}
	if len(results) == 0 {
		return Plan{}, newInfeasible(fmt.Sprintf("all %d options for %s rejected", len(rejected), r.Borrower), rejected, "")
	}
	// The best and up to three runners-up, in the order a stable sort by
	// less would give (the first of equals stays first): selection instead
	// of sorting every option.
	var topBuf [4]*result
	top := topBuf[:0]
	for i := range results {
		c := &results[i]
		if len(top) == len(topBuf) && !x.less(c, top[len(top)-1], q.strategy) {
			continue
		}
		j := len(top)
		if j < len(topBuf) {
			top = append(top, nil)
		} else {
			j--
		}
		for j > 0 && x.less(c, top[j-1], q.strategy) {
			top[j] = top[j-1]
			j--
		}
		top[j] = c
	}
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
	p.Explanation = x.explain(q, top, len(results), rejected, len(cands), examined)
	if allowShare || allowComp {
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
	return p, nil
}
