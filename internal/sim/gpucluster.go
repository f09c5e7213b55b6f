package sim

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
	"github.com/rialto-project/rialto/internal/placement"
)

// GPU policies compared on the openb trace.
const (
	// PolicyWholeDevice is what Nomad, Slurm GRES or the Kubernetes device
	// plugin do: a pod gets whole GPUs of the node that runs it (a pod asking
	// for 0.2 GPU holds a whole one), best-fit over nodes.
	PolicyWholeDevice = "whole-device"
	// PolicyRialto runs the pod's CPU and memory on one node and leases its
	// GPUs through placement: a share of a GPU (shared), whole GPUs
	// (dedicated), or GPUs from several lenders of the rack (composed),
	// reached by device lending over the rack's PCIe NTB fabric.
	PolicyRialto = "rialto"
)

// GPUReplay parameterises a replay of an openb pod list on an openb cluster.
type GPUReplay struct {
	Policy string
	// Window is the arrival window in seconds: the trace's arrivals, in
	// order, are compressed into it. With durations of at least MinDuration
	// and a window no longer than that, every pod of the trace wants to run
	// at once — openb's pods ask for 98% of the cluster's GPUs (120% when
	// rounded up to whole GPUs), the saturation the trace was built for.
	Window float64
	// MaxDuration caps pod durations (seconds; the trace's running pods last
	// until the trace ends). 0: no cap.
	MaxDuration float64
	// MinDuration floors them. 0: no floor.
	MinDuration float64
	// DeadlineFactor: a pod's deadline is its arrival plus this many times
	// its duration plus DeadlineSlack seconds.
	DeadlineFactor float64
	DeadlineSlack  float64
	// RackSize groups nodes (in trace order) into racks sharing a PCIe NTB
	// switch; GPUs are lent within a rack.
	RackSize int
	// RemoteSlowdown stretches a pod whose GPUs are not all local (the
	// Device Lending paper: direct peer-to-peer paths run as fast as local,
	// so close to 1).
	RemoteSlowdown float64
	// Backfill is how many queued pods behind the head a departure may start.
	Backfill int
	Seed     uint64
}

// DefaultGPUReplay is the replay of the policy comparison.
var DefaultGPUReplay = GPUReplay{Window: 3600, MaxDuration: 24 * 3600, MinDuration: 3600, DeadlineFactor: 1.25, DeadlineSlack: 300, RackSize: 16, RemoteSlowdown: 1.02, Backfill: 8}

// GPUReplayResult summarises a replay.
type GPUReplayResult struct {
	Policy   string
	Pods     int
	Placed   int // started before the end
	Never    int // could never start (too big for any node or the policy)
	Missed   int // finished after the deadline, or never started
	Remote   int // pods that ran on at least one borrowed GPU
	Shared   int // GPU parts that share a device with another pod
	Window   Time
	Makespan Time
	// Time-averaged over the window plus MinDuration (while the cluster is
	// full), as fractions of all GPU capacity.
	Utilisation               float64 // GPU share requested by running pods
	Allocated                 float64 // GPU capacity held by running pods
	Stranded                  float64 // free GPU capacity no pod can use (its node, or for Rialto its rack, has no CPU or memory left)
	MeanSlowdown, P95Slowdown float64 // (finish − arrival) / duration
	Events                    uint64
	PlaceCalls                int
	// Demand is the GPU capacity the pods ask for together, WholeDemand the
	// same with every GPU request rounded up to whole GPUs, as fractions of
	// the cluster's GPUs.
	Demand, WholeDemand float64
}

type gpuPod struct {
	TracePod
	id       int
	arrive   Time
	dur      Time
	deadline Time
	need     int64 // requested GPU milli in total
	node     int
	parts    []gpuPart
	started  bool
	done     bool
	finish   Time
}

type gpuPart struct {
	node, gpu int
	milli     int64
}

type gpuState struct {
	cfg      GPUReplay
	nodes    []TraceNode
	freeCPU  []int64
	freeMem  []int64
	freeGPU  [][]int64 // per node, per GPU: free milli
	rack     []int
	minCPU   int64
	minMem   int64
	capable  []bool
	rackCap  []int   // capable nodes per rack
	rackFree []int64 // free GPU milli per rack
	nodeFree []int64 // free GPU milli per node
	totalGPU float64

	used, alloc, stranded float64 // current values (milli)
	iUsed, iAlloc, iStr   float64 // integrals over the window
	last                  Time
	window                Time

	idx   []*placement.Index // per rack: GPUs are lent within a rack's NTB domain
	devID [][]string
	devAt map[string][2]int
	calls int
}

