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

// ScaleSpec is a synthetic data-centre run: Nodes servers in racks of
// RackSize under four spines, each lending DevicesPerNode NVMe devices
// (CallNVMe); Leases block leases arrive as a Poisson stream sized so that
// about Concurrency run at once. Each is a SMUFIN-like writer placed by
// internal/placement, moving Bytes through the fabric model with max-min
// sharing, and released when done.
//
// RemoteShare of the leases may not use a device of their own node (an
// anti-affinity to it, as a compute node without spare devices would ask),
// so they borrow across the fabric; ComposeShare want ComposeFactor times a
// device's bandwidth, which only a composition of several devices gives.
// The rest may be placed anywhere, and placement prefers the borrower's own
// devices (fewest hops).
type ScaleSpec struct {
	Nodes, RackSize, DevicesPerNode int
	Leases, Concurrency             int
	Bytes                           float64
	RemoteShare, ComposeShare       float64
	ComposeFactor                   float64
	Seed                            uint64
}

// DefaultScale is the 10,000-node, 1,000,000-lease run: 80% of the leases
// borrow from another node and 25% compose.
var DefaultScale = ScaleSpec{Nodes: 10000, RackSize: 40, DevicesPerNode: 2, Leases: 1000000, Concurrency: 10000, Bytes: 2e9,
	RemoteShare: 0.8, ComposeShare: 0.25, ComposeFactor: 1.5}

// withDefaults fills zero size fields from DefaultScale; a spec that is
// zero apart from its Seed is DefaultScale (shares included), otherwise the
// shares are taken as given.
func (sp ScaleSpec) withDefaults() ScaleSpec {
	d := DefaultScale
	if z := (ScaleSpec{Seed: sp.Seed}); sp == z {
		d.Seed = sp.Seed
		return d
	}
	if sp.Nodes <= 0 {
		sp.Nodes = d.Nodes
	}
	if sp.RackSize <= 0 {
		sp.RackSize = d.RackSize
	}
	if sp.DevicesPerNode <= 0 {
		sp.DevicesPerNode = d.DevicesPerNode
	}
	if sp.Leases <= 0 {
		sp.Leases = d.Leases
	}
	if sp.Concurrency <= 0 {
		sp.Concurrency = max(1, min(d.Concurrency, sp.Nodes))
	}
	if sp.Bytes <= 0 {
		sp.Bytes = d.Bytes
	}
	if sp.ComposeFactor <= 0 {
		sp.ComposeFactor = d.ComposeFactor
	}
	return sp
}

// ScaleResult summarises a scale run. Slowdowns are execution time over the
// time alone on an idle device at the lease's own rate.
type ScaleResult struct {
	Placed, Rejected int
	// Local and Remote count leases whose devices are all on the borrower
	// and those with at least one elsewhere.
	Local, Remote int
	// Composed, Shared and Dedicated count the plans' modes.
	Composed, Shared, Dedicated int
	// AskedRemote and AskedCompose count the leases drawn to borrow off
	// their node and to need a composition.
	AskedRemote, AskedCompose int
	// PlaceCalls is the number of placement decisions (Index.Place calls).
	PlaceCalls int
	// Slowdown percentiles and mean over placed leases.
	MeanSlowdown, P50Slowdown, P90Slowdown, P99Slowdown, MaxSlowdown float64
	VirtualSeconds                                                   Time
	Events                                                           uint64
	Recomputes                                                       uint64
	MaxActive                                                        int
}

// RemoteShare is the share of placed leases that borrow at least one device
// of another node.
func (r ScaleResult) RemoteShare() float64 {
	if r.Placed == 0 {
		return 0
	}
	return float64(r.Remote) / float64(r.Placed)
}

// ComposedShare is the share of placed leases that are compositions.
func (r ScaleResult) ComposedShare() float64 {
	if r.Placed == 0 {
		return 0
	}
	return float64(r.Composed) / float64(r.Placed)
}

func scaleSnapshot(sp ScaleSpec) *placement.Snapshot {
	s := &placement.Snapshot{Profiles: map[string]placement.Profile{CallNVMeModel: CallNVMe.Profile(CallNVMeModel)}}
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
			s.Devices = append(s.Devices, placement.Device{ID: fmt.Sprintf("%s-d%d", id, d), Node: id, Kind: placement.KindBlock, Model: CallNVMeModel, Capacity: 4 << 40})
		}
	}
	return s
}

