package sim

import (
	"context"
	"errors"
	"math"
	"regexp"
	"strings"
	"testing"
)

// TestTagging: a figure a calibration was fitted to cannot be reported as a
// prediction, an untuned figure cannot hide as a fit, every metric carries
// a kind, and an explained miss must be a miss.
func TestTagging(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    Metric
		err  error // nil: accepted
	}{
		{"tuned figure as prediction", Metric{Name: "t70", Value: 11900, Kind: Prediction, Figure: "venice/fig14-70"}, ErrFitAsPrediction},
		{"tuned figure as fit", Metric{Name: "t70", Value: 11900, Kind: Fit, Figure: "venice/fig14-70"}, nil},
		{"input echo as prediction", Metric{Name: "ntb", Value: 350, Kind: Prediction, Figure: "lending/ntb"}, ErrFitAsPrediction},
		{"untuned figure as fit", Metric{Name: "2 devices", Value: 4, Kind: Fit, Figure: "call/fig6-2dev"}, ErrFitAsPrediction},
		{"untuned figure as prediction", Metric{Name: "2 devices", Value: 4, Kind: Prediction, Figure: "call/fig6-2dev"}, nil},
		{"fit without a figure", Metric{Name: "x", Value: 1, Kind: Fit}, ErrFitAsPrediction},
		{"prediction without a figure", Metric{Name: "x", Value: 1, Kind: Prediction}, nil},
		{"no kind", Metric{Name: "x", Value: 1, Figure: "call/fig6-2dev"}, errAny},
		{"unknown figure", Metric{Name: "x", Value: 1, Kind: Prediction, Figure: "call/nope"}, errAny},
		{"explained miss that hits", Metric{Name: "x", Value: 4, Kind: Prediction, Figure: "call/fig6-2dev", Miss: "stale"}, errAny},
		{"explained miss that misses", Metric{Name: "x", Value: 5, Kind: Prediction, Figure: "call/fig6-2dev", Miss: "why"}, nil},
		{"explained miss on a fit", Metric{Name: "x", Value: 2, Kind: Fit, Figure: "call/fig6-1dev", Miss: "why"}, errAny},
	} {
		r := Result{Name: "test", Metrics: []Metric{tc.m}}
		err := check(&r)
		switch {
		case tc.err == nil && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.err == errAny && err == nil, tc.err != nil && tc.err != errAny && !errors.Is(err, tc.err):
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.err)
		}
		if err == nil && tc.m.Figure != "" && r.Metrics[0].Paper != fig(tc.m.Figure) {
			t.Errorf("%s: paper value not filled: %+v", tc.name, r.Metrics[0])
		}
	}
	if err := check(&Result{Name: "test", Calibrations: []string{"NoSuchConstants"}}); err == nil {
		t.Error("unknown calibration accepted")
	}
}

var errAny = errors.New("any error")

// TestRegistry: every calibration names existing figures, every figure an
// existing paper, and every experiment's metrics pass the tagging rules
// (Run would refuse them otherwise).
func TestRegistry(t *testing.T) {
	for _, f := range Figures {
		if _, ok := Papers[f.Paper]; !ok || f.Claim == "" || f.Where == "" {
			t.Errorf("figure %+v", f)
		}
	}
	for _, c := range Calibrations {
		if c.What == "" || len(c.Figures) == 0 {
			t.Errorf("calibration %+v", c)
		}
		for _, id := range c.Figures {
			if _, ok := FigureByID(id); !ok {
				t.Errorf("calibration %s names unknown figure %s", c.Name, id)
			}
		}
	}
	for _, p := range Papers {
		if strings.Contains(strings.ToLower(p.Cite), "seed") {
			t.Errorf("paper %q cited by number", p.Key)
		}
		if !citation.MatchString(p.Cite) {
			t.Errorf("paper %q: %q is not `Authors, \"Title\"`", p.Key, p.Cite)
		}
	}
	// Every experiment's description opens with what it follows: a part of
	// a paper named by authors and title, or Rialto's own (after one).
	for _, x := range Experiments() {
		switch {
		case x.Paper == "" && (x.Source != "Rialto's own" || !strings.HasPrefix(x.Description, "Rialto's own: ")):
			t.Errorf("%s: %q: neither a paper's nor Rialto's own", x.Name, x.Description)
		case x.Paper != "" && (!strings.HasPrefix(x.Description, x.Source+": ") || !strings.HasSuffix(x.Source, " of "+Papers[x.Paper].Cite)):
			t.Errorf("%s: %q does not open with the part of %s it follows", x.Name, x.Description, Papers[x.Paper].Cite)
		}
		noShortCite(t, x.Name+" description", x.Description)
	}
}