func (s *gpuState) strandedNow() float64 {
	st := 0.0
	if s.cfg.Policy == PolicyRialto {
		for r, n := range s.rackCap {
			if n == 0 {
				st += float64(s.rackFree[r])
			}
		}
		return st
	}
	for n, ok := range s.capable {
		if !ok {
			st += float64(s.nodeFree[n])
		}
	}
	return st
}

func (s *gpuState) account(now Time) {
	if s.last < s.window {
		end := math.Min(now, s.window)
		dt := end - s.last
		s.iUsed += s.used * dt
		s.iAlloc += s.alloc * dt
		s.iStr += s.stranded * dt
	}
	s.last = now
}

func (s *gpuState) setCapable(n int) {
	ok := s.freeCPU[n] >= s.minCPU && s.freeMem[n] >= s.minMem
	if ok != s.capable[n] {
		s.capable[n] = ok
		if ok {
			s.rackCap[s.rack[n]]++
		} else {
			s.rackCap[s.rack[n]]--
		}
	}
}

// gpuSnapshot is the openb cluster as a placement snapshot: every GPU an
// accel device of 1000 slots (milli-GPUs), nodes joined to their rack's
// PCIe switch by NTB links and racks to a spine by Ethernet.
func gpuSnapshot(nodes []TraceNode, rackSize int) (*placement.Snapshot, [][]string) {
	s := &placement.Snapshot{}
	ids := make([][]string, len(nodes))
	racks := (len(nodes) + rackSize - 1) / rackSize
	for r := 0; r < racks; r++ {
		s.Links = append(s.Links, fabric.Link{ID: fmt.Sprintf("rack%d-spine", r), A: fmt.Sprintf("rack%d", r), B: "spine", Kind: fabric.Ethernet, Bandwidth: 12.5e9, Latency: 5 * time.Microsecond})
	}
	for i, n := range nodes {
		s.Nodes = append(s.Nodes, placement.Node{ID: n.Name, Labels: map[string]string{"gpu": n.Model}})
		s.Links = append(s.Links, fabric.Link{ID: n.Name + "-ntb", A: n.Name, B: fmt.Sprintf("rack%d", i/rackSize), Kind: fabric.PCIeNTB, Bandwidth: 16e9})
		for g := 0; g < n.GPUs; g++ {
			id := fmt.Sprintf("%s/gpu%d", n.Name, g)
			ids[i] = append(ids[i], id)
			s.Devices = append(s.Devices, placement.Device{ID: id, Node: n.Name, Kind: placement.KindAccel, Model: n.Model, Capacity: 1000})
		}
	}
	return s, ids
}

