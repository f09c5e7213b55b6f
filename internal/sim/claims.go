package sim

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Kind says what a figure an experiment reports is evidence of.
type Kind string

const (
	// Fit is an input, or a figure the inputs were tuned to: reproducing it
	// proves nothing about the model.
	Fit Kind = "fit"
	// Prediction is a figure no input was tuned to: it can hit or miss.
	Prediction Kind = "prediction"
	// Pending is a figure Rialto cannot produce yet (it names what is
	// missing); it has no value.
	Pending Kind = "pending"
)

// Paper is one of the source papers, as product text cites it: always by
// its authors and title (Cite), never by a short name or a number.
type Paper struct {
	Key  string
	Cite string // authors and title: Call et al., "Disaggregating …"
}

// Source names a part of the paper (a figure, a table, a section: "Fig.
// 8", "§4.2, Fig. 10") with the paper's authors and title, the form every
// figure source in the simulator's output takes: `Fig. 8 of Call et al.,
// "Disaggregating …"`.
func (p Paper) Source(where string) string {
	if where == "" {
		return p.Cite
	}
	return where + " of " + p.Cite
}

// Papers are the papers the simulator reproduces figures from, by key.
var Papers = map[string]Paper{
	"call":    {"call", `Call et al., "Disaggregating Non-Volatile Memory for Throughput-Oriented Genomics Workloads"`},
	"venice":  {"venice", `Dong et al., "Venice: Exploring Server Architectures for Effective Resource Sharing"`},
	"erbium":  {"erbium", `Maschi and Alonso, "The Difficult Balance Between Modern Hardware and Conventional CPUs"`},
	"lending": {"lending", `Markussen et al., "Flexible device compositions and dynamic resource sharing in PCIe interconnected clusters using Device Lending"`},
	"fpga":    {"fpga", `Weerasinghe et al., "Disaggregated FPGAs: Network Performance Comparison against Bare-Metal Servers, Virtual Machines and Linux Containers"`},
}

// Source is where the figure is in its paper, with the paper's authors and
// title (Paper.Source).
func (f Figure) Source() string { return Papers[f.Paper].Source(f.Where) }

// Figure is a number (or a yes/no finding, as 1) a paper reports, with the
// precision the paper states it to: Tolerance is relative (0.1 for ±10%; 0
// for an exact count or a yes/no finding).
type Figure struct {
	ID        string
	Paper     string // key of Papers
	Where     string // "Fig. 6", "§4.2"
	Claim     string // what the paper says, in brief
	Value     float64
	Unit      string
	Tolerance float64
}

// Calibration is a set of model constants and the paper figures they were
// copied from or tuned to. Every figure a calibration names is a fit
// wherever it is compared: Run refuses a prediction against it.
type Calibration struct {
	Name    string   // the Go name of the constants (DefaultRedis, …)
	What    string   // what was set, and how
	Figures []string // IDs of Figures
}

// ErrFitAsPrediction is returned by Run when an experiment reports a figure
// its inputs were tuned to as a prediction (or an untuned one as a fit).
var ErrFitAsPrediction = errors.New("sim: a fitted figure reported as a prediction")

// fig0 returns a registered figure's tolerance.
func fig0(id string) float64 { return figureIndex[id].Tolerance }

// FigureByID returns the registered figure.
func FigureByID(id string) (Figure, bool) {
	f, ok := figureIndex[id]
	return f, ok
}

// fig returns a registered figure's value; it panics on an unknown ID (a
// programming error caught by every test that runs the experiments).
func fig(id string) float64 {
	f, ok := figureIndex[id]
	if !ok {
		panic("sim: unknown figure " + id)
	}
	return f.Value
}

var figureIndex = func() map[string]Figure {
	m := map[string]Figure{}
	for _, f := range Figures {
		if _, dup := m[f.ID]; dup {
			panic("sim: duplicate figure " + f.ID)
		}
		m[f.ID] = f
	}
	return m
}()