// citation is how product text cites a paper: authors, then the title in
// quotes.
var citation = regexp.MustCompile(`^[A-Z][^"]+, "[^"]+"$`)

// authorsAlone matches a paper's authors not followed by its title.
var authorsAlone = regexp.MustCompile(`(Call et al\.|Dong et al\.|Maschi and Alonso|Markussen et al\.|Weerasinghe et al\.)($|[^,]|,$|,[^ ]|, [^"])`)

// noShortCite fails when text names a paper by its authors without its
// title, by a short name ("NVMe-oF genomics"), or by a number.
func noShortCite(t *testing.T, what, text string) {
	t.Helper()
	if m := authorsAlone.FindString(text); m != "" {
		t.Errorf("%s names a paper as %q, without its title:\n%s", what, m, text)
	}
	for _, s := range []string{"NVMe-oF genomics", "seed 00"} {
		if strings.Contains(strings.ToLower(text), strings.ToLower(s)) {
			t.Errorf("%s names a paper as %q:\n%s", what, s, text)
		}
	}
}

// TestSensitivity: the search finds the analytic bounds of the two-device
// threshold (α may move inside the interval that keeps it at 4), and an
// outcome that never changes is open at both ends.
func TestSensitivity(t *testing.T) {
	spec := DefaultSmufin
	dev := CallNVMe
	got := sensitize("α", dev.Alpha, func(f float64) string {
		d := dev
		d.Alpha *= f
		return itoa(sharingThreshold(d, spec, 2, 7))
	})
	lo, hi := alphaFor(dev, spec.Rate, 2, 4)
	if math.Abs(got.Lo*dev.Alpha/lo-1) > 0.03 || math.Abs(got.Hi*dev.Alpha/hi-1) > 0.03 || got.LoOpen || got.HiOpen {
		t.Errorf("sensitivity %+v (%s); analytic α interval (%.4f, %.4f] around %.4f", got, got, lo, hi, dev.Alpha)
	}
	flat := sensitize("x", 1, func(float64) string { return "same" })
	if !flat.LoOpen || !flat.HiOpen || flat.Span() < SensitivityRange*0.99 {
		t.Errorf("flat outcome: %+v", flat)
	}
	// Sensitivities are reported on the experiment's predictions only when
	// asked for, and every prediction with a figure of smufin-sharing gets
	// one per input.
	r, err := Run(context.Background(), "smufin-sharing", Options{Sensitivity: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range r.Metrics {
		if m.Kind == Prediction && m.Figure != "" && len(m.Sensitivity) != len(smufinInputs) {
			t.Errorf("%s: %d sensitivities", m.Name, len(m.Sensitivity))
		}
		if m.Kind == Fit && len(m.Sensitivity) > 0 {
			t.Errorf("%s: a fit has sensitivities", m.Name)
		}
	}
	if s, ok := Tightest(r.Metrics[2].Sensitivity); !ok || !strings.Contains(r.Summary(), "holds while "+s.String()) {
		t.Errorf("summary lacks the sensitivity:\n%s", r.Summary())
	}
}

// TestTable: the table lists every metric with its kind and verdict and
// names papers, never their internal numbers.
func TestTable(t *testing.T) {
	var rows []Row
	for _, name := range []string{"smufin-sharing", "smufin-fig8", "hop-latency", "udp-throughput"} {
		r, err := Run(context.Background(), name, Options{})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, TableRows(r)...)
	}
	// These experiments have no pending figure; one still renders as such.
	// Of two real counterparts, one is compared and one is void (its run
	// bounded by the machine's CPU): its verdict says so, and the tally
	// does not count it as a comparison.
	rows = append(rows, TableRows(Result{Name: "example", Paper: "venice", Metrics: []Metric{
		{Name: "a figure not produced yet", Kind: Pending, Figure: "venice/fig16-nic-256B"},
		{Name: "compared", Value: 1, Kind: Prediction, Real: &Real{Value: 0.9, Tolerance: 0.05}},
		{Name: "void", Value: 1, Kind: Prediction, Real: &Real{Value: 0.5, Tolerance: 0.05, Void: "links busy 60%"}},
	}})...)
	md := Markdown(rows)
	for _, want := range []string{"| smufin-sharing | " + Papers["call"].Cite + " | Fig. 6(b): degradation threshold, 2 devices |", "| prediction |", "| fit |", "| pending |", "miss (-43%), explained",
		"| no paper figure; real off by 11.1% |", "| no paper figure; real not compared: links busy 60% |"} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
	noShortCite(t, "table", md)
	c := Counts(rows)
	if c["fit"] == 0 || c["prediction"] == 0 || c["hit"] == 0 || c["miss"] < 2 || c["pending"] != 1 || c["real"] != 1 || c["real-void"] != 1 {
		t.Errorf("counts %v", c)
	}
}
