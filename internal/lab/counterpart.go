package lab

import (
	"context"

	"github.com/rialto-project/rialto/internal/sim"
	"github.com/rialto-project/rialto/internal/sim/report"
)

// counterparts measure, on Rialto's own code, the figures of the simulator
// experiment they are keyed by, and fill Metric.Real.
var counterparts = map[string]func(ctx context.Context, res *sim.Result) error{}

// Counterpart measures the real counterpart of res's experiment and fills
// the Real field of the metrics it measured (a report.Real for `rialto sim
// run --real`). It returns report.ErrNoReal for an experiment without one.
func Counterpart(ctx context.Context, res *sim.Result) error {
	f, ok := counterparts[res.Name]
	if !ok {
		return report.ErrNoReal
	}
	return f(ctx, res)
}

// setReal fills the named metric's real counterpart.
func setReal(res *sim.Result, name string, r sim.Real) bool {
	for i := range res.Metrics {
		if res.Metrics[i].Name == name {
			res.Metrics[i].Real = &r
			return true
		}
	}
	return false
}
