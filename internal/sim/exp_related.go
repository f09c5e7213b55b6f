package sim

import (
	"context"
	"fmt"
	"math"
)

func init() {
	register("erbium-related", follows("erbium", "§4.2 and Fig. 10"), "related-query batching — up to how many queries per user request the CPU's early-exit loop beats a batched accelerator call; on the paper's pipeline model and, with --real, on Rialto's MCT role", runErbiumRelated)
}

// RelatedModel is the related-query batching trade-off: a user request
// whose CPU loop checks n queries (CPUFixed + n·CPU seconds) before it has
// enough valid results is sent to the accelerator as one batch of Extra
// more queries (the loop's early exit is not known in advance), which
// takes Call(b) seconds for b queries.
type RelatedModel struct {
	CPUFixed, CPU float64
	Extra         float64
	Call          func(b int) float64
}

// Crossover is the fewest queries per request (up to max) for which the
// batched call is faster than the CPU loop (0: none up to max). Calls cost
// at least their fixed part, so the CPU wins below it.
func (m RelatedModel) Crossover(max int) int {
	for n := 1; n <= max; n++ {
		b := int(math.Ceil(float64(n) * (1 + m.Extra)))
		if m.Call(b) < m.CPUFixed+m.CPU*float64(n) {
			return n
		}
	}
	return 0
}

// RelatedExtra is the share of extra queries a batch checks (the paper's
// 23%).
var RelatedExtra = fig("erbium/related-extra")

// LinearCall is a call whose latency is Fixed plus PerQuery per query: a
// characterization of a lent accelerator (see package lab).
func LinearCall(fixed, perQuery float64) func(int) float64 {
	return func(b int) float64 { return fixed + perQuery*float64(b) }
}

// RelatedCrossoverLinear is the crossover for a linear call and a CPU loop
// with no fixed cost, in closed form: the fewest n with fixed +
// (1+extra)·n·perQuery < cpu·n, i.e. n > fixed / (cpu −
// (1+extra)·perQuery); 0 when the accelerator is not faster per query than
// the CPU once the extra queries are counted.
func RelatedCrossoverLinear(cpu, extra, fixed, perQuery float64) float64 {
	gain := cpu - (1+extra)*perQuery
	if gain <= 0 {
		return 0
	}
	return fixed / gain
}

// ErbiumCallModel is the ERBIUM pipeline's request time for one batch of b
// queries from a single process (1p1w1k4e, closed loop: no queueing).
func ErbiumCallModel(m ErbiumModel) func(int) float64 {
	memo := map[int]float64{}
	return func(b int) float64 {
		if v, ok := memo[b]; ok {
			return v
		}
		p, _ := RunErbium(m, ErbiumConfig{1, 1, 1, 4}, b, 0.02)
		memo[b] = p.Latency
		return p.Latency
	}
}

func runErbiumRelated(ctx context.Context, o Options) (Result, error) {
	m := DefaultErbium
	cpu := 800 / fig("erbium/standalone") // seconds per query on one CPU instance
	model := RelatedModel{CPU: cpu, Extra: fig("erbium/related-extra"), Call: ErbiumCallModel(m)}
	const maxN = 6000
	n := model.Crossover(maxN)
	r := Result{Calibrations: []string{"DefaultErbium", "ErbiumRelated"}, Header: []string{"queries_per_request", "cpu_us", "accelerator_us"}}
	cpuS, accS := Series{Name: "CPU loop"}, Series{Name: "batched accelerator call"}
	for _, q := range []int{1, 2, 5, 10, 20, 50, 100, 200, 400, 1000, 2000, 6000} {
		b := int(math.Ceil(float64(q) * (1 + model.Extra)))
		c, a := cpu*float64(q)*1e6, model.Call(b)*1e6
		r.Rows = append(r.Rows, []string{itoa(q), ftoa(c), ftoa(a)})
		cpuS.X, cpuS.Y = append(cpuS.X, float64(q)), append(cpuS.Y, c)
		accS.X, accS.Y = append(accS.X, float64(q)), append(accS.Y, a)
	}
	r.Plot = Plot{Title: "Related-query batching: CPU loop vs one batched call (ERBIUM model)", XLabel: "queries the CPU checks per request", YLabel: "request time (µs)", LogX: true, LogY: true, Series: []Series{cpuS, accS}}
	need := model.Call(int(math.Ceil(fig("erbium/related-crossover")*(1+model.Extra)))) / fig("erbium/related-crossover")
	r.Metrics = []Metric{
		{Name: "batched call faster from (queries per request)", Value: float64(n), Unit: "queries", Kind: Prediction, Figure: "erbium/related-crossover",
			Miss: fmt.Sprintf("with the paper's 800× (%.0f µs per query on one CPU) the batched call wins from %d queries; a crossover at 400 needs the CPU loop to check a query in about %.2f µs, %.0f× faster than 800× implies: the loop of §4.2 (the Domain Explorer's own, with early exit) is not the CPU engine the 800× was measured against", cpu*1e6, n, need*1e6, cpu/need)},
		{Name: "crossover, Rialto's MCT role vs the local rule scan", Kind: Pending,
			Note: "needs --real: the model's inputs (a query's cost in the local scan and in the role, a call's fixed cost) are measured on this machine, then the crossover is predicted and measured"},
	}
	if o.Sensitivity {
		r.Metrics[0].Sensitivity = []Sensitivity{
			sensitize("CPU time per query", cpu, func(f float64) string {
				mm := model
				mm.CPU *= f
				return fmt.Sprint(math.Abs(float64(mm.Crossover(maxN))-fig("erbium/related-crossover")) <= fig0("erbium/related-crossover")*fig("erbium/related-crossover"))
			}),
			sensitize("extra queries", model.Extra, func(f float64) string {
				mm := model
				mm.Extra *= f
				return fmt.Sprint(math.Abs(float64(mm.Crossover(maxN))-fig("erbium/related-crossover")) <= fig0("erbium/related-crossover")*fig("erbium/related-crossover"))
			}),
		}
	}
	r.Notes = append(r.Notes, fmt.Sprintf("CPU: %.0f µs per query (the stand-alone 50 M queries/s over the paper's 800×); accelerator: the erbium-pareto pipeline model, one process and one worker on a 4-engine kernel, %.0f µs for a 64-query batch; the accelerator checks %.0f%% more queries (the paper's figure)",
		cpu*1e6, model.Call(64)*1e6, 100*model.Extra))
	return r, ctx.Err()
}
