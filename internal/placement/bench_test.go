package placement

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

// largeSnapshot is a 10,000-node cluster: 250 racks of 40 nodes under 4
// spine switches, 10 devices per node (6 block, 3 memory, 1 accel) = 100,000
// devices, and `leases` running leases placed by the policy itself.
func largeSnapshot(tb testing.TB, racks, perRack, leases int) (*Snapshot, *Index) {
	s := &Snapshot{Profiles: map[string]Profile{Seed000Model: Seed000Profile()}, Quotas: map[string]Quota{}}
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
					dev.Kind, dev.Model, dev.Capacity = KindBlock, Seed000Model, 4<<40
				case d < 9:
					dev.Kind, dev.Capacity, dev.Bandwidth = KindMemory, 256<<30, 20e9
				default:
					dev.Kind, dev.Capacity, dev.Bandwidth = KindAccel, 8, 10e9
				}
				s.Devices = append(s.Devices, dev)
			}
		}
	}
	x := NewIndex(s)
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < leases; i++ {
		r := benchRequest(rng, s)
		p, err := x.Place(r)
		if err != nil {
			continue
		}
		l := p.Lease(fmt.Sprintf("L%06d", i), r, 0)
		if err := x.Add(l); err != nil {
			tb.Fatal(err)
		}
		s.Leases = append(s.Leases, l)
	}
	return s, x
}

func benchRequest(rng *rand.Rand, s *Snapshot) Request {
	r := Request{Borrower: s.Nodes[rng.Intn(len(s.Nodes))].ID, AllowShare: true, AllowCompose: rng.Intn(2) == 0,
		Tenant: fmt.Sprintf("t%d", rng.Intn(50))}
	if r.Borrower[len(r.Borrower)-1] == '0' && rng.Intn(2) == 0 {
		r.Strategy = Spread
	}
	switch k := rng.Intn(10); {
	case k < 6:
		r.Kind, r.Size, r.Bandwidth, r.Work = KindBlock, 200<<30, Seed000WriterDemand, Seed000WriterWork
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

var benchX *Index
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
	fails := 0
	for i := 0; i < b.N; i++ {
		if _, err := x.Place(reqs[i%len(reqs)]); err != nil {
			fails++
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(float64(fails)/float64(b.N), "infeasible/op")
}

// BenchmarkPlaceAdd10k: decide, record the lease, and release an older one
// (steady churn), as the simulator does.
func BenchmarkPlaceAdd10k(b *testing.B) {
	s, x := largeSnapshot(b, 250, 40, 30000)
	rng := rand.New(rand.NewSource(3))
	var live []string
	for _, l := range s.Leases {
		live = append(live, l.ID)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := benchRequest(rng, s)
		p, err := x.Place(r)
		if err == nil {
			id := fmt.Sprintf("B%07d", i)
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
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// BenchmarkNewIndex10k: preparing the index (what Place does per call).
func BenchmarkNewIndex10k(b *testing.B) {
	s, _ := benchIndex(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		NewIndex(s)
	}
}
