package sim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"sort"
	"strconv"
	"strings"
)

// ErrUnknownExperiment is returned by Run for a name Experiments does not list.
var ErrUnknownExperiment = errors.New("sim: unknown experiment")

// ErrNoTraces is returned by trace-driven experiments when Options.Traces is nil.
var ErrNoTraces = errors.New("sim: trace directory not set")

// Options parameterise a run. The zero value runs every experiment at its
// default (test) size with seed 0.
type Options struct {
	// Seed makes runs reproducible: the same seed gives the same result.
	Seed uint64
	// OutDir is where the report layer (package sim/report) writes the CSV and
	// SVG files; Run itself writes nothing.
	OutDir string
	// Scale multiplies the size of a run (queries, jobs, instances' bytes);
	// 0 means 1. Headline ratios do not depend on it.
	Scale float64
	// Traces is the trace directory (the layout of ../shared/data/traces);
	// needed by trace-driven experiments.
	Traces fs.FS
	// PodList names the openb pod list to replay (default
	// "openb_pod_list_default.csv").
	PodList string
	// Sample > 1 replays every Sample-th node and pod of the trace (tests).
	Sample int
}

func (o Options) scale() float64 {
	if o.Scale <= 0 {
		return 1
	}
	return o.Scale
}

// Metric is one headline number of an experiment, with the seed's figure it
// reproduces (Paper, 0 when the seed gives none) and the tolerance the tests
// hold it to (relative, e.g. 0.1 for ±10%).
type Metric struct {
	Name      string
	Value     float64
	Unit      string
	Paper     float64
	Tolerance float64
}

// Within reports whether the value is within the tolerance of the paper's
// figure (true when there is no figure to compare with).
func (m Metric) Within() bool {
	if m.Paper == 0 || m.Tolerance == 0 {
		return true
	}
	return math.Abs(m.Value-m.Paper) <= m.Tolerance*math.Abs(m.Paper)
}

// Result is what one experiment produced: a table (written as CSV), a plot
// (written as SVG), headline metrics and notes.
type Result struct {
	Name        string
	Description string
	Header      []string
	Rows        [][]string
	Plot        Plot
	Metrics     []Metric
	Notes       []string
	// Events is the number of simulation events the run executed.
	Events uint64
}

// ExperimentInfo names and describes an experiment.
type ExperimentInfo struct {
	Name        string
	Description string
}

type experiment struct {
	ExperimentInfo
	run func(ctx context.Context, o Options) (Result, error)
}

var registry []experiment

func register(name, desc string, run func(context.Context, Options) (Result, error)) {
	registry = append(registry, experiment{ExperimentInfo{name, desc}, run})
}

// Experiments lists the named experiments, sorted by name.
func Experiments() []ExperimentInfo {
	out := make([]ExperimentInfo, len(registry))
	for i, e := range registry {
		out[i] = e.ExperimentInfo
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Run runs the named experiment. It is pure: it reads traces only through
// o.Traces and writes nothing (see package sim/report for files).
func Run(ctx context.Context, name string, o Options) (Result, error) {
	for _, e := range registry {
		if e.Name == name {
			if err := ctx.Err(); err != nil {
				return Result{}, err
			}
			r, err := e.run(ctx, o)
			if err != nil {
				return Result{}, fmt.Errorf("sim: experiment %s: %w", name, err)
			}
			r.Name, r.Description = e.Name, e.Description
			return r, nil
		}
	}
	return Result{}, fmt.Errorf("%w: %q", ErrUnknownExperiment, name)
}

// CSV renders the table as RFC 4180 CSV.
func (r Result) CSV() []byte {
	var b strings.Builder
	line := func(cells []string) {
		for i, c := range cells {
			if i > 0 {
				b.WriteByte(',')
			}
			if strings.ContainsAny(c, ",\"\n") {
				c = `"` + strings.ReplaceAll(c, `"`, `""`) + `"`
			}
			b.WriteString(c)
		}
		b.WriteByte('\n')
	}
	line(r.Header)
	for _, row := range r.Rows {
		line(row)
	}
	return []byte(b.String())
}

// Summary renders the headline metrics and notes as text.
func (r Result) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n", r.Name, r.Description)
	for _, m := range r.Metrics {
		fmt.Fprintf(&b, "  %-44s %12s %s", m.Name, f3(m.Value), m.Unit)
		if m.Paper != 0 {
			ok := "ok"
			if !m.Within() {
				ok = "OUT OF TOLERANCE"
			}
			fmt.Fprintf(&b, "   (paper %s, tolerance ±%g%%: %s)", f3(m.Paper), m.Tolerance*100, ok)
		}
		b.WriteByte('\n')
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	return b.String()
}

// Metric returns the named metric.
func (r Result) Metric(name string) (Metric, bool) {
	for _, m := range r.Metrics {
		if m.Name == name {
			return m, true
		}
	}
	return Metric{}, false
}

func f3(v float64) string {
	if v != 0 && (math.Abs(v) >= 1e6 || math.Abs(v) < 1e-3) {
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}

func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
func itoa(v int) string     { return strconv.Itoa(v) }
