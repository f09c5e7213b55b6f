package placement

import (
	"fmt"
	"math/rand"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

// largeSnapshot is a 10,000-node cluster: 250 racks of 40 nodes under 4
// spine switches, 10 devices per node (6 block, 3 memory, 1 accel) = 100,000
// devices, and `leases` running leases placed by the policy itself.
func largeSnapshot(tb testing.TB, racks, perRack, leases int) (*Snapshot, *Index) {
	s := &Snapshot{Profiles: map[string]Profile{SMUFINModel: SMUFINProfile()}, Quotas: map[string]Quota{}}
	for r := 0; r < racks; r++ {
		tor := fmt.Sprintf("tor%03d", r)
		for sp := 0; sp < 4; sp++ {
			s.Links = append(s.Links, fabric.Link{ID: fmt.Sprintf("%s-sp%d", tor, sp), A: tor, B: fmt.Sprintf("spine%d", sp),
				Kind: fabric.Ethernet, Bandwidth: 50e9, Latency: 2 * time.Microsecond})
		}
		for n := 0; n < perRack; n++ {
			id := fmt.Sprintf("n%03d-%02d", r, n)
			st := ""
			if (r*perRack+n)%97 == 0 {
				st = NodeDown
			}
			s.Nodes = append(s.Nodes, Node{ID: id, State: st, Labels: map[string]string{"rack": tor}})
			s.Links = append(s.Links, fabric.Link{ID: id, A: id, B: tor, Kind: fabric.Ethernet, Bandwidth: 12.5e9, Latency: time.Microsecond})
			for d := 0; d < 10; d++ {
				dev := Device{ID: fmt.Sprintf("%s-d%d", id, d), Node: id}
				switch {
				case d < 6:
					dev.Kind, dev.Model, dev.Capacity = KindBlock, SMUFINModel, 4<<40
				case d < 9:
					dev.Kind, dev.Capacity, dev.Bandwidth = KindMemory, 256<<30, 20e9
				default:
					dev.Kind, dev.Capacity, dev.Bandwidth = KindAccel, 8, 10e9
				}
				s.Devices = append(s.Devices, dev)
			}
		}
	}
	// Running leases: borrowers anywhere, parts on devices in the borrower's
	// rack (shared, some composed over two nodes), as a binpacking policy
	// would leave them.
	rng := rand.New(rand.NewSource(1))
	next := map[int]int64{}
	for i := 0; i < leases; i++ {
		b := rng.Intn(len(s.Nodes))
		rack := b / perRack
		l := Lease{ID: fmt.Sprintf("L%06d", i), Borrower: s.Nodes[b].ID, Mode: ModeShared, Tenant: fmt.Sprintf("t%d", rng.Intn(50))}
		width := 1
		if rng.Intn(4) == 0 {
			width, l.Mode = 2, ModeComposed
		}
		kind := rng.Intn(10)
		for w := 0; w < width; w++ {
			n := rack*perRack + rng.Intn(perRack)
			var d int
			var size int64
			switch {
			case kind < 6:
				d, size = rng.Intn(6), 100<<30
				l.Kind, l.Demand, l.Remaining = KindBlock, SMUFINWriterDemand, SMUFINWriterWork
			case kind < 9:
				d, size = 6+rng.Intn(3), 8<<30
				l.Kind, l.Demand = KindMemory, 1e9
			default:
				d, size = 9, 1
				l.Kind, l.Demand = KindAccel, 100e6
			}
			di := n*10 + d
			off := next[di]
			if off+size > s.Devices[di].Capacity {
				continue
			}
			next[di] = off + size
			l.Parts = append(l.Parts, Part{NodeID: s.Devices[di].Node, DeviceID: s.Devices[di].ID, Offset: off, Length: size})
		}
		if len(l.Parts) == 0 {
			continue
		}
		s.Leases = append(s.Leases, l)
	}
	return s, NewIndex(s)
}

func benchRequest(rng *rand.Rand, s *Snapshot) Request {
	r := Request{Borrower: s.Nodes[rng.Intn(len(s.Nodes))].ID, AllowShare: true, AllowCompose: rng.Intn(2) == 0,
		Tenant: fmt.Sprintf("t%d", rng.Intn(50))}
	if r.Borrower[len(r.Borrower)-1] == '0' && rng.Intn(2) == 0 {
		r.Strategy = Spread
	}
	switch k := rng.Intn(10); {
	case k < 6:
		r.Kind, r.Size, r.Bandwidth, r.Work = KindBlock, 200<<30, SMUFINWriterDemand, SMUFINWriterWork
		if k == 0 {
			r.Deadline = 330 * time.Second
		} else if k < 3 {
			r.Deadline = 20 * time.Minute
		}
	case k < 9:
		r.Kind, r.Size, r.Bandwidth = KindMemory, 16<<30, 1e9
	default:
		r.Kind, r.Size, r.Bandwidth = KindAccel, 1, 100e6
	}
	return r
}

var (
	benchSeq int
	benchX   *Index
)
var benchS *Snapshot

func benchIndex(b *testing.B) (*Snapshot, *Index) {
	if benchX == nil {
		benchS, benchX = largeSnapshot(b, 250, 40, 30000)
	}
	return benchS, benchX
}

// BenchmarkPlace10k: decisions per second against a prepared index of the
// 10,000-node, 100,000-device snapshot with 30,000 running leases.
func BenchmarkPlace10k(b *testing.B) {
	s, x := benchIndex(b)
	rng := rand.New(rand.NewSource(2))
	reqs := make([]Request, 4096)
	for i := range reqs {
		reqs[i] = benchRequest(rng, s)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	fails := 0
	for i := 0; i < b.N; i++ {
		if _, err := x.Place(reqs[i%len(reqs)]); err != nil {
			fails++
		}
	}
	reportRates(b, cpu0)
	b.ReportMetric(float64(fails)/float64(b.N), "infeasible/op")
}

// BenchmarkPlaceSelectors10k: BenchmarkPlace10k's requests turned into
// the kinds the control plane used to place itself: a quarter whole
// devices, a quarter selecting the borrower's rack by label, a quarter
// selecting another rack by label, a quarter pinned to two devices.
func BenchmarkPlaceSelectors10k(b *testing.B) {
	s, x := benchIndex(b)
	rng := rand.New(rand.NewSource(4))
	reqs := make([]Request, 4096)
	for i := range reqs {
		r := benchRequest(rng, s)
		switch i % 4 {
		case 0:
			r.Whole, r.Size, r.AllowShare, r.AllowCompose, r.Deadline = true, 0, false, false, 0
		case 1:
			r.Labels = map[string]string{"rack": "tor" + r.Borrower[1:4]}
		case 2:
			r.Labels = map[string]string{"rack": fmt.Sprintf("tor%03d", rng.Intn(250))}
		case 3:
			for k := 0; k < 2; k++ {
				d := s.Devices[rng.Intn(len(s.Devices))]
				for d.Kind != r.Kind {
					d = s.Devices[rng.Intn(len(s.Devices))]
				}
				r.Devices = append(r.Devices, d.ID)
			}
		}
		reqs[i] = r
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	fails := 0
	for i := 0; i < b.N; i++ {
		if _, err := x.Place(reqs[i%len(reqs)]); err != nil {
			fails++
		}
	}
	reportRates(b, cpu0)
	b.ReportMetric(float64(fails)/float64(b.N), "infeasible/op")
}

// BenchmarkNewIndex10k: preparing the index (what Place does per call).
func BenchmarkNewIndex10k(b *testing.B) {
	s, _ := benchIndex(b)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		NewIndex(s)
	}
	b.StopTimer()
	b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
}

// BenchmarkPlaceAdd10k: decide, record the lease, and release an older one
// (steady churn), as the simulator does. It mutates the shared index, so it
// runs last.
func BenchmarkPlaceAdd10k(b *testing.B) {
	s, x := benchIndex(b)
	rng := rand.New(rand.NewSource(3))
	live := make([]string, 0, len(x.leaseByID))
	for id := range x.leaseByID {
		live = append(live, id)
	}
	sort.Strings(live)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		r := benchRequest(rng, s)
		p, err := x.Place(r)
		if err == nil {
			benchSeq++
			id := fmt.Sprintf("B%07d", benchSeq)
			if err := x.Add(p.Lease(id, r, 0)); err != nil {
				b.Fatal(err)
			}
			live = append(live, id)
		}
		if len(live) > 30000 {
			k := rng.Intn(len(live))
			if err := x.Remove(live[k]); err != nil {
				b.Fatal(err)
			}
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
		}
	}
	reportRates(b, cpu0)
}

// cpuTime is the process's user+system CPU time. On a shared machine the
// wall-clock rate depends on the neighbours; decisions per CPU-second does
// not (it includes the garbage collector's work on other threads).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportRates(b *testing.B, cpu0 time.Duration) {
	b.StopTimer()
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	if cpu > 0 {
		b.ReportMetric(float64(b.N)/cpu.Seconds(), "decisions/cpu-s")
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	}
}