// Fitted reports the calibrations that use the figure (none: it is free to
// be predicted).
func Fitted(figure string) []string {
	var out []string
	for _, c := range Calibrations {
		for _, id := range c.Figures {
			if id == figure {
				out = append(out, c.Name)
			}
		}
	}
	return out
}

// Sensitivity says how far one input of a prediction may move, as a factor
// of its nominal value, before the prediction's conclusion (a threshold, a
// choice, a hit or a miss) changes. The search stops at ×SensitivityRange
// either way; Lo/HiOpen say the conclusion still held there.
type Sensitivity struct {
	Input          string
	Nominal        float64
	Lo, Hi         float64
	LoOpen, HiOpen bool
}

// SensitivityRange bounds the search: inputs are moved down to
// 1/SensitivityRange and up to SensitivityRange times their value.
const SensitivityRange = 10

// Span is how far the input may move: the smaller of Hi and 1/Lo (a
// conclusion that flips at ×1.5 or at ÷1.5 has span 1.5).
func (s Sensitivity) Span() float64 {
	return math.Min(s.Hi, 1/s.Lo)
}

func (s Sensitivity) String() string {
	lo, hi := "×"+strconv.FormatFloat(s.Lo, 'f', 2, 64), "×"+strconv.FormatFloat(s.Hi, 'f', 2, 64)
	if s.LoOpen {
		lo = "≤×" + strconv.FormatFloat(1.0/SensitivityRange, 'f', 1, 64)
	}
	if s.HiOpen {
		hi = "≥×" + strconv.Itoa(SensitivityRange)
	}
	return s.Input + " " + lo + "–" + hi
}

// sensitize finds how far one input may move before outcome changes:
// outcome(f) is the conclusion with the input at f times its nominal value.
// It walks a grid outward from 1 and bisects (on a log scale) between the
// last factor that kept the conclusion and the first that changed it, so a
// conclusion that flips and flips back between grid points is not seen.
func sensitize(input string, nominal float64, outcome func(f float64) string) Sensitivity {
	base := outcome(1)
	grid := []float64{1.05, 1.1, 1.25, 1.5, 2, 3, 5, SensitivityRange}
	side := func(up bool) (float64, bool) {
		at := func(g float64) float64 {
			if up {
				return g
			}
			return 1 / g
		}
		ok := 1.0
		for _, g := range grid {
			if outcome(at(g)) == base {
				ok = g
				continue
			}
			bad := g
			for i := 0; i < 6; i++ {
				mid := math.Sqrt(ok * bad)
				if outcome(at(mid)) == base {
					ok = mid
				} else {
					bad = mid
				}
			}
			return at(ok), false
		}
		return at(ok), true
	}
	s := Sensitivity{Input: input, Nominal: nominal}
	s.Hi, s.HiOpen = side(true)
	s.Lo, s.LoOpen = side(false)
	return s
}

// Tightest is the sensitivity whose input may move least.
func Tightest(ss []Sensitivity) (Sensitivity, bool) {
	if len(ss) == 0 {
		return Sensitivity{}, false
	}
	best := ss[0]
	for _, s := range ss[1:] {
		if s.Span() < best.Span() {
			best = s
		}
	}
	return best, true
}

// Real is a figure measured on Rialto's own code for the same scenario
// (package lab). Tolerance is the relative difference from the simulator's
// value the comparison allows. Sim, when not zero, is the simulator's value
// for the scenario as it ran: the same model fed with what the lab
// characterized of its parts (a relay's actual latency, which a loaded
// machine's timers stretch beyond the nominal one; a device's profile as
// `rialto characterize` measures it); the comparison is then with it rather
// than with the metric's nominal Value. Void, when set, says why the run
// compares nothing (the machine's CPU, not the link the scenario shapes,
// bounded it): the figure is shown, but the verdict reports no agreement
// or difference and the tally does not count it.
type Real struct {
	Value     float64
	Sim       float64
	Tolerance float64
	Note      string
	Void      string
}

