package sim

import (
	"context"
	"fmt"
	"math"
	"time"
)

// SmufinHost models Fig. 4 of the NVMe-oF genomics paper (Call et al.): instances on one node share its
// memory; when they do not fit, part of their intermediate data is flushed
// to the NVMe as small synchronous writes (RocksDB spills), whose rate is
// bounded by the per-request latency — which NVMe over Fabrics lengthens.
type SmufinHost struct {
	Memory        float64       // host memory for intermediate data, in instances' worth
	SpillShare    float64       // bytes spilled per byte that does not fit, relative to the instance's output
	SpillIO       float64       // bytes per synchronous spill write
	DeviceLatency time.Duration // NVMe write latency
	FabricLatency time.Duration // extra per request over NVMe-oF
}

// DefaultSmufinHost: two instances fit in memory, a third overflows it
// (the paper: "up to two instances, the host's memory can handle all the
// intermediate data"); 4 KiB spills, 20 µs NVMe writes, 10 µs more over the
// fabric; the spill share is tuned so that three instances are 6% slower
// over the fabric, the paper's figure.
var DefaultSmufinHost = SmufinHost{Memory: 2.5, SpillShare: 0.43, SpillIO: 4096, DeviceLatency: 20 * time.Microsecond, FabricLatency: 10 * time.Microsecond}

// spillRate is one instance's synchronous spill bandwidth.
func (h SmufinHost) spillRate(remote bool) float64 {
	lat := h.DeviceLatency
	if remote {
		lat += h.FabricLatency
	}
	return h.SpillIO / (lat.Seconds() + h.SpillIO/CallNVMe.Max)
}

// runSmufinHost runs n instances on one node writing to one device, local or
// remote, and returns their mean slowdown versus one instance alone.
func runSmufinHost(spec SmufinSpec, h SmufinHost, n int, remote bool) (float64, uint64) {
	c := NewCluster(callSnapshot(CallNVMe, 1, 1))
	var e Engine
	net := NewNet(&e)
	path := []*Resource{c.Dev["nvme0"]}
	if remote {
		path = c.Path("b0", "nvme0")
	}
	overflow := math.Max(0, (float64(n)-h.Memory)/float64(n))
	spill := overflow * h.SpillShare * spec.Bytes
	sum := 0.0
	for i := 0; i < n; i++ {
		start := e.Now()
		main := func() {
			net.Start(spec.Bytes, path, spec.Rate, func(*Flow) { sum += (e.Now() - start) / spec.AloneTime() })
		}
		if spill > 0 {
			net.Start(spill, path, h.spillRate(remote), func(*Flow) { main() })
		} else {
			main()
		}
	}
	e.Run(0)
	return sum / float64(n), e.Events()
}

func init() {
	register("smufin-local-remote", follows("call", "Fig. 4"), "1–3 SMUFIN instances on one node, direct-attached NVMe vs NVMe over Fabrics", runSmufinLocalRemote)
}

func runSmufinLocalRemote(ctx context.Context, o Options) (Result, error) {
	spec := DefaultSmufin
	spec.Bytes *= o.scale()
	h := DefaultSmufinHost
	r := Result{Calibrations: []string{"CallNVMe", "DefaultSmufin", "DefaultSmufinHost"}, Header: []string{"instances", "das_slowdown", "nvmeof_slowdown", "nvmeof_vs_das"}}
	r.Plot = Plot{Title: "SMUFIN on one node: DAS vs NVMe-oF", XLabel: "instances on the node", YLabel: "execution time / 1 instance on DAS"}
	das, of := Series{Name: "direct-attached"}, Series{Name: "NVMe-oF"}
	var gap, ratio [4]float64
	for n := 1; n <= 3; n++ {
		d, ev1 := runSmufinHost(spec, h, n, false)
		f, ev2 := runSmufinHost(spec, h, n, true)
		r.Events += ev1 + ev2
		gap[n], ratio[n] = f/d-1, f/d
		r.Rows = append(r.Rows, []string{itoa(n), ftoa(d), ftoa(f), ftoa(f / d)})
		das.X, das.Y = append(das.X, float64(n)), append(das.Y, d)
		of.X, of.Y = append(of.X, float64(n)), append(of.Y, f)
	}
	r.Plot.Series = []Series{das, of}
	r.Metrics = []Metric{
		{Name: "NVMe-oF vs DAS, 1 instance", Value: ratio[1], Unit: "x", Kind: Fit, Figure: "call/fig4-12"},
		{Name: "NVMe-oF vs DAS, 2 instances", Value: ratio[2], Unit: "x", Kind: Fit, Figure: "call/fig4-12"},
		{Name: "NVMe-oF slower than DAS, 3 instances", Value: gap[3], Kind: Fit, Figure: "call/fig4-3"},
	}
	r.Notes = append(r.Notes, fmt.Sprintf("host memory holds %.1f instances' intermediate data; overflow spills %.2f× as 4 KiB synchronous writes (%.0f MB/s local, %.0f MB/s over the fabric); the memory is the paper's explanation of Fig. 4 and the spill share is fitted to its 6%%: nothing here is a prediction",
		h.Memory, h.SpillShare, h.spillRate(false)/1e6, h.spillRate(true)/1e6))
	return r, ctx.Err()
}