// RunScale runs the synthetic data-centre scenario (zero fields of sp take
// DefaultScale's). progress, when not nil, is called every 100,000 leases
// with the number arrived so far; it may return an error (a cancelled
// context) to stop the run, which RunScale then returns.
func RunScale(sp ScaleSpec, progress func(done int) error) (ScaleResult, error) {
	sp = sp.withDefaults()
	c := NewCluster(scaleSnapshot(sp))
	var e Engine
	net := NewNet(&e)
	rng := newRand(sp.Seed + 1)
	spec := SmufinSpec{Bytes: sp.Bytes, Rate: DefaultSmufin.Rate, Chunks: 1}
	fast := spec
	fast.Rate = sp.ComposeFactor * CallNVMe.Max
	// Arrivals keep about Concurrency leases running: Little's law with the
	// mean time alone (fast leases finish sooner).
	meanAlone := (1-sp.ComposeShare)*spec.AloneTime() + sp.ComposeShare*fast.AloneTime()
	lambda := float64(sp.Concurrency) / meanAlone
	var res ScaleResult
	var stop error
	active := 0
	slow := make([]float64, 0, sp.Leases)
	arrived := 0
	var arrive func()
	arrive = func() {
		i := arrived
		arrived++
		if arrived < sp.Leases {
			e.After(-math.Log(1-rng.Float64())/lambda, arrive)
		}
		if progress != nil && arrived%100000 == 0 {
			if err := progress(arrived); err != nil {
				stop = err
				e.Stop()
				return
			}
		}
		b := c.Snap.Nodes[rng.IntN(len(c.Snap.Nodes))].ID
		w := spec
		if rng.Float64() < sp.ComposeShare {
			w = fast
			res.AskedCompose++
		}
		req := smufinRequest(w, b, 0)
		if w == spec && rng.IntN(4) == 0 {
			// A quarter of the ordinary leases carry a relaxed deadline
			// (twice the time alone) instead of a rate to keep.
			req.Deadline = time.Duration(2 * w.AloneTime() * float64(time.Second))
		}
		if rng.Float64() < sp.RemoteShare {
			req.AntiAffinity = []string{b}
			res.AskedRemote++
		}
		res.PlaceCalls++
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
		case placement.ModeDedicated:
			res.Dedicated++
		}
		active++
		if active > res.MaxActive {
			res.MaxActive = active
		}
		StartSmufin(&e, net, w, c.Volume(b, plan.Parts), func(w *SmufinInstance) {
			active--
			slow = append(slow, w.Slowdown())
			_ = c.Index.Remove(id)
		})
	}
	e.At(0, arrive)
	e.Run(0)
	if stop != nil {
		return res, stop
	}
	if len(slow) > 0 {
		sum := 0.0
		for _, s := range slow {
			sum += s
		}
		res.MeanSlowdown = sum / float64(len(slow))
		sort.Float64s(slow)
		q := func(p float64) float64 { return slow[min(len(slow)-1, int(p*float64(len(slow))))] }
		res.P50Slowdown, res.P90Slowdown, res.P99Slowdown, res.MaxSlowdown = q(0.5), q(0.9), q(0.99), slow[len(slow)-1]
	}
	res.VirtualSeconds = e.Now()
	res.Events = e.Events()
	res.Recomputes = net.Recomputes
	return res, nil
}

func init() {
	register("scale", own, "scale run on a synthetic data centre (10,000 nodes, 1,000,000 SMUFIN-like block leases by default) whose leases mostly borrow remote devices and compose; placement by internal/placement, bytes through the fabric model", runScale)
}

func runScale(ctx context.Context, o Options) (Result, error) {
	sp := o.ScaleSpec
	if sp.Seed == 0 {
		sp.Seed = o.Seed
	}
	sp = sp.withDefaults()
	res, err := RunScale(sp, func(int) error { return ctx.Err() })
	if err != nil {
		return Result{}, err
	}
	r := Result{Calibrations: []string{"CallNVMe", "DefaultSmufin"}, Events: res.Events,
		Header: []string{"figure", "value"}}
	add := func(name string, v float64) { r.Rows = append(r.Rows, []string{name, ftoa(v)}) }
	add("nodes", float64(sp.Nodes))
	add("leases", float64(sp.Leases))
	add("remote_share_asked", sp.RemoteShare)
	add("compose_share_asked", sp.ComposeShare)
	add("placed", float64(res.Placed))
	add("rejected", float64(res.Rejected))
	add("place_calls", float64(res.PlaceCalls))
	add("remote", float64(res.Remote))
	add("composed", float64(res.Composed))
	add("shared", float64(res.Shared))
	add("dedicated", float64(res.Dedicated))
	add("max_active", float64(res.MaxActive))
	add("virtual_seconds", res.VirtualSeconds)
	add("events", float64(res.Events))
	add("flow_recomputes", float64(res.Recomputes))
	add("slowdown_mean", res.MeanSlowdown)
	add("slowdown_p50", res.P50Slowdown)
	add("slowdown_p90", res.P90Slowdown)
	add("slowdown_p99", res.P99Slowdown)
	add("slowdown_max", res.MaxSlowdown)
	r.Plot = Plot{Title: fmt.Sprintf("Scale run: %d nodes, %d leases", sp.Nodes, sp.Leases), YLabel: "slowdown", Categories: []string{"mean", "p50", "p90", "p99", "max"},
		Series: []Series{{Name: "slowdown", X: []float64{0, 1, 2, 3, 4}, Y: []float64{res.MeanSlowdown, res.P50Slowdown, res.P90Slowdown, res.P99Slowdown, res.MaxSlowdown}}}}
	r.Metrics = []Metric{
		{Name: "leases on another node's devices", Value: res.RemoteShare(), Kind: Prediction},
		{Name: "leases composed", Value: res.ComposedShare(), Kind: Prediction},
		{Name: "leases refused", Value: float64(res.Rejected) / float64(max(1, res.Placed+res.Rejected)), Kind: Prediction},
		{Name: "slowdown p50", Value: res.P50Slowdown, Unit: "x", Kind: Prediction},
		{Name: "slowdown p99", Value: res.P99Slowdown, Unit: "x", Kind: Prediction},
		{Name: "slowdown max", Value: res.MaxSlowdown, Unit: "x", Kind: Prediction},
	}
	r.Notes = append(r.Notes, fmt.Sprintf("%d nodes in racks of %d, %d devices each (CallNVMe); %.0f%% of the leases may not use their own node, %.0f%% want %.1f× a device's bandwidth; %d placement decisions, %d events",
		sp.Nodes, sp.RackSize, sp.DevicesPerNode, 100*sp.RemoteShare, 100*sp.ComposeShare, sp.ComposeFactor, res.PlaceCalls, res.Events),
		"rates (decisions/s, events/s) are the caller's to measure: the simulator reads no clock")
	return r, nil
}