// Hit reports whether the value is within the paper figure's tolerance.
func (m Metric) Hit() bool {
	if m.Figure == "" || m.Kind == Pending {
		return false
	}
	return math.Abs(m.Value-m.Paper) <= m.Tolerance*math.Abs(m.Paper)+1e-12*math.Abs(m.Paper)
}

// Within reports whether the value is within the tolerance of the paper's
// figure (true when there is no figure to compare with).
func (m Metric) Within() bool {
	if m.Figure == "" || m.Kind == Pending {
		return true
	}
	return m.Hit()
}

// RealError is |sim − real| / real (NaN without a real counterpart), sim
// being Real.Sim when set, else the metric's Value.
func (m Metric) RealError() float64 {
	if m.Real == nil || m.Real.Value == 0 {
		return math.NaN()
	}
	v := m.Value
	if m.Real.Sim != 0 {
		v = m.Real.Sim
	}
	return math.Abs(v-m.Real.Value) / math.Abs(m.Real.Value)
}

// Verdict is the metric's standing in one phrase: a fit reproduced or not,
// a prediction's hit or miss against the paper, and its agreement with the
// real counterpart when one was measured.
func (m Metric) Verdict() string {
	var v string
	switch {
	case m.Kind == Pending:
		return "pending"
	case m.Kind == Fit && m.Hit():
		v = "fit (reproduced)"
	case m.Kind == Fit:
		v = "fit, not reproduced (" + pct(m.Value, m.Paper) + ")"
	case m.Figure == "":
		v = "no paper figure"
	case m.Hit():
		v = "hit"
	case m.Miss != "":
		v = "miss (" + pct(m.Value, m.Paper) + "), explained"
	default:
		v = "miss (" + pct(m.Value, m.Paper) + ")"
	}
	if m.Real != nil && m.Real.Void != "" {
		return v + "; real not compared: " + m.Real.Void
	}
	if m.Real != nil {
		e := m.RealError()
		w := "within"
		if !(e <= m.Real.Tolerance) {
			w = "off by"
		}
		v += fmt.Sprintf("; real %s %.1f%%", w, 100*e)
		if m.Real.Sim != 0 {
			v += " of the model fed the lab's characterization"
		}
	}
	return v
}

func pct(v, paper float64) string {
	if paper == 0 {
		return "paper 0"
	}
	return fmt.Sprintf("%+.0f%%", 100*(v-paper)/math.Abs(paper))
}

// check enforces the tagging rules on an experiment's result: every metric
// is tagged; a metric compared with a paper figure is a fit exactly when a
// calibration used that figure; a fit names the figure it reproduces; an
// explained miss is a prediction that misses; and the calibrations the
// result names exist. It fills Paper and Tolerance from the figures.
func check(r *Result) error {
	cals := map[string]bool{}
	for _, c := range Calibrations {
		cals[c.Name] = true
	}
	for _, c := range r.Calibrations {
		if !cals[c] {
			return fmt.Errorf("sim: %s names unknown calibration %q", r.Name, c)
		}
	}
	for i := range r.Metrics {
		m := &r.Metrics[i]
		switch m.Kind {
		case Fit, Prediction, Pending:
		default:
			return fmt.Errorf("sim: %s: metric %q has no kind (fit, prediction or pending)", r.Name, m.Name)
		}
		if m.Figure == "" {
			if m.Kind == Fit {
				return fmt.Errorf("%w: %s: metric %q is a fit but names no figure it was tuned to", ErrFitAsPrediction, r.Name, m.Name)
			}
			if m.Miss != "" {
				return fmt.Errorf("sim: %s: metric %q explains a miss but has no figure", r.Name, m.Name)
			}
			continue
		}
		f, ok := figureIndex[m.Figure]
		if !ok {
			return fmt.Errorf("sim: %s: metric %q names unknown figure %q", r.Name, m.Name, m.Figure)
		}
		m.Paper, m.Tolerance = f.Value, f.Tolerance
		fitted := Fitted(m.Figure)
		switch {
		case m.Kind == Prediction && len(fitted) > 0:
			return fmt.Errorf("%w: %s: %q is compared with %s, which %s was fitted to", ErrFitAsPrediction, r.Name, m.Name, m.Figure, strings.Join(fitted, ", "))
		case m.Kind == Fit && len(fitted) == 0:
			return fmt.Errorf("%w: %s: %q is tagged fit but no calibration uses %s", ErrFitAsPrediction, r.Name, m.Name, m.Figure)
		case m.Miss != "" && (m.Kind != Prediction || m.Hit()):
			return fmt.Errorf("sim: %s: %q has a miss explanation but is not a missed prediction", r.Name, m.Name)
		}
	}
	return nil
}