// ReplayGPU replays pods on nodes under cfg. It is deterministic; it stops
// with ctx's error when ctx is done (a large trace replays for minutes).
func ReplayGPU(ctx context.Context, nodes []TraceNode, pods []TracePod, cfg GPUReplay) (GPUReplayResult, error) {
	if cfg.RackSize <= 0 {
		cfg.RackSize = 16
	}
	if cfg.RemoteSlowdown <= 0 {
		cfg.RemoteSlowdown = 1
	}
	s := &gpuState{cfg: cfg, nodes: nodes, minCPU: math.MaxInt64, minMem: math.MaxInt64}
	n := len(nodes)
	s.freeCPU, s.freeMem, s.nodeFree = make([]int64, n), make([]int64, n), make([]int64, n)
	s.freeGPU, s.rack, s.capable = make([][]int64, n), make([]int, n), make([]bool, n)
	racks := (n + cfg.RackSize - 1) / cfg.RackSize
	s.rackCap, s.rackFree = make([]int, racks), make([]int64, racks)
	for i, nd := range nodes {
		s.freeCPU[i], s.freeMem[i] = nd.CPUMilli, nd.MemoryMiB
		s.rack[i] = i / cfg.RackSize
		s.freeGPU[i] = make([]int64, nd.GPUs)
		for g := range s.freeGPU[i] {
			s.freeGPU[i][g] = 1000
		}
		s.nodeFree[i] = int64(nd.GPUs) * 1000
		s.rackFree[s.rack[i]] += s.nodeFree[i]
		s.totalGPU += float64(nd.GPUs) * 1000
	}
	// Pods: durations, demand, arrivals compressed to the offered load.
	ps := make([]*gpuPod, 0, len(pods))
	offered, demand, whole := 0.0, 0.0, 0.0
	for i, p := range pods {
		d := p.Duration()
		if cfg.MaxDuration > 0 && d > cfg.MaxDuration {
			d = cfg.MaxDuration
		}
		if d < cfg.MinDuration {
			d = cfg.MinDuration
		}
		gp := &gpuPod{TracePod: p, id: i, dur: d, node: -1}
		if p.NumGPU > 0 {
			milli := p.GPUMilli
			if milli <= 0 {
				milli = 1000
			}
			gp.need = int64(p.NumGPU) * milli
			if p.CPUMilli < s.minCPU {
				s.minCPU = p.CPUMilli
			}
			if p.MemoryMiB < s.minMem {
				s.minMem = p.MemoryMiB
			}
		}
		offered += float64(gp.need) * d
		if p.NumGPU > 0 {
			demand += float64(gp.need)
			whole += float64(p.NumGPU) * 1000
		}
		ps = append(ps, gp)
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Created < ps[j].Created })
	if len(ps) == 0 {
		return GPUReplayResult{}, fmt.Errorf("%w: no pods", ErrTrace)
	}
	span := ps[len(ps)-1].Created - ps[0].Created
	_ = offered
	window := cfg.Window
	if window <= 0 {
		window = 3600
	}
	// Compress the trace's gaps so arrivals span the window; half of the
	// window follows the trace's timing, half is spread evenly so bursts of
	// simultaneous creations do not all land at one instant.
	for i, p := range ps {
		frac := float64(i) / float64(len(ps))
		if span > 0 {
			frac = 0.5*frac + 0.5*(p.Created-ps[0].Created)/span
		}
		p.arrive = frac * window
		p.deadline = p.arrive + cfg.DeadlineFactor*p.dur + cfg.DeadlineSlack
	}
	s.window = window + cfg.MinDuration
	for i := range nodes {
		s.setCapable(i)
	}
	if cfg.Policy == PolicyRialto {
		// One placement index per rack: a rack is one PCIe NTB domain and
		// MaxLatency keeps leases inside it, so each index sees exactly the
		// candidates a cluster-wide one would accept, at a fraction of the cost.
		s.devID = make([][]string, len(nodes))
		for r := 0; r < racks; r++ {
			lo, hi := r*cfg.RackSize, min((r+1)*cfg.RackSize, len(nodes))
			snap, ids := gpuSnapshot(nodes[lo:hi], cfg.RackSize)
			copy(s.devID[lo:hi], ids)
			s.idx = append(s.idx, placement.NewIndex(snap))
		}
		ids := s.devID
		s.devAt = map[string][2]int{}
		for ni, l := range ids {
			for g, id := range l {
				s.devAt[id] = [2]int{ni, g}
			}
		}
	} else if cfg.Policy != PolicyWholeDevice {
		return GPUReplayResult{}, fmt.Errorf("sim: unknown GPU policy %q", cfg.Policy)
	}
	s.stranded = s.strandedNow()

	var e Engine
	var queue []*gpuPod
	res := GPUReplayResult{Policy: cfg.Policy, Pods: len(ps), Window: window}
	if s.totalGPU > 0 {
		res.Demand, res.WholeDemand = demand/s.totalGPU, whole/s.totalGPU
	}
	var slow []float64
	var tryQueue func()
	start := func(p *gpuPod) {
		p.started = true
		res.Placed++
		d := p.dur
		remote := false
		for _, pt := range p.parts {
			if pt.node != p.node {
				remote = true
			}
		}
		if remote {
			res.Remote++
			d *= cfg.RemoteSlowdown
		}
		s.account(e.Now())
		s.used += float64(p.need)
		s.alloc += float64(s.held(p))
		s.stranded = s.strandedNow()
		e.After(d, func() {
			p.done = true
			p.finish = e.Now()
			s.account(e.Now())
			s.used -= float64(p.need)
			s.alloc -= float64(s.held(p))
			s.release(p)
			s.stranded = s.strandedNow()
			if p.finish > p.deadline {
				res.Missed++
			}
			slow = append(slow, (p.finish-p.arrive)/p.dur)
			tryQueue()
		})
	}
	tryQueue = func() {
		tries := 0
		for i := 0; i < len(queue) && tries <= cfg.Backfill; {
			p := queue[i]
			if s.place(p) {
				start(p)
				queue = append(queue[:i], queue[i+1:]...)
				continue
			}
			tries++
			i++
		}
	}
	for _, p := range ps {
		p := p
		e.At(p.arrive, func() {
			if !s.fits(p) {
				res.Never++
				return
			}
			if len(queue) == 0 && s.place(p) {
				start(p)
				return
			}
			queue = append(queue, p)
		})
	}
	for e.Step() {
		if e.Events()%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return GPUReplayResult{}, err
			}
		}
	}
	s.account(e.Now())
	res.Makespan = e.Now()
	for _, p := range ps {
		if !p.started {
			res.Missed++
		}
		if p.started && len(p.parts) > 0 {
			for _, pt := range p.parts {
				if pt.milli < 1000 {
					res.Shared++
				}
			}
		}
	}
	res.Missed += 0
	if w := math.Min(s.window, res.Makespan); w > 0 && s.totalGPU > 0 {
		res.Utilisation = s.iUsed / (w * s.totalGPU)
		res.Allocated = s.iAlloc / (w * s.totalGPU)
		res.Stranded = s.iStr / (w * s.totalGPU)
	}
	sort.Float64s(slow)
	res.MeanSlowdown = mean(slow)
	if len(slow) > 0 {
		res.P95Slowdown = slow[int(0.95*float64(len(slow)-1))]
	}
	res.Events = e.Events()
	res.PlaceCalls = s.calls
	return res, nil
}

