package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
	"github.com/rialto-project/rialto/internal/placement"
)

// ScaleSpec is a synthetic data-centre run: Nodes servers in racks of
// RackSize under four spines, each lending NVMe devices (seed-000 profile);
// Leases block leases arrive as a Poisson stream sized so that about
// Concurrency run at once; each is a SMUFIN-like writer placed by
// internal/placement, moving Bytes through the fabric model with max-min
// sharing, and released when done.
type ScaleSpec struct {
	Nodes, RackSize, DevicesPerNode int
	Leases, Concurrency             int
	Bytes                           float64
	Seed                            uint64
}

// DefaultScale is the 10,000-node, 1,000,000-lease run.
var DefaultScale = ScaleSpec{Nodes: 10000, RackSize: 40, DevicesPerNode: 2, Leases: 1000000, Concurrency: 10000, Bytes: 2e9}

// ScaleResult summarises a scale run.
type ScaleResult struct {
	Placed, Rejected int
	Local, Remote    int // leases whose devices are all on the borrower / not
	Composed, Shared int
	MeanSlowdown     float64
	VirtualSeconds   Time
	Events           uint64
	Recomputes       uint64
	MaxActive        int
}

func scaleSnapshot(sp ScaleSpec) *placement.Snapshot {
	s := &placement.Snapshot{Profiles: map[string]placement.Profile{placement.Seed000Model: placement.Seed000Profile()}}
	racks := (sp.Nodes + sp.RackSize - 1) / sp.RackSize
	for r := 0; r < racks; r++ {
		tor := fmt.Sprintf("tor%04d", r)
		for k := 0; k < 4; k++ {
			s.Links = append(s.Links, fabric.Link{ID: fmt.Sprintf("%s-sp%d", tor, k), A: tor, B: fmt.Sprintf("spine%d", k), Kind: fabric.Ethernet, Bandwidth: 50e9, Latency: 2 * time.Microsecond})
		}
	}
	for i := 0; i < sp.Nodes; i++ {
		id := fmt.Sprintf("n%05d", i)
		s.Nodes = append(s.Nodes, placement.Node{ID: id})
		s.Links = append(s.Links, fabric.Link{ID: id, A: id, B: fmt.Sprintf("tor%04d", i/sp.RackSize), Kind: fabric.Ethernet, Bandwidth: 12.5e9, Latency: time.Microsecond})
		for d := 0; d < sp.DevicesPerNode; d++ {
			s.Devices = append(s.Devices, placement.Device{ID: fmt.Sprintf("%s-d%d", id, d), Node: id, Kind: placement.KindBlock, Model: placement.Seed000Model, Capacity: 4 << 40})
		}
	}
	return s
}

// RunScale runs the synthetic data-centre scenario. progress, when not nil,
// is called every 100,000 leases with the number placed so far.
func RunScale(sp ScaleSpec, progress func(done int)) ScaleResult {
	c := NewCluster(scaleSnapshot(sp))
	var e Engine
	net := NewNet(&e)
	rng := newRand(sp.Seed + 1)
	spec := SmufinSpec{Bytes: sp.Bytes, Rate: placement.Seed000WriterDemand, Chunks: 1}
	lambda := float64(sp.Concurrency) / spec.AloneTime()
	var res ScaleResult
	active := 0
	sumSlow := 0.0
	arrived := 0
	var arrive func()
	arrive = func() {
		i := arrived
		arrived++
		if arrived < sp.Leases {
			e.After(-math.Log(1-rng.Float64())/lambda, arrive)
		}
		if progress != nil && arrived%100000 == 0 {
			progress(arrived)
		}
		b := c.Snap.Nodes[rng.IntN(len(c.Snap.Nodes))].ID
		req := smufinRequest(spec, b, 0)
		if rng.IntN(4) == 0 {
			req.Deadline = time.Duration(2 * spec.AloneTime() * float64(time.Second))
		}
		plan, err := c.Index.Place(req)
		if err != nil {
			res.Rejected++
			return
		}
		id := fmt.Sprintf("L%07d", i)
		if err := c.Index.Add(plan.Lease(id, req, time.Duration(e.Now()*float64(time.Second)))); err != nil {
			res.Rejected++
			return
		}
		res.Placed++
		local := true
		for _, p := range plan.Parts {
			if p.NodeID != b {
				local = false
			}
		}
		if local {
			res.Local++
		} else {
			res.Remote++
		}
		switch plan.Mode {
		case placement.ModeComposed:
			res.Composed++
		case placement.ModeShared:
			res.Shared++
		}
		active++
		if active > res.MaxActive {
			res.MaxActive = active
		}
		StartSmufin(&e, net, spec, c.Volume(b, plan.Parts), func(w *SmufinInstance) {
			active--
			sumSlow += w.Slowdown()
			_ = c.Index.Remove(id)
		})
	}
	e.At(0, arrive)
	e.Run(0)
	if res.Placed > 0 {
		res.MeanSlowdown = sumSlow / float64(res.Placed)
	}
	res.VirtualSeconds = e.Now()
	res.Events = e.Events()
	res.Recomputes = net.Recomputes
	return res
}
