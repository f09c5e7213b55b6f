package sim

import (
	"encoding/xml"
	"strings"
	"testing"
	"unicode/utf8"
)

// checkAligned fails unless the metrics of a summary form a table: a
// header, then one row per metric whose value column ends, and whose
// verdict column starts, where the header's do; lines under a row (its
// figure's source, its sensitivities) are indented to the metric column.
func checkAligned(t *testing.T, name, summary string, metrics int) {
	t.Helper()
	lines := strings.Split(summary, "\n")
	h := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "  KIND ") {
			h = i
			break
		}
	}
	if h < 0 {
		t.Errorf("%s: summary has no table header:\n%s", name, summary)
		return
	}
	col := func(word string) int { return utf8.RuneCountInString(lines[h][:strings.Index(lines[h], word)]) }
	metric, valueEnd, verdict := col("METRIC"), col("VALUE")+len("VALUE"), col("VERDICT")
	rows := 0
	for _, l := range lines[h+1:] {
		r := []rune(l)
		switch {
		case strings.HasPrefix(l, "  ["):
			rows++
			if len(r) <= verdict || r[metric-1] != ' ' || r[metric] == ' ' || r[valueEnd-1] == ' ' || r[valueEnd] != ' ' ||
				r[verdict-1] != ' ' || r[verdict-2] != ' ' || r[verdict] == ' ' {
				t.Errorf("%s: row out of its columns (metric at %d, value ending at %d, verdict at %d):\n%s\n%s", name, metric, valueEnd, verdict, lines[h], l)
			}
		case strings.HasPrefix(l, "  "+strings.Repeat(" ", metric-2)):
			if len(r) <= metric || r[metric] == ' ' {
				t.Errorf("%s: line under a row not at the metric column:\n%s", name, l)
			}
		}
	}
	if rows != metrics {
		t.Errorf("%s: %d table rows for %d metrics:\n%s", name, rows, metrics, summary)
	}
}

// TestSummaryAligned: metric names longer than any fixed width, values of
// every width, units or none, figures or none, a pending figure and
// sensitivities still make a table whose columns line up, and a compared
// figure is named with its paper's authors and title.
func TestSummaryAligned(t *testing.T) {
	r := Result{Name: "example", Description: "a test", Paper: "call", Metrics: []Metric{
		{Name: "short", Value: 1, Unit: "x", Kind: Prediction},
		{Name: "makespan slowdown Rialto placement, deadline 1.5x alone", Value: 1.402, Unit: "x", Kind: Prediction},
		{Name: "a name far longer than any column a fixed format would leave for it (1 = yes)", Value: 1, Kind: Prediction, Figure: "call/fig8-b-fastest"},
		{Name: "big", Value: 12345.678, Unit: "instances", Kind: Prediction, Figure: "call/fig6-3dev", Miss: "explained",
			Sensitivity: []Sensitivity{{Input: "α", Nominal: 0.48, Lo: 0.5, Hi: 2}}},
		{Name: "tiny", Value: 4.7e7, Unit: "q/s", Kind: Fit, Figure: "call/fig6-1dev"},
		{Name: "not yet", Kind: Pending, Figure: "call/fig8-c-dedicated", Note: "needs --real"},
	}}
	if err := check(&r); err != nil {
		t.Fatal(err)
	}
	s := r.Summary()
	t.Log("\n" + s)
	checkAligned(t, r.Name, s, len(r.Metrics))
	for _, id := range []string{"call/fig8-b-fastest", "call/fig6-3dev", "call/fig6-1dev", "call/fig8-c-dedicated"} {
		f, _ := FigureByID(id)
		if want := "figure: " + f.Where + " of " + Papers["call"].Cite; !strings.Contains(s, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	noShortCite(t, "summary", s)
}

// checkCited fails unless a result names its paper by authors and title
// everywhere: description, the source of every figure it compares, the
// plot's caption and the table rows; and never by a short form.
func checkCited(t *testing.T, r Result) {
	t.Helper()
	s := r.Summary()
	noShortCite(t, r.Name+" summary", s)
	noShortCite(t, r.Name+" table", Markdown(TableRows(r)))
	for _, m := range r.Metrics {
		if f, ok := FigureByID(m.Figure); ok && !strings.Contains(s, "figure: "+f.Source()) {
			t.Errorf("%s: summary lacks the source of %s (%s)", r.Name, m.Figure, f.Source())
		}
	}
	var doc struct {
		Texts []string `xml:"text"`
	}
	if err := xml.Unmarshal(r.Plot.SVG(), &doc); err != nil {
		t.Fatalf("%s: %v", r.Name, err)
	}
	texts := strings.Join(doc.Texts, " ")
	noShortCite(t, r.Name+" plot", texts)
	if r.Paper != "" && !strings.Contains(texts, Papers[r.Paper].Cite) {
		t.Errorf("%s: plot does not name %s: %q", r.Name, Papers[r.Paper].Cite, texts)
	}
}