// BenchmarkNaiveScan10k is the baseline a scan-based scheduler pays: a
// shortest-path tree from the borrower over the whole fabric and a pass over
// every device for the nearest one with room (no bandwidth prediction).
func BenchmarkNaiveScan10k(b *testing.B) {
	s, _ := benchIndex(b)
	g := fabric.NewGraph(s.Links)
	used := map[string]int64{}
	for _, l := range s.Leases {
		for _, p := range l.Parts {
			used[p.DeviceID] += p.Length
		}
	}
	state := map[string]string{}
	for _, n := range s.Nodes {
		state[n.ID] = n.State
	}
	rng := rand.New(rand.NewSource(2))
	reqs := make([]Request, 4096)
	for i := range reqs {
		reqs[i] = benchRequest(rng, s)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		r := reqs[i%len(reqs)]
		src, _ := g.Vertex(r.Borrower)
		t := g.ShortestPaths(src, fabric.ByHops)
		best, bestD := -1, fabric.Unreachable
		for di := range s.Devices {
			d := &s.Devices[di]
			if d.Kind != r.Kind || state[d.Node] != "" || d.Capacity-used[d.ID] < r.Size {
				continue
			}
			v, _ := g.Vertex(d.Node)
			if dd := t.Dist[v]; dd.Less(bestD, fabric.ByHops) {
				best, bestD = di, dd
			}
		}
		_ = best
	}
	reportRates(b, cpu0)
}