// Row is one line of the fit/prediction table (docs/simulator.md).
type Row struct {
	Experiment string
	Paper      string // the paper's authors and title, "—" for Rialto's own findings
	Where      string // the paper's figure or section
	Metric     Metric
}

// TableRows lists an experiment's metrics as table rows.
func TableRows(r Result) []Row {
	var out []Row
	for _, m := range r.Metrics {
		row := Row{Experiment: r.Name, Paper: "—", Where: "—", Metric: m}
		if f, ok := figureIndex[m.Figure]; ok {
			row.Paper, row.Where = Papers[f.Paper].Cite, f.Where
		} else if r.Paper != "" {
			row.Paper = Papers[r.Paper].Cite
		}
		out = append(out, row)
	}
	return out
}

// Markdown renders rows as the table of docs/simulator.md: paper, figure,
// paper value, Rialto value, fit or prediction, real counterpart, verdict,
// and how far the inputs may move.
func Markdown(rows []Row) string {
	var b strings.Builder
	b.WriteString("| experiment | paper | figure | paper value | Rialto value | fit or prediction | real counterpart | verdict | holds while |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	cell := func(s string) string { return strings.ReplaceAll(s, "|", "\\|") }
	for _, r := range rows {
		m := r.Metric
		paper := "—"
		if f, ok := figureIndex[m.Figure]; ok {
			paper = f.Claim
			if f.Tolerance > 0 {
				paper += fmt.Sprintf(" (±%g%%)", 100*f.Tolerance)
			}
		}
		val := f3(m.Value) + " " + m.Unit
		if m.Kind == Pending {
			val = "—"
		}
		real := "—"
		if m.Real != nil {
			real = strings.TrimSpace(f3(m.Real.Value) + " " + m.Unit)
			if m.Real.Sim != 0 {
				real += "; the model fed the lab's characterization: " + f3(m.Real.Sim)
			}
			if m.Real.Note != "" {
				real += " (" + m.Real.Note + ")"
			}
		}
		sens := "—"
		if s, ok := Tightest(m.Sensitivity); ok {
			sens = s.String()
			if len(m.Sensitivity) > 1 {
				sens += fmt.Sprintf(" (tightest of %d inputs)", len(m.Sensitivity))
			}
		}
		verdict := m.Verdict()
		if m.Miss != "" {
			verdict += ": " + m.Miss
		}
		if m.Note != "" {
			verdict += " — " + m.Note
		}
		fmt.Fprintf(&b, "| %s | %s | %s: %s | %s | %s | %s | %s | %s | %s |\n", r.Experiment, cell(r.Paper), cell(r.Where), cell(m.Name),
			cell(paper), cell(strings.TrimSpace(val)), m.Kind, cell(real), cell(verdict), cell(sens))
	}
	return b.String()
}

// Counts tallies rows by kind and verdict.
func Counts(rows []Row) map[string]int {
	c := map[string]int{}
	for _, r := range rows {
		m := r.Metric
		c[string(m.Kind)]++
		if m.Kind == Prediction && m.Figure != "" {
			if m.Hit() {
				c["hit"]++
			} else {
				c["miss"]++
			}
		}
		switch {
		case m.Real != nil && m.Real.Void != "":
			c["real-void"]++
		case m.Real != nil:
			c["real"]++
		}
	}
	return c
}
