package placement

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

// Place decides where the lease r asks for goes in s. It is pure and
// deterministic. An impossible request gets an *InfeasibleError (matching
// ErrInfeasible) naming the constraint and each candidate's rejection; a
// malformed one gets an error matching ErrInvalid.
func Place(s *Snapshot, r Request) (Plan, error) {
	return NewIndex(s).Place(r)
}

// candPrefix is how many candidates Place orders up front (at least the
// six shared options and the widest composition).
const candPrefix = 8

type cand struct {
	k1       uint64 // hops, latency, link band, packing: see candKey
	dev      int32
	dist     fabric.Distance
	latency  time.Duration // path + device
	linkUtil float64       // worst current utilisation on the path
	nLeases  int
}

type option struct {
	mode    string
	devs    []int32
	partLen int64
}

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

func (x *Index) validate(r Request) (req, error) {
	q := req{Request: r, demand: demandOf(r.Bandwidth), align: defaultAlignBytes, strategy: r.Strategy}
	switch r.Kind {
	case KindBlock, KindMemory:
	case KindAccel:
		q.align = 1
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

func (x *Index) modeRejections(cands []cand) []Rejection {
	var out []Rejection
	for _, c := range cands {
		ds := &x.devs[c.dev]
		r := Rejection{Candidate: ds.dev.ID, Constraint: ConstraintCapacity,
			Reason: fmt.Sprintf("%d free of %d, %d leases", ds.free, ds.dev.Capacity, len(ds.leases))}
		if ds.exclusive {
			r.Constraint, r.Reason = ConstraintExclusive, "exclusive (lent whole only): "+r.Reason
		}
		out = append(out, r)
	}
	return out
}

// wholeFree reports whether ds can be dedicated to a request of size n: an
// empty device (no lease at all) of capacity at least n.
func (x *Index) wholeFree(ds *devState, n int64) bool {
	return len(ds.leases) == 0 && !ds.dedicated && ds.dev.Capacity >= n && ds.dev.Capacity > 0
}

// dedicable reports whether ds can be dedicated to q: wholeFree, and of
// exactly q's size when q is Exact.
func (x *Index) dedicable(ds *devState, q *req) bool {
	return x.wholeFree(ds, q.Size) && (!q.Exact || q.Whole || ds.dev.Capacity == q.Size)
}

// notWholeReason says why ds cannot be dedicated to a request of size n.
func (x *Index) notWholeReason(ds *devState, n int64) string {
	if len(ds.leases) > 0 {
		return fmt.Sprintf("in use by %d lease(s): dedicated needs an unused device", len(ds.leases))
	}
	if ds.dev.Capacity > n && n > 0 {
		return fmt.Sprintf("capacity %d: only a device of exactly %d is dedicated to this request", ds.dev.Capacity, n)
	}
	return fmt.Sprintf("capacity %d: dedicated needs at least %d", ds.dev.Capacity, n)
}

// partitionable is the candidates that may hold a part: not exclusive.
func (x *Index) partitionable(c *cand) bool { return !x.devs[c.dev].exclusive }

// labelled reports whether ds's node carries every selected label.
func (x *Index) labelled(sel map[string]string, ds *devState) bool {
	if ds.node < 0 {
		return false
	}
	labels := x.nodes[ds.node].Labels
	for k, v := range sel {
		if lv, ok := labels[k]; !ok || lv != v {
			return false
		}
	}
	return true
}

// missingLabel names the first selected label (in key order) ds's node
// lacks.
func (x *Index) missingLabel(sel map[string]string, ds *devState) string {
	var labels map[string]string
	if ds.node >= 0 {
		labels = x.nodes[ds.node].Labels
	}
	missing := ""
	for k, v := range sel {
		if lv, ok := labels[k]; ok && lv == v {
			continue
		}
		if t := k + "=" + v; missing == "" || t < missing {
			missing = t
		}
	}
	return missing
}

type labelKV struct{ k, v string }

// labelGroup reports whether anchor group a may hold a device whose node
// carries every selected label: it has, for each, a node with it. The
// label → anchors table is built on first use.
func (x *Index) labelGroup(sel map[string]string, a int32) bool {
	if x.labelAnchors == nil {
		x.labelAnchors = map[labelKV]map[int32]struct{}{}
		for i := range x.devs {
			ds := &x.devs[i]
			if ds.node < 0 {
				continue
			}
			for k, v := range x.nodes[ds.node].Labels {
				m := x.labelAnchors[labelKV{k, v}]
				if m == nil {
					m = map[int32]struct{}{}
					x.labelAnchors[labelKV{k, v}] = m
				}
				m[ds.anchor] = struct{}{}
			}
		}
	}
	for k, v := range sel {
		if _, ok := x.labelAnchors[labelKV{k, v}][a]; !ok {
			return false
		}
	}
	return true
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

// cmpCand is the candidate order, a total order: nearest, lowest latency,
// least loaded links, the strategy's packing, then link utilisation, and
// ties end on device ID.
func (x *Index) cmpCand(a, b *cand) int {
	switch {
	case a.k1 != b.k1:
		if a.k1 < b.k1 {
			return -1
		}
		return 1
	case a.linkUtil != b.linkUtil:
		if a.linkUtil < b.linkUtil {
			return -1
		}
		return 1
	}
	return int(x.devRank[a.dev]) - int(x.devRank[b.dev])
}

// before is the candidate order (cmpCand), or with byLoad fewest leases
// first and then the candidate order.
func (x *Index) before(a, b *cand, byLoad bool) bool {
	if byLoad && a.nLeases != b.nLeases {
		return a.nLeases < b.nLeases
	}
	if a.k1 != b.k1 {
		return a.k1 < b.k1
	}
	return x.cmpCand(a, b) < 0
}

// topK appends to dst the positions in cands of the (at most) k first
// candidates in order (x.before) for which keep (nil: all) holds, in that
// order: what walking a sorted list and taking the first k matches gives.
func (x *Index) topK(dst []int32, cands []cand, k int, keep func(c *cand) bool, byLoad bool) []int32 {
	dst = dst[:0]
	if k <= 0 {
		return dst
	}
	for i := range cands {
		c := &cands[i]
		if keep != nil && !keep(c) {
			continue
		}
		if len(dst) == k && !x.before(c, &cands[dst[k-1]], byLoad) {
			continue
		}
		j := len(dst)
		if j < k {
			dst = append(dst, 0)
		} else {
			j = k - 1
		}
		for j > 0 && x.before(c, &cands[dst[j-1]], byLoad) {
			dst[j] = dst[j-1]
			j--
		}
		dst[j] = int32(i)
	}
	return dst
}

// firstK is topK(dst, cands, k, keep, false) using prefix, the first
// candidates in order, when it holds k matches (or all candidates).
func (x *Index) firstK(dst, prefix []int32, cands []cand, k int, keep func(c *cand) bool) []int32 {
	dst = dst[:0]
	for _, i := range prefix {
		if len(dst) == k {
			return dst
		}
		if keep == nil || keep(&cands[i]) {
			dst = append(dst, i)
		}
	}
	if len(dst) == k || len(prefix) == len(cands) {
		return dst
	}
	return x.topK(dst, cands, k, keep, false)
}

// distinctLenders returns w devices on w different nodes: of the n
// candidates at(0), at(1), ... (best first), the first that keep holds for
// on each node; nil when fewer than w nodes have one.
func (x *Index) distinctLenders(n int, at func(k int) *cand, w int, keep func(c *cand) bool) []int32 {
	var devs []int32
next:
	for k := range n {
		c := at(k)
		if !keep(c) {
			continue
		}
		node := x.devs[c.dev].dev.Node
		for _, d := range devs {
			if x.devs[d].dev.Node == node {
				continue next
			}
		}
		devs = append(devs, c.dev)
		if len(devs) == w {
			return devs
		}
	}
	return nil
}

// candKey packs a candidate's ordering: fewest hops, lowest latency, link
// load in 10% bands, then the strategy's packing (binpack: most leases
// first; spread: fewest).
func candKey(c *cand, strategy string) uint64 {
	hops := min(uint64(c.dist.Hops), 255)
	lat := min(uint64(max(c.latency, 0)), 1<<35-1)
	b := min(uint64(max(band(c.linkUtil), 0)), 15)
	n := min(uint64(c.nLeases), 1<<16-1)
	if strategy != Spread {
		n = 1<<16 - 1 - n
	}
	return hops<<56 | lat<<20 | b<<16 | n
}

func band(u float64) int { return int(math.Floor(u * 10)) }

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

func (x *Index) affine(r Request, ds *devState) bool {
	if len(r.Affinity) == 0 && len(r.AntiAffinity) == 0 {
		return true
	}
	var labels map[string]string
	if ds.node >= 0 {
		labels = x.nodes[ds.node].Labels
	}
	match := func(term string) bool {
		if term == ds.dev.Node {
			return true
		}
		if k, v, ok := strings.Cut(term, "="); ok {
			lv, has := labels[k]
			return has && lv == v
		}
		return false
	}
	if len(r.Affinity) > 0 {
		ok := false
		for _, t := range r.Affinity {
			if match(t) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for _, t := range r.AntiAffinity {
		if match(t) {
			return false
		}
	}
	return true
}

// routeUtil is pathUtil(route(b, a), 0) with t the tree from b's anchor:
// the worst utilisation over b's leaf link, the core path between the
// anchors (computed once per anchor per candidates call) and a's leaf link.
// The worst of a set does not depend on the order it is taken in.
func (x *Index) routeUtil(t *fabric.Tree, b, a int32) float64 {
	if a == b || x.anchor[a] == b || x.anchor[b] == a {
		x.utilPath = x.route(x.utilPath[:0], b, a)
		return x.pathUtil(x.utilPath, 0)
	}
	aa := x.anchor[a]
	worst := 0.0
	if x.uStamp[aa] == x.uEpoch {
		worst = x.uVal[aa]
	} else {
		path := x.utilPath[:0]
		for _, cl := range t.PathTo(int(x.coreOf[aa])) {
			path = append(path, x.coreLink[cl])
		}
		x.utilPath = path
		worst = x.pathUtil(path, 0)
		x.uStamp[aa], x.uVal[aa] = x.uEpoch, worst
	}
	for _, li := range [2]int32{x.leafLink[b], x.leafLink[a]} {
		if li < 0 {
			continue
		}
		l := &x.links[li]
		if l.Bandwidth <= 0 {
			continue
		}
		if u := (l.Load + x.res[len(x.devs)+int(li)].load) / l.Bandwidth; u > worst {
			worst = u
		}
	}
	return worst
}

// pathUtil is the worst utilisation on a path with extra added to each link.
func (x *Index) pathUtil(path []int32, extra float64) float64 {
	worst := 0.0
	for _, li := range path {
		l := &x.links[li]
		if l.Bandwidth <= 0 {
			continue
		}
		u := (l.Load + x.res[len(x.devs)+int(li)].load + extra) / l.Bandwidth
		if u > worst {
			worst = u
		}
	}
	return worst
}

// span is a used range of a device: a lease's part.
type span struct{ off, end int64 }

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
		im := Impact{LeaseID: ls.l.ID, BandwidthBefore: before, BandwidthAfter: after,
			CompletionBefore: completion(ls.l.Remaining, before), CompletionAfter: completion(ls.l.Remaining, after)}
		im.MissesDeadline = ls.l.Deadline > 0 && ls.l.Remaining > 0 && x.now+im.CompletionAfter > ls.l.Deadline
		res.impacts = append(res.impacts, im)
	}
	if len(res.impacts) > 1 {
		slices.SortFunc(res.impacts, func(a, b Impact) int { return strings.Compare(a.LeaseID, b.LeaseID) })
	}
}

// eval predicts the outcome of one option.
func (x *Index) eval(q req, bv int32, o option, cands []cand) result {
	res := result{opt: o, offStart: int32(len(x.offArena))}
	reject := func(c, reason string) result {
		res.rejection = &Rejection{Candidate: x.name(&res), Constraint: c, Reason: reason}
		return res
	}
	// Parts: offsets in x.offArena (finish builds the chosen plan's).
	var ch usage
	for _, di := range o.devs {
		ds := &x.devs[di]
		off, length := int64(0), o.partLen
		if o.mode != ModeDedicated {
			var ok bool
			off, ok = x.hole(di, o.partLen, q.align)
			if !ok {
				return reject(ConstraintCapacity, fmt.Sprintf("%s has %d free but no contiguous %d", ds.dev.ID, ds.free, o.partLen))
			}
		}
		x.offArena = append(x.offArena, off)
		if q.Kind == KindAccel {
			ch.slots += length
		} else {
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
	if qt, ok := x.quota(q.Tenant); ok {
		u := x.tenants[q.Tenant]
		if u == nil {
			u = &usage{}
		}
		switch {
		case qt.Bytes > 0 && u.bytes+ch.bytes > qt.Bytes:
			return reject(ConstraintQuota, fmt.Sprintf("tenant %s would hold %d of %d bytes", q.Tenant, u.bytes+ch.bytes, qt.Bytes))
		case qt.Slots > 0 && u.slots+ch.slots > qt.Slots:
			return reject(ConstraintQuota, fmt.Sprintf("tenant %s would hold %d of %d slots", q.Tenant, u.slots+ch.slots, qt.Slots))
		case qt.Bandwidth > 0 && u.bandwidth+ch.bandwidth > qt.Bandwidth:
			return reject(ConstraintQuota, fmt.Sprintf("tenant %s would use %s of %s", q.Tenant, fmtBW(u.bandwidth+ch.bandwidth), fmtBW(qt.Bandwidth)))
		}
	}
	uses := x.usesFor(bv, o.devs, x.evalUses[:0])
	x.evalUses = uses
	sol := x.localSolve(uses, q.demand, -1)
	res.impStart = int32(len(x.impArena))
	res.rate = sol.newRate
	res.compl = completion(q.Work, res.rate)
	if q.hard && res.rate < q.need*(1-1e-9) {
		return reject(ConstraintDeadline, fmt.Sprintf("predicted %s, completion %v > deadline %v", fmtBW(res.rate), res.compl.Round(time.Second), q.Deadline))
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
				return reject(ConstraintDeadline, fmt.Sprintf("running lease %s would miss its deadline (completion %v → %v)",
					ls.l.ID, cb.Round(time.Second), ca.Round(time.Second)))
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

	// Ranking figures.
	switch {
	case q.tight:
		switch o.mode {
		case ModeComposed:
			res.modeRank = 1
		case ModeShared:
			res.modeRank = 2
		}
	case q.strategy == Spread:
		if o.mode == ModeDedicated {
			res.modeRank = 1
		}
	default:
		switch o.mode {
		case ModeComposed:
			res.modeRank = 1
		case ModeDedicated:
			res.modeRank = 2
		}
	}
	k := float64(len(o.devs))
	add := res.rate
	if math.IsInf(add, 1) {
		add = 0
	}
	for _, u := range uses {
		if u.Resource < len(x.devs) {
			continue
		}
		li := u.Resource - len(x.devs)
		l := &x.links[li]
		if l.Bandwidth <= 0 {
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
		if v := (l.Load + load) / l.Bandwidth; v > res.linkUtil {
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
	return res
}

// devUtil is device di's demand over its delivered bandwidth once a new
// stream of demand add joins it.
func (x *Index) devUtil(di int32, add float64) float64 {
	ds := &x.devs[di]
	c := x.devCap(int(di), len(ds.leases)+1)
	if math.IsInf(c, 1) || c <= 0 {
		return 0
	}
	sum := 0.0
	if !math.IsInf(add, 1) {
		sum += add
	} else {
		sum += c
	}
	for _, li := range ds.leases {
		ls := &x.leases[li]
		coef := 0.0
		for _, u := range ls.uses {
			if u.Resource == int(di) {
				coef = u.Coef
			}
		}
		d := demandOf(ls.l.Demand)
		if math.IsInf(d, 1) {
			d = ls.rate / math.Max(coef, 1e-12)
			if math.IsInf(d, 1) {
				d = c
			}
		}
		sum += coef * d
	}
	return sum / c
}

func (x *Index) less(a, b *result, strategy string) bool {
	if a.unmet != b.unmet {
		return a.unmet < b.unmet
	}
	if a.modeRank != b.modeRank {
		return a.modeRank < b.modeRank
	}
	if strategy == Spread && a.slowdown != b.slowdown {
		return a.slowdown < b.slowdown
	}
	if a.hops != b.hops {
		return a.hops < b.hops
	}
	if a.latency != b.latency {
		return a.latency < b.latency
	}
	if a.linkBand != b.linkBand {
		return a.linkBand < b.linkBand
	}
	if a.pack1 != b.pack1 {
		return a.pack1 < b.pack1
	}
	if a.pack2 != b.pack2 {
		return a.pack2 < b.pack2
	}
	if a.slowdown != b.slowdown {
		return a.slowdown < b.slowdown
	}
	if a.linkUtil != b.linkUtil {
		return a.linkUtil < b.linkUtil
	}
	return x.name(a) < x.name(b)
}

// name is the option's name ("shared node/device", "composed n/d+n/d"),
// built on first use: only ties, rejections and the explanation need it.
func (x *Index) name(res *result) string {
	if res.name != "" {
		return res.name
	}
	var nb strings.Builder
	n := len(res.opt.mode)
	for _, di := range res.opt.devs {
		n += 2 + len(x.devs[di].dev.Node) + len(x.devs[di].dev.ID)
	}
	nb.Grow(n)
	nb.WriteString(res.opt.mode)
	for i, di := range res.opt.devs {
		if i == 0 {
			nb.WriteByte(' ')
		} else {
			nb.WriteByte('+')
		}
		nb.WriteString(x.devs[di].dev.Node)
		nb.WriteByte('/')
		nb.WriteString(x.devs[di].dev.ID)
	}
	res.name = nb.String()
	return res.name
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
func (x *Index) explain(q req, top []*result, nresults int, rejected []Rejection, ncand, examined int) []string {
	best := top[0]
	e := make([]string, 0, 6+min(len(best.impacts), 9)+len(top)+min(len(rejected), 5))
	need := "no bandwidth requirement"
	switch {
	case q.hard:
		kind := "relaxed"
		if q.tight {
			kind = "tight"
		}
		need = "deadline " + q.Deadline.String() + " for " + fmtBytes(q.Work) + " needs " + fmtBW(q.need) + " (" + kind + ")"
	case q.need > 0:
		need = "wants " + fmtBW(q.need) + " without slowdown"
	}
	size := strconv.FormatInt(q.Size, 10)
	if q.Whole {
		size = "whole device"
		if q.Size > 0 {
			size += " of at least " + strconv.FormatInt(q.Size, 10)
		}
	}
	e = append(e, "request: "+q.Kind+" "+size+" for "+q.Borrower+", "+need+", strategy "+q.strategy)
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
			c += " pinned to " + strings.Join(q.Devices, ",")
		}
		e = append(e, c)
	}
	e = append(e, "candidates: "+strconv.Itoa(ncand)+" usable devices of "+strconv.Itoa(examined)+" examined; "+
		strconv.Itoa(nresults+len(rejected))+" options predicted, "+strconv.Itoa(len(rejected))+" rejected")
	compl := ""
	if q.Work > 0 {
		compl = ", completion " + best.compl.Round(time.Millisecond).String()
	}
	e = append(e, "chose "+x.name(best)+": "+strconv.Itoa(best.hops)+" hops, "+best.latency.String()+", predicted "+
		fmtBW(best.rate)+compl+", link load "+fmtF(100*best.linkUtil, 0)+"%")
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
		s := "impact: " + im.LeaseID + " " + fmtBW(im.BandwidthBefore) + " → " + fmtBW(im.BandwidthAfter)
		if im.CompletionAfter > 0 {
			s += ", completion " + im.CompletionBefore.Round(time.Millisecond).String() + " → " + im.CompletionAfter.Round(time.Millisecond).String()
		}
		if im.MissesDeadline {
			s += " (misses its deadline)"
		}
		e = append(e, s)
	}
	for _, ru := range top[1:] {
		e = append(e, "runner-up "+x.name(ru)+": predicted "+fmtBW(ru.rate)+", lost on "+whyLost(best, ru, q.strategy))
	}
	for i, r := range rejected {
		if i == 4 {
			e = append(e, fmt.Sprintf("rejected: … %d more", len(rejected)-4))
			break
		}
		e = append(e, "rejected "+r.Candidate+": "+r.Reason)
	}
	return e
}

func fmtBW(b float64) string {
	if math.IsInf(b, 1) {
		return "unbounded"
	}
	return fmtF(b/1e6, 1) + " MB/s"
}

func fmtBytes(n int64) string {
	return fmtF(float64(n)/1e9, 1) + " GB"
}

// fmtF is fmt's %.<prec>f (strconv formats floats the same way, Inf and
// NaN included).
func fmtF(v float64, prec int) string {
	return strconv.FormatFloat(v, 'f', prec, 64)
}
