package sim

import (
	"context"
	"fmt"
)

func init() {
	register("erbium-pareto", "seed 002 Figs. 4–8: ERBIUM p/w/k/e configurations × batch sizes; latency–throughput Pareto choices", runErbiumPareto)
}

func runErbiumPareto(ctx context.Context, o Options) (Result, error) {
	m := DefaultErbium
	horizon := 0.05 * o.scale()
	r := Result{Header: []string{"config", "batch", "throughput_qps", "latency_us", "pairs"}}
	r.Plot = Plot{Title: "ERBIUM latency vs throughput (seed 002, Fig. 8)", XLabel: "throughput (queries/s)", YLabel: "request time (µs)", LogY: true}
	var pairs, all []ErbiumPoint
	peak := ErbiumPoint{}
	for _, c := range ErbiumConfigs {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		s := Series{Name: c.String()}
		for _, b := range ErbiumBatches {
			p, ev := RunErbium(m, c, b, horizon)
			r.Events += ev
			all = append(all, p)
			if c.P == c.W {
				pairs = append(pairs, p)
			}
			if p.Throughput > peak.Throughput {
				peak = p
			}
			r.Rows = append(r.Rows, []string{c.String(), itoa(b), ftoa(p.Throughput), ftoa(p.Latency * 1e6), fmt.Sprint(c.P == c.W)})
			s.X = append(s.X, p.Throughput)
			s.Y = append(s.Y, p.Latency*1e6)
		}
		if c.P == c.W {
			r.Plot.Series = append(r.Plot.Series, s)
		}
	}
	r.Plot.HLines = []float64{500}
	fast, busy := ParetoChoice(pairs, 20e6, 500e-6)
	fastAll, busyAll := ParetoChoice(all, 20e6, 500e-6)
	r.Metrics = []Metric{
		{Name: "peak throughput (" + peak.Config.String() + ")", Value: peak.Throughput, Unit: "q/s", Paper: 40e6, Tolerance: 0.2},
		{Name: "lowest latency at >=20 Mq/s: " + fast.Config.String(), Value: fast.Latency * 1e6, Unit: "us"},
		{Name: "highest throughput at <=500 us: " + busy.Config.String(), Value: busy.Throughput, Unit: "q/s"},
	}
	r.Notes = append(r.Notes,
		fmt.Sprintf("Pareto over process–worker pairs (p = w, the paper's Fig. 8 series): >=20 Mq/s -> %s (batch %d), <=500 µs -> %s (batch %d); paper: 4p4w1k4e and 2p2w1k4e", fast.Config, fast.Batch, busy.Config, busy.Batch),
		fmt.Sprintf("including several processes per worker (Fig. 7 series) the model picks %s and %s: it lets one worker batch 4 processes cheaply", fastAll.Config, busyAll.Config))
	return r, nil
}