// rackFits reports whether rack r has k GPUs with milli free each.
func (s *gpuState) rackFits(r int, milli int64, k int) bool {
	lo, hi := r*s.cfg.RackSize, min((r+1)*s.cfg.RackSize, len(s.nodes))
	c := 0
	for n := lo; n < hi; n++ {
		for _, f := range s.freeGPU[n] {
			if f >= milli {
				if c++; c >= k {
					return true
				}
			}
		}
	}
	return false
}

// held is the GPU capacity a running pod holds.
func (s *gpuState) held(p *gpuPod) int64 {
	h := int64(0)
	for _, pt := range p.parts {
		h += pt.milli
	}
	return h
}

// fits reports whether the pod could ever run on an empty cluster.
func (s *gpuState) fits(p *gpuPod) bool {
	for _, nd := range s.nodes {
		if nd.CPUMilli >= p.CPUMilli && nd.MemoryMiB >= p.MemoryMiB && (nd.GPUs >= p.NumGPU || s.cfg.Policy == PolicyRialto) {
			return true
		}
	}
	return false
}

func (s *gpuState) take(p *gpuPod, node int) {
	s.freeCPU[node] -= p.CPUMilli
	s.freeMem[node] -= p.MemoryMiB
	p.node = node
	for _, pt := range p.parts {
		s.freeGPU[pt.node][pt.gpu] -= pt.milli
		s.nodeFree[pt.node] -= pt.milli
		s.rackFree[s.rack[pt.node]] -= pt.milli
	}
	s.setCapable(node)
}

func (s *gpuState) release(p *gpuPod) {
	s.freeCPU[p.node] += p.CPUMilli
	s.freeMem[p.node] += p.MemoryMiB
	for _, pt := range p.parts {
		s.freeGPU[pt.node][pt.gpu] += pt.milli
		s.nodeFree[pt.node] += pt.milli
		s.rackFree[s.rack[pt.node]] += pt.milli
	}
	s.setCapable(p.node)
	if s.idx != nil && len(p.parts) > 0 {
		_ = s.idx[s.rack[p.node]].Remove(fmt.Sprintf("pod%d", p.id))
	}
}

func (s *gpuState) place(p *gpuPod) bool {
	if s.cfg.Policy == PolicyRialto {
		return s.placeRialto(p)
	}
	return s.placeWhole(p)
}

func (s *gpuState) wholeFree(n int) int {
	c := 0
	for _, f := range s.freeGPU[n] {
		if f == 1000 {
			c++
		}
	}
	return c
}

