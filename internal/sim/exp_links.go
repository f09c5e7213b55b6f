package sim

import (
	"context"
	"fmt"
)

func init() {
	register("link-sharing", own, "sequential writers striping over 1–3 lenders whose links tc tbf shapes; per-writer bandwidth from max-min sharing, measured with NBD and stripe volumes in network namespaces (--real, root)", runLinkSharing)
}

// SimulateWriters predicts the per-writer bandwidth of w writers striping
// evenly over k lenders whose links carry rate bytes/s each (frames; the
// payload is WireEfficiency of it): one flow per writer and lender, sharing
// the lender links max-min fairly, each writer done when its last stripe
// is. It returns each writer's rate while all are active and its bytes over
// its own elapsed time.
func SimulateWriters(k, w int, rate float64, bytes int64) (steady, whole []float64) {
	var e Engine
	n := NewNet(&e)
	links := make([]*Resource, k)
	for i := range links {
		links[i] = &Resource{Name: fmt.Sprintf("lender%d", i), Capacity: rate * WireEfficiency}
	}
	whole = make([]float64, w)
	steady = make([]float64, w)
	flows := make([][]*Flow, w)
	for j := 0; j < w; j++ {
		left := k
		for i := 0; i < k; i++ {
			f := n.Start(float64(bytes)/float64(k), []*Resource{links[i]}, 0, func(*Flow) {
				left--
				if left == 0 {
					whole[j] = float64(bytes) / e.Now()
				}
			})
			flows[j] = append(flows[j], f)
		}
	}
	// Rates are set at time 0 once the simultaneous starts are solved.
	e.At(0, func() {
		for j := range flows {
			for _, f := range flows[j] {
				steady[j] += f.Rate()
			}
		}
	})
	e.Run(0)
	return steady, whole
}

// LinkSharingScenarios are the (lenders, writers) pairs link-sharing
// reports; LinkSharingRate is their links' tbf rate in bytes/s and
// LinkSharingBytes what each writer writes per lender.
var LinkSharingScenarios = [][2]int{{1, 1}, {1, 6}, {3, 1}, {3, 6}}

const (
	LinkSharingRate  = 40e6 / 8
	LinkSharingBytes = 4 << 20
)

// LinkSharingMetric names the figure of a scenario.
func LinkSharingMetric(k, w int) string {
	return fmt.Sprintf("%d lender(s), %d writer(s): per-writer bandwidth", k, w)
}

func runLinkSharing(ctx context.Context, o Options) (Result, error) {
	r := Result{Header: []string{"lenders", "writers", "per_writer_MBps"}}
	r.Plot = Plot{Title: "Per-writer bandwidth on tbf-shaped lender links (simulated)", XLabel: "writers", YLabel: "MB/s per writer"}
	for _, sc := range LinkSharingScenarios {
		k, w := sc[0], sc[1]
		_, whole := SimulateWriters(k, w, LinkSharingRate, int64(k)*LinkSharingBytes)
		r.Rows = append(r.Rows, []string{itoa(k), itoa(w), ftoa(whole[0] / 1e6)})
		r.Metrics = append(r.Metrics, Metric{Name: LinkSharingMetric(k, w), Value: whole[0] / 1e6, Unit: "MB/s", Kind: Prediction})
	}
	s := Series{Name: "simulated"}
	for i, m := range r.Metrics {
		s.X, s.Y = append(s.X, float64(i)), append(s.Y, m.Value)
	}
	r.Plot.Categories = []string{"1×1", "1×6", "3×1", "3×6"}
	r.Plot.Series = []Series{s}
	r.Notes = append(r.Notes, fmt.Sprintf("links of %.0f Mbit/s (%.2f MB/s of payload), %d MiB per writer and lender; the real counterpart is the writers lab (internal/lab, TCP Reno, 1.25 MB tbf queues), whose full matrix is in docs/bench/sim.md",
		LinkSharingRate*8/1e6, LinkSharingRate*WireEfficiency/1e6, LinkSharingBytes>>20))
	return r, ctx.Err()
}
