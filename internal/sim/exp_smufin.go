package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
	"github.com/rialto-project/rialto/internal/placement"
)

// degradeAt: a run more than placement's slowdown tolerance (1%) slower
// than alone is "degraded" — the same criterion placement plans with.
const degradeAt = 1 + placement.SlowdownTolerance

// seed000Snapshot is seed 000's testbed as a placement snapshot: a pool
// server with ndev NVMe devices (seed-000 profile) and nb borrower nodes, all
// on one 100 GbE switch (the network is never the bottleneck).
func seed000Snapshot(ndev, nb int) *placement.Snapshot {
	s := &placement.Snapshot{Profiles: map[string]placement.Profile{placement.Seed000Model: placement.Seed000Profile()}}
	s.Nodes = append(s.Nodes, placement.Node{ID: "pool"})
	s.Links = append(s.Links, fabric.Link{ID: "pool-sw", A: "pool", B: "sw", Kind: fabric.Ethernet, Bandwidth: 12.5e9, Latency: 2 * time.Microsecond})
	for i := 0; i < ndev; i++ {
		s.Devices = append(s.Devices, placement.Device{ID: fmt.Sprintf("nvme%d", i), Node: "pool", Kind: placement.KindBlock, Model: placement.Seed000Model, Capacity: 1600e9})
	}
	for i := 0; i < nb; i++ {
		id := fmt.Sprintf("b%d", i)
		s.Nodes = append(s.Nodes, placement.Node{ID: id})
		s.Links = append(s.Links, fabric.Link{ID: id + "-sw", A: id, B: "sw", Kind: fabric.Ethernet, Bandwidth: 12.5e9, Latency: 2 * time.Microsecond})
	}
	return s
}

// smufinRun runs one SMUFIN instance per borrower b0..b(n-1), all started
// together, on the volumes vol gives, and returns each instance's slowdown
// versus alone on one device.
func smufinRun(spec SmufinSpec, c *Cluster, vol func(i int, borrower string) Volume, n int) ([]float64, *Engine) {
	var e Engine
	net := NewNet(&e)
	out := make([]float64, n)
	for i := 0; i < n; i++ {
		b := fmt.Sprintf("b%d", i)
		StartSmufin(&e, net, spec, vol(i, b), func(w *SmufinInstance) { out[i] = w.Slowdown() })
	}
	e.Run(0)
	return out, &e
}

func devParts(ids ...string) []placement.Part {
	var out []placement.Part
	for _, id := range ids {
		out = append(out, placement.Part{NodeID: "pool", DeviceID: id})
	}
	return out
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func maxf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		if x > m {
			m = x
		}
	}
	return m
}

func init() {
	register("smufin-sharing", "seed 000 Fig. 6: SMUFIN writers sharing 1 NVMe or a 2-/3-device composition; degradation thresholds", runSmufinSharing)
	register("smufin-fig8", "seed 000 Fig. 8: 5 SMUFIN instances on (a) 1 shared device, (b) a 2-device composition, (c) 1 dedicated + 4 shared, and as placed by Rialto", runSmufinFig8)
}

func runSmufinSharing(ctx context.Context, o Options) (Result, error) {
	spec := DefaultSmufin
	spec.Bytes *= o.scale()
	r := Result{Header: []string{"devices", "instances", "mean_slowdown", "max_slowdown", "delivered_GBps", "degraded"}}
	r.Plot = Plot{Title: "SMUFIN instances sharing NVMe (seed 000, Fig. 6)", XLabel: "concurrent instances", YLabel: "execution time / alone on 1 device", HLines: []float64{degradeAt}}
	paper := map[int]float64{1: 3, 2: 4, 3: 6}
	for k := 1; k <= 3; k++ {
		s := Series{Name: fmt.Sprintf("%dx NVMe", k)}
		threshold := 0
		var ids []string
		for i := 0; i < k; i++ {
			ids = append(ids, fmt.Sprintf("nvme%d", i))
		}
		for n := 1; n <= 7; n++ {
			if err := ctx.Err(); err != nil {
				return r, err
			}
			c := NewCluster(seed000Snapshot(k, n))
			sl, e := smufinRun(spec, c, func(_ int, b string) Volume { return c.Volume(b, devParts(ids...)) }, n)
			r.Events += e.Events()
			bytes := 0.0
			for _, id := range ids {
				bytes += c.Dev[id].Bytes
			}
			m := mean(sl)
			deg := m > degradeAt
			if deg && threshold == 0 {
				threshold = n
			}
			r.Rows = append(r.Rows, []string{itoa(k), itoa(n), ftoa(m), ftoa(maxf(sl)), ftoa(bytes / e.Now() / 1e9), fmt.Sprint(deg)})
			s.X = append(s.X, float64(n))
			s.Y = append(s.Y, m)
		}
		r.Plot.Series = append(r.Plot.Series, s)
		r.Metrics = append(r.Metrics, Metric{Name: fmt.Sprintf("degradation threshold, %d device(s)", k), Value: float64(threshold), Unit: "instances", Paper: paper[k], Tolerance: 0.01})
	}
	r.Notes = append(r.Notes, fmt.Sprintf("degraded = mean execution time more than %.0f%% above one instance alone on one device (placement.SlowdownTolerance)", placement.SlowdownTolerance*100),
		fmt.Sprintf("instance: %.3g bytes at %.0f MB/s (seed 000's 150 GB scaled by %.3g); device: placement.Seed000Profile", spec.Bytes, spec.Rate/1e6, spec.Bytes/150e9))
	return r, nil
}

