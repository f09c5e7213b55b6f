package sim

import (
	"context"
	"fmt"
)

// Seed 000's testbed: borrower nodes reach a pool server's NVMe devices over
// a fabric that is never the bottleneck (100 GbE links).
const (
	ethernet100G = 12.5e9
	degradeAt    = 1.05 // a run more than 5% slower than alone is "degraded"
)

// nvmePool is a pool server with devices behind one NIC, and borrowers each
// with its own NIC.
type nvmePool struct {
	poolNIC *Resource
	devices []*Resource
}

func newNVMePool(ndev int) *nvmePool {
	p := &nvmePool{poolNIC: &Resource{Name: "pool-nic", Capacity: ethernet100G}}
	for i := 0; i < ndev; i++ {
		p.devices = append(p.devices, &Resource{Name: fmt.Sprintf("nvme%d", i), Capacity: NVMeBandwidth, Profile: NVMeProfile})
	}
	return p
}

// volume builds a volume over the given device indices as seen from a
// borrower with NIC nic.
func (p *nvmePool) volume(nic *Resource, devs ...int) Volume {
	var v Volume
	for _, d := range devs {
		v.Members = append(v.Members, []*Resource{nic, p.poolNIC, p.devices[d]})
	}
	return v
}

// smufinRun runs one SMUFIN instance per volume, all started together, and
// returns each instance's slowdown versus alone on one device.
func smufinRun(spec SmufinSpec, p *nvmePool, vols func(i int, nic *Resource) Volume, n int) ([]float64, *Engine) {
	var e Engine
	net := NewNet(&e)
	out := make([]float64, n)
	for i := 0; i < n; i++ {
		nic := &Resource{Name: fmt.Sprintf("borrower%d-nic", i), Capacity: ethernet100G}
		StartSmufin(&e, net, spec, vols(i, nic), func(w *SmufinInstance) { out[i] = w.Slowdown() })
	}
	e.Run(0)
	return out, &e
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
	register("smufin-fig8", "seed 000 Fig. 8: 5 SMUFIN instances on (a) 1 shared device, (b) a 2-device composition, (c) 1 dedicated + 4 shared", runSmufinFig8)
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
		for n := 1; n <= 7; n++ {
			if err := ctx.Err(); err != nil {
				return r, err
			}
			p := newNVMePool(k)
			all := make([]int, k)
			for i := range all {
				all[i] = i
			}
			sl, e := smufinRun(spec, p, func(_ int, nic *Resource) Volume { return p.volume(nic, all...) }, n)
			r.Events += e.Events()
			bytes := 0.0
			for _, d := range p.devices {
				bytes += d.Bytes
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
	r.Notes = append(r.Notes, "degraded = mean execution time more than 5% above one instance alone on one device",
		fmt.Sprintf("instance: %.3g bytes at %.0f MB/s (seed 000's 150 GB scaled by %.3g); device profile %v", spec.Bytes, spec.Rate/1e6, spec.Bytes/150e9, NVMeProfile))
	return r, nil
}

func runSmufinFig8(ctx context.Context, o Options) (Result, error) {
	spec := DefaultSmufin
	spec.Bytes *= o.scale()
	r := Result{Header: []string{"scenario", "instance", "placement", "slowdown", "seconds"}}
	type scen struct {
		name, label string
		vol         func(p *nvmePool, i int, nic *Resource) Volume
	}
	scens := []scen{
		{"a", "(a) 1 shared device", func(p *nvmePool, _ int, nic *Resource) Volume { return p.volume(nic, 0) }},
		{"b", "(b) 2-device composition", func(p *nvmePool, _ int, nic *Resource) Volume { return p.volume(nic, 0, 1) }},
		{"c", "(c) 1 dedicated + 4 shared", func(p *nvmePool, i int, nic *Resource) Volume {
			if i == 0 {
				return p.volume(nic, 0)
			}
			return p.volume(nic, 1)
		}},
	}
	r.Plot = Plot{Title: "5 SMUFIN instances (seed 000, Fig. 8)", YLabel: "execution time / alone", Categories: []string{"instance 1", "2", "3", "4", "5", "mean"}}
	means := map[string]float64{}
	ded := 0.0
	for _, sc := range scens {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		p := newNVMePool(2)
		sl, e := smufinRun(spec, p, func(i int, nic *Resource) Volume { return sc.vol(p, i, nic) }, 5)
		r.Events += e.Events()
		s := Series{Name: sc.label}
		for i, v := range sl {
			pl := "shared"
			switch {
			case sc.name == "b":
				pl = "composed(2)"
			case sc.name == "c" && i == 0:
				pl = "dedicated"
				ded = v
			}
			r.Rows = append(r.Rows, []string{sc.name, itoa(i + 1), pl, ftoa(v), ftoa(v * spec.AloneTime())})
			s.X = append(s.X, float64(i))
			s.Y = append(s.Y, v)
		}
		means[sc.name] = mean(sl)
		s.X = append(s.X, 5)
		s.Y = append(s.Y, mean(sl))
		r.Plot.Series = append(r.Plot.Series, s)
		r.Metrics = append(r.Metrics, Metric{Name: "mean slowdown " + sc.label, Value: means[sc.name], Unit: "x"},
			Metric{Name: "makespan slowdown " + sc.label, Value: maxf(sl), Unit: "x"})
	}
	fastest := "a"
	for _, k := range []string{"b", "c"} {
		if means[k] < means[fastest] {
			fastest = k
		}
	}
	r.Metrics = append(r.Metrics, Metric{Name: "dedicated instance in (c) vs (b) mean", Value: ded / means["b"], Unit: "x"})
	r.Notes = append(r.Notes, "fastest on mean execution time: ("+fastest+"); paper: (b), the 2-device composition")
	return r, nil
}
