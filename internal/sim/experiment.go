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
	"unicode/utf8"
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
	// Sensitivity makes every genuine prediction report how far its inputs
	// may move before its conclusion changes (it reruns the model many
	// times).
	Sensitivity bool
	// ScaleSpec sizes the scale experiment (zero fields: DefaultScale's).
	ScaleSpec ScaleSpec
}

func (o Options) scale() float64 {
	if o.Scale <= 0 {
		return 1
	}
	return o.Scale
}

// Metric is one figure an experiment reports, tagged Fit or Prediction
// (see Kind). Figure names the paper figure it is compared with (an ID of
// Figures; "" when the paper gives none); Run fills Paper and Tolerance from
// it. Miss explains a prediction known to miss its figure: the miss is
// reported, not tuned away, and the tests require it to keep missing (so an
// explanation cannot outlive its miss). Sensitivity says, for a prediction,
// how far each input may move before its conclusion changes (filled when
// Options.Sensitivity is set). Real is the same figure measured on Rialto's
// own code (package lab), nil when not measured.
type Metric struct {
	Name        string
	Value       float64
	Unit        string
	Kind        Kind
	Figure      string
	Paper       float64
	Tolerance   float64
	Miss        string
	Note        string
	Sensitivity []Sensitivity
	Real        *Real
}

// Result is what one experiment produced: a table (written as CSV), a plot
// (written as SVG), headline metrics and notes.
type Result struct {
	Name        string
	Description string
	// Paper is the key (of Papers) of the paper the experiment follows or
	// is after (Run sets it from the registry), "" for Rialto's own
	// findings.
	Paper string
	// Calibrations names the calibrated constants the run used.
	Calibrations []string
	Header       []string
	Rows         [][]string
	Plot         Plot
	Metrics      []Metric
	Notes        []string
	// Events is the number of simulation events the run executed.
	Events uint64
}

// ExperimentInfo names and describes an experiment. The description opens
// with what the experiment follows, its paper named by authors and title:
// `Fig. 8 of Call et al., "Disaggregating …": …` for an experiment that
// reproduces a paper's figures, `Rialto's own, after Fig. 18 of Dong et al.,
// "Venice: …": …` for Rialto's own scenario after one, `Rialto's own: …`
// for Rialto's own findings.
type ExperimentInfo struct {
	Name        string
	Description string
	// Paper is the key (of Papers) of the paper the experiment follows or
	// is after, "" for Rialto's own findings.
	Paper string
	// Source is the description's opening: what of which paper the
	// experiment follows (Paper.Source), "Rialto's own, after " it, or
	// "Rialto's own".
	Source string
}

type experiment struct {
	ExperimentInfo
	run func(ctx context.Context, o Options) (Result, error)
}

var registry []experiment

// origin is what an experiment follows: where in a paper (follows), where
// in a paper Rialto's own scenario is after (after), or nothing (own).
type origin struct {
	paper, where string
	after        bool
}

func follows(paper, where string) origin { return origin{paper: paper, where: where} }
func after(paper, where string) origin   { return origin{paper: paper, where: where, after: true} }

var own = origin{}

func (o origin) source() string {
	switch {
	case o.paper == "":
		return "Rialto's own"
	case o.after:
		return "Rialto's own, after " + Papers[o.paper].Source(o.where)
	default:
		return Papers[o.paper].Source(o.where)
	}
}

func register(name string, from origin, desc string, run func(context.Context, Options) (Result, error)) {
	if _, ok := Papers[from.paper]; from.paper != "" && !ok {
		panic("sim: experiment " + name + " follows unknown paper " + from.paper)
	}
	src := from.source()
	registry = append(registry, experiment{ExperimentInfo{Name: name, Description: src + ": " + desc, Paper: from.paper, Source: src}, run})
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
			r.Name, r.Description, r.Paper = e.Name, e.Description, e.Paper
			if r.Plot.Source == "" && e.Paper != "" {
				r.Plot.Source = e.Source
			}
			if err := check(&r); err != nil {
				return Result{}, err
			}
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

// Summary renders the result as text: the description, then the metrics
// as a table whose columns line up whatever their lengths (kind: fit,
// prediction or pending; metric; value and unit; the paper's value and its
// tolerance; verdict, with a miss's explanation, the real counterpart and
// the note). Under a metric compared with a paper figure comes the figure's
// source (where it is in which paper, by authors and title), then the
// prediction's sensitivities. The calibrated constants and the notes close
// it.
func (r Result) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n", r.Name, r.Description)
	type row struct {
		cells   [5]string // kind, metric, value, unit, paper; the verdict follows
		verdict string
		under   []string
	}
	rows := []row{{cells: [5]string{"KIND", "METRIC", "VALUE", "UNIT", "PAPER"}, verdict: "VERDICT"}}
	for _, m := range r.Metrics {
		w := row{cells: [5]string{"[" + string(m.Kind) + "]", m.Name, f3(m.Value), m.Unit, "—"}}
		if m.Kind == Pending {
			w.cells[2] = "—"
		}
		var v strings.Builder
		v.WriteString(m.Verdict())
		if f, ok := figureIndex[m.Figure]; ok {
			w.cells[4] = f3(m.Paper)
			if m.Tolerance > 0 {
				w.cells[4] += fmt.Sprintf(" ±%g%%", m.Tolerance*100)
			}
			w.under = append(w.under, "figure: "+f.Source())
		}
		if m.Miss != "" {
			fmt.Fprintf(&v, ": %s", m.Miss)
		}
		if m.Real != nil {
			fmt.Fprintf(&v, " (real: %s", strings.TrimSpace(f3(m.Real.Value)+" "+m.Unit))
			if m.Real.Sim != 0 {
				fmt.Fprintf(&v, "; the model fed the lab's characterization: %s", f3(m.Real.Sim))
			}
			if m.Real.Note != "" {
				fmt.Fprintf(&v, "; %s", m.Real.Note)
			}
			v.WriteString(")")
		}
		if m.Note != "" {
			fmt.Fprintf(&v, " — %s", m.Note)
		}
		w.verdict = v.String()
		for _, s := range m.Sensitivity {
			w.under = append(w.under, "holds while "+s.String())
		}
		rows = append(rows, w)
	}
	if len(r.Metrics) > 0 {
		var width [5]int
		for _, w := range rows {
			for i, c := range w.cells {
				width[i] = max(width[i], utf8.RuneCountInString(c))
			}
		}
		pad := func(s string, n int) string { return strings.Repeat(" ", n-utf8.RuneCountInString(s)) }
		for _, w := range rows {
			c := w.cells
			b.WriteString("  ")
			b.WriteString(c[0] + pad(c[0], width[0]) + "  ")
			b.WriteString(c[1] + pad(c[1], width[1]) + "  ")
			b.WriteString(pad(c[2], width[2]) + c[2] + " ") // numbers right-aligned
			b.WriteString(c[3] + pad(c[3], width[3]) + "  ")
			b.WriteString(c[4] + pad(c[4], width[4]) + "  ")
			b.WriteString(w.verdict + "\n")
			for _, u := range w.under {
				b.WriteString("  " + pad("", width[0]) + "  " + u + "\n")
			}
		}
	}
	if len(r.Calibrations) > 0 {
		fmt.Fprintf(&b, "  calibrated constants: %s\n", strings.Join(r.Calibrations, ", "))
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