// smufinRequest is the lease a SMUFIN instance asks for.
func smufinRequest(spec SmufinSpec, borrower string, deadline time.Duration) placement.Request {
	return placement.Request{Kind: placement.KindBlock, Size: 200e9, Borrower: borrower, Bandwidth: spec.Rate,
		Work: int64(spec.Bytes), Deadline: deadline, AllowShare: true, AllowCompose: true, Tenant: "genomics"}
}

func runSmufinFig8(ctx context.Context, o Options) (Result, error) {
	spec := DefaultSmufin
	spec.Bytes *= o.scale()
	r := Result{Header: []string{"scenario", "instance", "placement", "slowdown", "seconds"}}
	type scen struct {
		name, label string
		parts       func(c *Cluster, i int, b string) ([]placement.Part, string, error)
	}
	fixed := func(f func(i int) []placement.Part, mode func(i int) string) func(*Cluster, int, string) ([]placement.Part, string, error) {
		return func(_ *Cluster, i int, _ string) ([]placement.Part, string, error) { return f(i), mode(i), nil }
	}
	placed := func(deadline time.Duration) func(*Cluster, int, string) ([]placement.Part, string, error) {
		return func(c *Cluster, i int, b string) ([]placement.Part, string, error) {
			req := smufinRequest(spec, b, deadline)
			p, err := c.Index.Place(req)
			if err != nil {
				return nil, "", err
			}
			if err := c.Index.Add(p.Lease(fmt.Sprintf("smufin-%d", i), req, 0)); err != nil {
				return nil, "", err
			}
			return p.Parts, p.String(), nil
		}
	}
	scens := []scen{
		{"a", "(a) 1 shared device", fixed(func(int) []placement.Part { return devParts("nvme0") }, func(int) string { return "shared nvme0" })},
		{"b", "(b) 2-device composition", fixed(func(int) []placement.Part { return devParts("nvme0", "nvme1") }, func(int) string { return "composed nvme0+nvme1" })},
		{"c", "(c) 1 dedicated + 4 shared", fixed(func(i int) []placement.Part {
			if i == 0 {
				return devParts("nvme0")
			}
			return devParts("nvme1")
		}, func(i int) string {
			if i == 0 {
				return "dedicated nvme0"
			}
			return "shared nvme1"
		})},
		{"rialto", "Rialto placement, no deadline", placed(0)},
		{"rialto-deadline", "Rialto placement, deadline 1.5x alone", placed(time.Duration(1.5 * spec.AloneTime() * float64(time.Second)))},
	}
	r.Plot = Plot{Title: "5 SMUFIN instances (seed 000, Fig. 8)", YLabel: "execution time / alone", Categories: []string{"instance 1", "2", "3", "4", "5", "mean"}}
	means := map[string]float64{}
	ded := 0.0
	for _, sc := range scens {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		c := NewCluster(seed000Snapshot(2, 5))
		labels := make([]string, 5)
		var perr error
		sl, e := smufinRun(spec, c, func(i int, b string) Volume {
			parts, label, err := sc.parts(c, i, b)
			if err != nil {
				perr = err
				return Volume{}
			}
			labels[i] = label
			return c.Volume(b, parts)
		}, 5)
		if perr != nil {
			r.Notes = append(r.Notes, fmt.Sprintf("%s: placement refused an instance: %v", sc.label, perr))
			continue
		}
		r.Events += e.Events()
		s := Series{Name: sc.label}
		for i, v := range sl {
			if sc.name == "c" && i == 0 {
				ded = v
			}
			r.Rows = append(r.Rows, []string{sc.name, itoa(i + 1), labels[i], ftoa(v), ftoa(v * spec.AloneTime())})
			s.X = append(s.X, float64(i))
			s.Y = append(s.Y, v)
		}
		means[sc.name] = mean(sl)
		s.X = append(s.X, 5)
		s.Y = append(s.Y, mean(sl))
		r.Plot.Series = append(r.Plot.Series, s)
		r.Metrics = append(r.Metrics, Metric{Name: "mean slowdown " + sc.label, Value: means[sc.name], Unit: "x"},
			Metric{Name: "makespan slowdown " + sc.label, Value: maxf(sl), Unit: "x"})
		if sc.name != "a" && sc.name != "b" && sc.name != "c" {
			r.Notes = append(r.Notes, sc.label+": "+fmt.Sprint(labels))
		}
	}
	fastest := "a"
	for _, k := range []string{"b", "c"} {
		if means[k] < means[fastest] {
			fastest = k
		}
	}
	r.Metrics = append(r.Metrics, Metric{Name: "dedicated instance in (c) vs (b) mean", Value: ded / means["b"], Unit: "x"})
	r.Notes = append(r.Notes, "fastest fixed layout on mean execution time: ("+fastest+"); paper: (b), the 2-device composition")
	return r, nil
}