// placeWhole is best-fit: the node with the fewest whole free GPUs left
// after the pod, then the least free CPU.
func (s *gpuState) placeWhole(p *gpuPod) bool {
	best, bestLeft, bestCPU := -1, math.MaxInt, int64(math.MaxInt64)
	for n := range s.nodes {
		if s.freeCPU[n] < p.CPUMilli || s.freeMem[n] < p.MemoryMiB {
			continue
		}
		left := 0
		if p.NumGPU > 0 {
			w := s.wholeFree(n)
			if w < p.NumGPU {
				continue
			}
			left = w - p.NumGPU
		} else {
			left = len(s.freeGPU[n]) // CPU-only pods prefer nodes without GPUs
			if s.wholeFree(n) == 0 {
				left = 0
			}
		}
		if left < bestLeft || (left == bestLeft && s.freeCPU[n] < bestCPU) {
			best, bestLeft, bestCPU = n, left, s.freeCPU[n]
		}
	}
	if best < 0 {
		return false
	}
	p.parts = p.parts[:0]
	for g, f := range s.freeGPU[best] {
		if len(p.parts) == p.NumGPU {
			break
		}
		if f == 1000 {
			p.parts = append(p.parts, gpuPart{node: best, gpu: g, milli: 1000})
		}
	}
	s.take(p, best)
	return true
}

// placeRialto picks the node for the pod's CPU and memory (best-fit, nodes
// whose own GPUs can serve the pod first, then nodes in the racks with the
// most free GPU capacity) and asks placement for the GPUs.
func (s *gpuState) placeRialto(p *gpuPod) bool {
	if p.NumGPU == 0 {
		return s.placeWhole(p)
	}
	milli := p.need / int64(p.NumGPU)
	localOK := func(n int) bool {
		c := 0
		for _, f := range s.freeGPU[n] {
			if f >= milli {
				c++
			}
		}
		return c >= p.NumGPU
	}
	type cand struct {
		n     int
		local bool
		score int64
	}
	better := func(a, b cand) bool {
		if a.local != b.local {
			return a.local
		}
		if a.score != b.score {
			return a.score < b.score
		}
		return a.n < b.n
	}
	// The three best borrowers: nodes whose own GPUs can serve the pod
	// (fewest free GPU first: best fit), then nodes in the racks with the
	// most free GPU capacity.
	var top [3]cand
	nt := 0
	rackOK := make([]int8, len(s.rackFree)) // 0 unknown, 1 fits, -1 does not
	fitsRack := func(r int) bool {
		if rackOK[r] == 0 {
			rackOK[r] = -1
			if s.rackFree[r] >= p.need && s.rackFits(r, milli, p.NumGPU) {
				rackOK[r] = 1
			}
		}
		return rackOK[r] == 1
	}
	for n := range s.nodes {
		if s.freeCPU[n] < p.CPUMilli || s.freeMem[n] < p.MemoryMiB {
			continue
		}
		var c cand
		if localOK(n) {
			c = cand{n, true, s.nodeFree[n]}
		} else if fitsRack(s.rack[n]) {
			c = cand{n, false, -s.rackFree[s.rack[n]]}
		} else {
			continue
		}
		i := nt
		if nt < len(top) {
			nt++
		} else if !better(c, top[nt-1]) {
			continue
		} else {
			i = nt - 1
		}
		for i > 0 && better(c, top[i-1]) {
			top[i] = top[i-1]
			i--
		}
		top[i] = c
	}
	cands := top[:nt]
	req := placement.Request{Kind: placement.KindAccel, Size: p.need, MaxLatency: 2 * time.Microsecond, Tenant: p.QoS}
	switch {
	case p.NumGPU > 1:
		req.Mode, req.Width = placement.ModeComposed, p.NumGPU
	case milli < 1000:
		req.Mode = placement.ModeShared
	default:
		req.AllowShare = true // a whole GPU: dedicated, or all 1000 slots of one
	}
	if len(p.GPUSpec) > 0 {
		for _, m := range p.GPUSpec {
			req.Affinity = append(req.Affinity, "gpu="+m)
		}
	}
	for _, c := range cands {
		req.Borrower = s.nodes[c.n].Name
		s.calls++
		x := s.idx[s.rack[c.n]]
		plan, err := x.Place(req)
		if err != nil {
			continue
		}
		if err := x.Add(plan.Lease(fmt.Sprintf("pod%d", p.id), req, 0)); err != nil {
			continue
		}
		p.parts = p.parts[:0]
		for _, pt := range plan.Parts {
			at := s.devAt[pt.DeviceID]
			m := pt.Length
			if plan.Mode == placement.ModeDedicated {
				m = 1000
			}
			p.parts = append(p.parts, gpuPart{node: at[0], gpu: at[1], milli: m})
		}
		s.take(p, c.n)
		return true
	}
	return false
}
