package placement

import (
	"cmp"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

// Index is a snapshot prepared for many placements: devices grouped by
// where they attach to the fabric, per-borrower distance orders (computed on
// first use and cached), free capacity, and the current predicted rate of
// every lease with the resulting load on every device and link. Build it
// with NewIndex; it does not modify the Snapshot. It is not safe for
// concurrent use.
type Index struct {
	now      time.Duration
	profiles map[string]Profile
	quotas   map[string]Quota
	defQuota Quota

	nodes    []Node
	nodeByID map[string]int
	devs     []devState
	devByID  map[string]int
	devRank  []int32 // position of each device in ID order

	g        *fabric.Graph
	links    []fabric.Link
	anchor   []int32         // per vertex: the core vertex it hangs off (itself when core)
	leafLink []int32         // per vertex: link to its anchor, -1 when core
	leafLat  []time.Duration // per vertex: that link's effective latency
	linkRes  []float64       // per link: Residual()
	core     *fabric.Graph
	coreOf   []int32 // full vertex -> core vertex, -1 for leaves
	coreLink []int32 // core link -> full link
	trees    map[int32]*fabric.Tree

	groups map[string]*kindGroups
	local  map[localKey][]int32 // devices by the vertex they attach to, sorted by ID
	orders map[orderKey][]int32

	leases    []leaseState // slots; Remove frees one and insertLease reuses it
	leaseByID map[string]int
	freeSlots []int32    // free slots in leases
	leaseSeq  uint64     // insertions so far: the next lease's seq
	reused    bool       // a slot was reused, so slot order is not lease order
	res       []resState // devices first, then links
	tenants   map[string]*usage
	slotUnits int64 // Snapshot.SlotUnits, at least 1

	solver fabric.Solver
	// scratch, reused across calls (epoch-stamped)
	epoch      uint32
	rEpoch     uint32
	resStamp   []uint32
	resLocal   []int32
	lsStamp    []uint32
	pathBuf    []int32
	candBuf    []cand
	candPos    []int32 // per device: position in the current candidate list
	evalUses   []fabric.Use
	affBuf     []int32
	devScratch []int32
	flowBuf    []fabric.Flow
	useBuf     []fabric.Use
	capBuf     []float64
	loadBuf    []float64
	afterBuf   []float64
	rateBuf    []float64
	globBuf    []int
	selBuf     []int32
	prefBuf    []int32
	notes      []devNote // devices Add or Remove is changing
	building   bool      // NewIndex is inserting the snapshot's leases
	offArena   []int64   // per Place: the options' part offsets
	impArena   []impRef  // per Place: the leases the options slow
	resBuf     []result
	utilPath   []int32
	uEpoch     uint32
	uStamp     []uint32  // per vertex (an anchor): uVal is current
	uVal       []float64 // per anchor: worst utilisation on the core path

	labelAnchors map[labelKV]map[int32]struct{} // anchors with a node carrying each label; built on first use
}

type devState struct {
	dev       Device
	node      int // -1 when unknown
	vertex    int32
	anchor    int32
	prof      Profile
	hasProf   bool
	free      int64
	dedicated bool   // held whole: by a dedicated lease, or any lease when exclusive
	exclusive bool   // Device.Exclusive
	usable    string // "" when usable, else the constraint that rules it out
	leases    []int32
	spans     []span // the parts of leases on it, sorted by offset
}

type resState struct {
	load   float64
	leases []int32
}

type leaseState struct {
	l    Lease
	uses []fabric.Use
	rate float64
	seq  uint64 // insertion order: Predictions lists leases in this order
	live bool
}

type usage struct {
	leases    int
	bytes     int64
	slots     int64
	rate      int64 // nic: bytes/s held (an option's parts; quotas count bandwidth)
	bandwidth float64
}

type kindGroups struct {
	anchors []int32           // distinct anchors with devices of the kind, sorted
	devs    map[int32][]int32 // anchor -> devices sorted by ID
	maxFree map[int32]int64   // most free capacity of a usable, partitionable device
	empty   map[int32]int     // usable devices with no lease
}

type localKey struct {
	v    int32
	kind string
}

type orderKey struct {
	src  int32
	kind string
}

// NewIndex prepares s for placement. Leases' parts that name unknown devices
// are ignored; every other lease counts against capacity and bandwidth.
func NewIndex(s *Snapshot) *Index {
	x := &Index{
		now:       s.Now,
		profiles:  s.Profiles,
		quotas:    s.Quotas,
		defQuota:  s.DefaultQuota,
		nodes:     s.Nodes,
		nodeByID:  make(map[string]int, len(s.Nodes)),
		devByID:   make(map[string]int, len(s.Devices)),
		trees:     map[int32]*fabric.Tree{},
		groups:    map[string]*kindGroups{},
		local:     map[localKey][]int32{},
		orders:    map[orderKey][]int32{},
		leaseByID: make(map[string]int, len(s.Leases)),
		tenants:   map[string]*usage{},
		slotUnits: max(s.SlotUnits, 1),
	}
	for i, n := range s.Nodes {
		x.nodeByID[n.ID] = i
	}
	extra := make([]string, 0, len(s.Nodes)+len(s.Devices))
	for _, n := range s.Nodes {
		extra = append(extra, n.ID)
	}
	for _, d := range s.Devices {
		if d.Attach != "" {
			extra = append(extra, d.Attach)
		}
	}
	x.g = fabric.NewGraph(s.Links, extra...)
	x.links = x.g.Links()
	x.peel()

	x.devs = make([]devState, len(s.Devices))
	for i, d := range s.Devices {
		ds := &x.devs[i]
		ds.dev = d
		ds.free = d.Capacity
		ds.exclusive = d.Exclusive
		if d.Kind == KindNIC && d.Bandwidth <= 0 {
			ds.dev.Bandwidth = float64(d.Capacity) // a lent interface carries its rate
		}
		x.devByID[d.ID] = i
		ni, ok := x.nodeByID[d.Node]
		ds.node = -1
		if ok {
			ds.node = ni
		}
		at := d.Attach
		if at == "" {
			at = d.Node
		}
		v, _ := x.g.Vertex(at)
		ds.vertex = int32(v)
		ds.anchor = x.anchor[v]
		if p, ok := s.Profiles[d.Model]; ok && d.Model != "" {
			ds.prof, ds.hasProf = p, true
		}
		switch {
		case !ok:
			ds.usable = ConstraintNode
		case s.Nodes[ni].State != "" && s.Nodes[ni].State != NodeReady, s.Nodes[ni].Excluded != "":
			ds.usable = ConstraintNode
		case s.Nodes[ni].Cordoned:
			ds.usable = ConstraintCordon
		case d.State != "" && d.State != "healthy":
			ds.usable = ConstraintHealth
		}
	}
	order := make([]int32, len(x.devs))
	for i := range order {
		order[i] = int32(i)
	}
	sort.Slice(order, func(a, b int) bool { return x.devs[order[a]].dev.ID < x.devs[order[b]].dev.ID })
	x.devRank = make([]int32, len(x.devs))
	for r, i := range order {
		x.devRank[i] = int32(r)
	}
	x.res = make([]resState, len(x.devs)+len(x.links))
	x.resStamp = make([]uint32, len(x.res))
	x.resLocal = make([]int32, len(x.res))

	// Device spans: one backing array, each device's capacity its own
	// count (so a later insert reallocates instead of clobbering the next),
	// appended unsorted while building and sorted once.
	counts := make([]int32, len(x.devs))
	total := 0
	for _, l := range s.Leases {
		for _, p := range l.Parts {
			if di, ok := x.devByID[p.DeviceID]; ok {
				counts[di]++
				total++
			}
		}
	}
	spans := make([]span, total)
	off := 0
	for i := range x.devs {
		n := int(counts[i])
		x.devs[i].spans = spans[off : off : off+n]
		off += n
	}
	x.building = true
	for _, l := range s.Leases {
		x.insertLease(l)
	}
	x.building = false
	for i := range x.devs {
		if sp := x.devs[i].spans; len(sp) > 1 {
			slices.SortFunc(sp, cmpSpan)
		}
	}
	x.lsStamp = make([]uint32, len(x.leases))
	x.solveAll()

	for i := range x.devs {
		ds := &x.devs[i]
		kg := x.groups[ds.dev.Kind]
		if kg == nil {
			kg = &kindGroups{devs: map[int32][]int32{}, maxFree: map[int32]int64{}, empty: map[int32]int{}}
			x.groups[ds.dev.Kind] = kg
		}
		if _, ok := kg.devs[ds.anchor]; !ok {
			kg.anchors = append(kg.anchors, ds.anchor)
		}
		kg.devs[ds.anchor] = append(kg.devs[ds.anchor], int32(i))
		lk := localKey{ds.vertex, ds.dev.Kind}
		x.local[lk] = append(x.local[lk], int32(i))
	}
	for _, list := range x.local {
		sort.Slice(list, func(i, j int) bool { return x.devs[list[i]].dev.ID < x.devs[list[j]].dev.ID })
	}
	for _, kg := range x.groups {
		sort.Slice(kg.anchors, func(a, b int) bool { return kg.anchors[a] < kg.anchors[b] })
		for a, list := range kg.devs {
			sort.Slice(list, func(i, j int) bool { return x.devs[list[i]].dev.ID < x.devs[list[j]].dev.ID })
			x.refreshGroup(kg, a)
		}
	}
	return x
}

// peel splits the graph into a core and leaves (degree-1 vertices hanging
// off a core vertex, such as hosts under a top-of-rack switch) so that
// shortest paths run over the small core only.
func (x *Index) peel() {
	n := x.g.Len()
	x.anchor = make([]int32, n)
	x.leafLink = make([]int32, n)
	x.coreOf = make([]int32, n)
	for v := 0; v < n; v++ {
		x.anchor[v], x.leafLink[v] = int32(v), -1
		if x.g.Degree(v) == 1 {
			x.g.Neighbors(v, func(to, link int) {
				if x.g.Degree(to) >= 2 {
					x.anchor[v], x.leafLink[v] = int32(to), int32(link)
				}
			})
		}
	}
	var coreIDs []string
	for v := 0; v < n; v++ {
		if x.leafLink[v] < 0 {
			coreIDs = append(coreIDs, x.g.ID(v))
		}
	}
	var coreLinks []fabric.Link
	for i, l := range x.links {
		if l.Down || l.A == l.B {
			continue
		}
		a, _ := x.g.Vertex(l.A)
		b, _ := x.g.Vertex(l.B)
		if x.leafLink[a] < 0 && x.leafLink[b] < 0 {
			coreLinks = append(coreLinks, l)
			x.coreLink = append(x.coreLink, int32(i))
		}
	}
	x.core = fabric.NewGraph(coreLinks, coreIDs...)
	x.leafLat = make([]time.Duration, n)
	for v := 0; v < n; v++ {
		if li := x.leafLink[v]; li >= 0 {
			x.leafLat[v] = x.links[li].EffectiveLatency()
		}
	}
	x.linkRes = make([]float64, len(x.links))
	for i := range x.links {
		x.linkRes[i] = x.links[i].Residual()
	}
	for v := 0; v < n; v++ {
		x.coreOf[v] = -1
		if x.leafLink[v] < 0 {
			c, _ := x.core.Vertex(x.g.ID(v))
			x.coreOf[v] = int32(c)
		}
	}
}

func (x *Index) tree(coreSrc int32) *fabric.Tree {
	t, ok := x.trees[coreSrc]
	if !ok {
		t = x.core.ShortestPaths(int(coreSrc), fabric.ByHops)
		x.trees[coreSrc] = t
	}
	return t
}

func (x *Index) leafDist(v int32) fabric.Distance {
	if x.leafLink[v] >= 0 {
		return fabric.Distance{Hops: 1, Latency: x.leafLat[v]}
	}
	return fabric.Distance{}
}

// distFrom is the fewest-hops distance from vertex b to vertex a, given t,
// the shortest-path tree from b's anchor.
func (x *Index) distFrom(t *fabric.Tree, b, a int32) fabric.Distance {
	if a == b {
		return fabric.Distance{}
	}
	if x.anchor[a] == b {
		return x.leafDist(a)
	}
	if x.anchor[b] == a {
		return x.leafDist(b)
	}
	cd := t.Dist[x.coreOf[x.anchor[a]]]
	if cd == fabric.Unreachable {
		return fabric.Unreachable
	}
	lb, la := x.leafDist(b), x.leafDist(a)
	return fabric.Distance{Hops: cd.Hops + lb.Hops + la.Hops, Latency: cd.Latency + lb.Latency + la.Latency}
}

// route appends the link indices from b to a to dst.
func (x *Index) route(dst []int32, b, a int32) []int32 {
	if a == b {
		return dst
	}
	if x.anchor[a] == b {
		return append(dst, x.leafLink[a])
	}
	if x.anchor[b] == a {
		return append(dst, x.leafLink[b])
	}
	if li := x.leafLink[b]; li >= 0 {
		dst = append(dst, li)
	}
	t := x.tree(x.coreOf[x.anchor[b]])
	for _, cl := range t.PathTo(int(x.coreOf[x.anchor[a]])) {
		dst = append(dst, x.coreLink[cl])
	}
	if li := x.leafLink[a]; li >= 0 {
		dst = append(dst, li)
	}
	return dst
}

func (x *Index) borrowerVertex(id string) (int32, bool) {
	v, ok := x.g.Vertex(id)
	return int32(v), ok
}

// devCap is device i's delivered bandwidth with n concurrent leases.
func (x *Index) devCap(i, n int) float64 {
	ds := &x.devs[i]
	if ds.hasProf {
		return ds.prof.Capacity(n)
	}
	if ds.dev.Bandwidth > 0 {
		return ds.dev.Bandwidth
	}
	return math.Inf(1)
}

// resCap is resource r's capacity given n leases on it (n matters for
// devices only).
func (x *Index) resCap(r, n int) float64 {
	if r < len(x.devs) {
		return x.devCap(r, n)
	}
	return x.linkRes[r-len(x.devs)]
}

// leaseUses computes the resources a lease with these parts uses.
func (x *Index) leaseUses(borrower string, parts []Part, dst []fabric.Use) []fabric.Use {
	devs := x.devScratch[:0]
	for _, p := range parts {
		if di, ok := x.devByID[p.DeviceID]; ok {
			devs = append(devs, int32(di))
		}
	}
	x.devScratch = devs
	b, bok := x.borrowerVertex(borrower)
	if !bok {
		b = -1
	}
	return x.usesFor(b, devs, dst)
}

// usesFor computes the resources used by a lease of borrower vertex b
// (-1: unknown) striped evenly over devs.
func (x *Index) usesFor(b int32, devs []int32, dst []fabric.Use) []fabric.Use {
	dst = dst[:0]
	if len(devs) == 0 {
		return dst
	}
	coef := 1 / float64(len(devs))
	path := x.pathBuf[:0]
	for _, di := range devs {
		dst = addUse(dst, int(di), coef)
		if b < 0 {
			continue
		}
		path = x.route(path[:0], b, x.devs[di].vertex)
		for _, li := range path {
			dst = addUse(dst, len(x.devs)+int(li), coef)
		}
	}
	x.pathBuf = path
	return dst
}

func addUse(dst []fabric.Use, r int, coef float64) []fabric.Use {
	for i := range dst {
		if dst[i].Resource == r {
			dst[i].Coef += coef
			return dst
		}
	}
	return append(dst, fabric.Use{Resource: r, Coef: coef})
}

func demandOf(d float64) float64 {
	if d <= 0 {
		return math.Inf(1)
	}
	return d
}

// LeaseTenant returns the tenant of a lease in the index.
func (x *Index) LeaseTenant(id string) (string, bool) {
	li, ok := x.leaseByID[id]
	if !ok {
		return "", false
	}
	return x.leases[li].l.Tenant, true
}

// insertLease records a lease without solving rates, in a freed slot when
// there is one.
func (x *Index) insertLease(l Lease) int {
	var li int
	var uses []fabric.Use
	if n := len(x.freeSlots); n > 0 {
		li = int(x.freeSlots[n-1])
		x.freeSlots = x.freeSlots[:n-1]
		uses = x.leases[li].uses[:0]
		x.reused = true
	} else {
		li = len(x.leases)
		x.leases = append(x.leases, leaseState{})
	}
	x.nicDemand(&l)
	ls := leaseState{l: l, live: true, seq: x.leaseSeq}
	x.leaseSeq++
	ls.uses = x.leaseUses(l.Borrower, l.Parts, uses)
	x.leases[li] = ls
	x.leaseByID[l.ID] = li
	for _, p := range l.Parts {
		di, ok := x.devByID[p.DeviceID]
		if !ok {
			continue
		}
		ds := &x.devs[di]
		ds.free -= p.Length
		if l.Mode == ModeDedicated || ds.exclusive {
			ds.dedicated = true
		}
		sp := span{p.Offset, p.Offset + p.Length, l.Gateway}
		if x.building {
			ds.spans = append(ds.spans, sp)
		} else {
			i, _ := slices.BinarySearchFunc(ds.spans, sp, cmpSpan)
			ds.spans = slices.Insert(ds.spans, i, sp)
		}
	}
	for _, u := range ls.uses {
		x.res[u.Resource].leases = append(x.res[u.Resource].leases, int32(li))
		if u.Resource < len(x.devs) {
			x.devs[u.Resource].leases = append(x.devs[u.Resource].leases, int32(li))
		}
	}
	x.charge(l.Tenant, x.leaseCharge(l), 1)
	return li
}

// nicDemand sets a nic lease's Demand to the rate its parts hold when it
// has none or a higher one: its lenders cap it there.
func (x *Index) nicDemand(l *Lease) {
	if len(l.Parts) == 0 {
		return
	}
	if x.leaseKind(l) != KindNIC {
		return
	}
	var held int64
	for _, p := range l.Parts {
		held += p.Length
	}
	if held > 0 && (l.Demand <= 0 || l.Demand > float64(held)) {
		l.Demand = float64(held)
	}
}

// leaseKind is l's kind: its first part's device's, else Lease.Kind.
func (x *Index) leaseKind(l *Lease) string {
	if len(l.Parts) > 0 {
		if di, ok := x.devByID[l.Parts[0].DeviceID]; ok {
			return x.devs[di].dev.Kind
		}
	}
	return l.Kind
}

func cmpSpan(a, b span) int {
	if c := cmp.Compare(a.off, b.off); c != 0 {
		return c
	}
	return cmp.Compare(a.end, b.end)
}

// dropSpan removes one part's span from device di.
func (x *Index) dropSpan(di int, p Part) {
	ds := &x.devs[di]
	sp := span{off: p.Offset, end: p.Offset + p.Length}
	if i, ok := slices.BinarySearchFunc(ds.spans, sp, cmpSpan); ok {
		ds.spans = slices.Delete(ds.spans, i, i+1)
	}
}

func (x *Index) leaseCharge(l Lease) usage {
	u := usage{bandwidth: l.Demand}
	for _, p := range l.Parts {
		n := p.Length
		di, ok := x.devByID[p.DeviceID]
		if ok && l.Mode == ModeDedicated {
			n = x.devs[di].dev.Capacity
		}
		kind := l.Kind
		if ok {
			kind = x.devs[di].dev.Kind
		}
		switch kind {
		case KindAccel:
			u.slots += n
		case KindNIC: // a rate: counted as bandwidth (Demand)
		default:
			u.bytes += n
		}
	}
	return u
}

// quota returns the quota that bounds tenant: its own, else the default;
// ok is false when nothing bounds it.
func (x *Index) quota(tenant string) (q Quota, ok bool) {
	if q, ok := x.quotas[tenant]; ok {
		return q, true
	}
	return x.defQuota, x.defQuota != Quota{}
}

func (x *Index) charge(tenant string, u usage, sign int) {
	t := x.tenants[tenant]
	if t == nil {
		t = &usage{}
		x.tenants[tenant] = t
	}
	s := int64(sign)
	t.leases += sign
	t.bytes += s * u.bytes
	t.slots += s * u.slots
	t.bandwidth += float64(sign) * u.bandwidth
}

// solveAll computes every live lease's rate by max-min sharing over all
// devices and links, and the resulting loads.
func (x *Index) solveAll() {
	capacity := make([]float64, len(x.res))
	for r := range x.res {
		capacity[r] = x.resCap(r, len(x.res[r].leases))
	}
	flows := make([]fabric.Flow, 0, len(x.leases))
	idx := make([]int, 0, len(x.leases))
	for i := range x.leases {
		ls := &x.leases[i]
		if !ls.live {
			continue
		}
		flows = append(flows, fabric.Flow{Demand: demandOf(ls.l.Demand), Uses: ls.uses})
		idx = append(idx, i)
	}
	rates := x.solver.Solve(capacity, flows, nil)
	for r := range x.res {
		x.res[r].load = 0
	}
	for k, i := range idx {
		x.leases[i].rate = rates[k]
		x.addLoad(i, rates[k], 1)
	}
}

func (x *Index) addLoad(li int, rate float64, sign float64) {
	if math.IsInf(rate, 0) {
		return
	}
	for _, u := range x.leases[li].uses {
		x.res[u.Resource].load += sign * u.Coef * rate
	}
}

// refreshGroup recomputes a group's free-capacity summary.
func (x *Index) refreshGroup(kg *kindGroups, a int32) {
	var mf int64 = -1
	empty := 0
	for _, di := range kg.devs[a] {
		ds := &x.devs[di]
		if ds.usable != "" || ds.dedicated {
			continue
		}
		if ds.free > mf && !ds.exclusive {
			mf = ds.free
		}
		if len(ds.leases) == 0 {
			empty++
		}
	}
	kg.maxFree[a] = mf
	kg.empty[a] = empty
}

// groupOrder is the kind's anchors ordered by distance from core vertex src.
func (x *Index) groupOrder(src int32, kind string) []int32 {
	k := orderKey{src, kind}
	if o, ok := x.orders[k]; ok {
		return o
	}
	kg := x.groups[kind]
	if kg == nil {
		return nil
	}
	t := x.tree(x.coreOf[src])
	o := make([]int32, 0, len(kg.anchors))
	for _, a := range kg.anchors {
		if t.Dist[x.coreOf[a]] != fabric.Unreachable {
			o = append(o, a)
		}
	}
	sort.SliceStable(o, func(i, j int) bool {
		di, dj := t.Dist[x.coreOf[o[i]]], t.Dist[x.coreOf[o[j]]]
		if di != dj {
			return di.Less(dj, fabric.ByHops)
		}
		return o[i] < o[j]
	})
	x.orders[k] = o
	return o
}

// Prediction is a lease's predicted rate and completion.
type Prediction struct {
	LeaseID    string
	Bandwidth  float64       // bytes/s; +Inf when nothing bounds it
	Completion time.Duration // from Now; 0 when open-ended
	Late       bool          // completes after its deadline
}

// Predict returns every lease's predicted rate and completion under
// max-min sharing of device and link bandwidth, in Snapshot.Leases order.
func Predict(s *Snapshot) []Prediction {
	return NewIndex(s).Predictions()
}

// Predictions returns the index's current predictions in lease order
// (leases removed with Remove are skipped).
func (x *Index) Predictions() []Prediction {
	order := make([]int32, 0, len(x.leaseByID))
	for i := range x.leases {
		if x.leases[i].live {
			order = append(order, int32(i))
		}
	}
	if x.reused {
		slices.SortFunc(order, func(a, b int32) int { return cmp.Compare(x.leases[a].seq, x.leases[b].seq) })
	}
	out := make([]Prediction, 0, len(order))
	for _, i := range order {
		ls := &x.leases[i]
		c := completion(ls.l.Remaining, ls.rate)
		out = append(out, Prediction{LeaseID: ls.l.ID, Bandwidth: ls.rate, Completion: c,
			Late: ls.l.Deadline > 0 && ls.l.Remaining > 0 && x.now+c > ls.l.Deadline})
	}
	return out
}

func completion(work int64, rate float64) time.Duration {
	if work <= 0 {
		return 0
	}
	if rate <= 0 {
		return time.Duration(math.MaxInt64)
	}
	if math.IsInf(rate, 1) {
		return 0
	}
	sec := float64(work) / rate
	if sec > float64(math.MaxInt64)/1e9 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(sec * 1e9)
}
