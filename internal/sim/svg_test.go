package sim

import (
	"encoding/xml"
	"strconv"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/svgtext"
)

// svgText is a <text> of a rendered plot.
type svgText struct {
	X         float64 `xml:"x,attr"`
	Y         float64 `xml:"y,attr"`
	Anchor    string  `xml:"text-anchor,attr"`
	Transform string  `xml:"transform,attr"`
	Size      string  `xml:"font-size,attr"`
	Body      string  `xml:",chardata"`
}

type svgDoc struct {
	Width  float64   `xml:"width,attr"`
	Height float64   `xml:"height,attr"`
	Title  string    `xml:"title"`
	Texts  []svgText `xml:"text"`
}

// TestPlotSVGFitsLabels checks that every horizontal label of a plot with
// long legend entries, a long title and crowded categories lies within the
// canvas (by the same generous width estimate the layout uses), and that
// axis titles carry their units.
func TestPlotSVGFitsLabels(t *testing.T) {
	for _, p := range []Plot{
		{Title: "5 SMUFIN instances (Call et al., Fig. 8)", YLabel: "execution time / alone", Categories: []string{"instance 1", "2", "3", "4", "5", "mean"},
			Series: []Series{{Name: "(a) 1 shared device", X: []float64{0, 1}, Y: []float64{2.5, 2.5}},
				{Name: "Rialto placement, deadline 1.5x alone and a much longer name still", X: []float64{0, 1}, Y: []float64{1, 1.1}}}},
		{Title: "ERBIUM latency vs throughput", XLabel: "throughput", XUnit: "queries/s", YLabel: "request time (µs)", LogY: true,
			Series: []Series{{Name: "1p1w1k1e", X: []float64{1e6, 2e7}, Y: []float64{200, 12000}}}},
		{Title: strings.Repeat("A very long title that is wider than the plot area ", 3), YLabel: "fraction",
			Categories: []string{"GPU utilisation", "GPU allocated", "stranded", "deadline misses", "another long category"},
			Series:     []Series{{Name: "whole device", X: []float64{0, 1, 2, 3, 4}, Y: []float64{0.1, 0.2, 0.3, 0.4, 0.5}}}},
	} {
		var doc svgDoc
		if err := xml.Unmarshal(p.SVG(), &doc); err != nil {
			t.Fatalf("%s: %v", p.Title, err)
		}
		if doc.Title != p.Title {
			t.Errorf("%s: <title> %q", p.Title, doc.Title)
		}
		for _, tx := range doc.Texts {
			if tx.Transform != "" {
				continue // the rotated y title and slanted categories are checked below
			}
			size := 12.0
			if tx.Size != "" {
				size, _ = strconv.ParseFloat(tx.Size, 64)
			}
			w := svgtext.Width(tx.Body, size)
			lo, hi := tx.X, tx.X+w
			switch tx.Anchor {
			case "middle":
				lo, hi = tx.X-w/2, tx.X+w/2
			case "end":
				lo, hi = tx.X-w, tx.X
			}
			if lo < 0 || hi > doc.Width || tx.Y > doc.Height {
				t.Errorf("%s: label %q spans x %.0f..%.0f, outside the canvas 0..%.0f", p.Title, tx.Body, lo, hi, doc.Width)
			}
		}
		for _, tx := range doc.Texts {
			if strings.HasPrefix(tx.Transform, "rotate(-30") {
				if reach := tx.X - svgtext.Width(tx.Body, 12)*0.87; reach < 0 {
					t.Errorf("%s: slanted label %q reaches x %.0f", p.Title, tx.Body, reach)
				}
			}
		}
	}
}

func TestAxisTitle(t *testing.T) {
	for _, c := range []struct {
		label, unit string
		log         bool
		want        string
	}{
		{"throughput", "queries/s", false, "throughput (queries/s)"},
		{"request time (µs)", "", true, "request time (µs, log scale)"},
		{"execution time / alone", "", false, "execution time / alone (ratio)"},
		{"bandwidth", "MB/s", true, "bandwidth (MB/s, log scale)"},
		{"concurrent instances", "", false, "concurrent instances"},
		{"", "s", false, ""},
	} {
		if got := axisTitle(c.label, c.unit, c.log); got != c.want {
			t.Errorf("axisTitle(%q, %q, %v) = %q, want %q", c.label, c.unit, c.log, got, c.want)
		}
	}
}

// TestPlotSVGSource: the source caption sits under the title, wraps to the
// canvas instead of widening it, keeps every word, and stays above the plot
// area.
func TestPlotSVGSource(t *testing.T) {
	src := "Table 1 and Fig. 14 of " + Papers["lending"].Cite
	p := Plot{Title: "GPU ping-pong latency", Source: src, YLabel: "round trip (ns)", Categories: []string{"a", "b"},
		Series: []Series{{Name: "model", X: []float64{0, 1}, Y: []float64{1, 2}}}}
	bare := p
	bare.Source = ""
	var with, without struct {
		svgDoc
		Rects []struct {
			Y      float64 `xml:"y,attr"`
			Stroke string  `xml:"stroke,attr"`
		} `xml:"rect"`
	}
	if err := xml.Unmarshal(p.SVG(), &with); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(bare.SVG(), &without); err != nil {
		t.Fatal(err)
	}
	if with.Width != without.Width {
		t.Errorf("the caption widened the canvas from %g to %g", without.Width, with.Width)
	}
	top := 0.0
	for _, r := range with.Rects {
		if r.Stroke == "#333" {
			top = r.Y
		}
	}
	var lines []string
	for _, tx := range with.Texts {
		if tx.Size == "11" {
			lines = append(lines, tx.Body)
			if tx.Y >= top-4 {
				t.Errorf("caption line %q at y %g, the plot area starts at %g", tx.Body, tx.Y, top)
			}
		}
	}
	if len(lines) < 2 || strings.Join(lines, " ") != src {
		t.Errorf("caption %q, want %q wrapped", lines, src)
	}
}
