package main

import (
	"encoding/xml"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/svgtext"
)

// TestParetoSVGFitsLabels checks that the labels of front points at the
// right edge stay on the canvas, that the legend names both colours and
// that the axes carry units.
func TestParetoSVGFitsLabels(t *testing.T) {
	svg := paretoSVG([]svgPoint{{"b1-d0s-w1", 1000, 50, true}, {"b64-d500us-w4", 90000, 400, true}, {"b8 <x>", 2000, 900, false}})
	var doc struct {
		Width float64 `xml:"width,attr"`
		Texts []struct {
			X      float64 `xml:"x,attr"`
			Anchor string  `xml:"text-anchor,attr"`
			Rotate string  `xml:"transform,attr"`
			Size   string  `xml:"font-size,attr"`
			Body   string  `xml:",chardata"`
		} `xml:"text"`
	}
	if err := xml.Unmarshal([]byte(svg), &doc); err != nil {
		t.Fatalf("svg does not parse: %v\n%s", err, svg)
	}
	var all []string
	for _, tx := range doc.Texts {
		all = append(all, tx.Body)
		if tx.Rotate != "" {
			continue // the y title, rotated along the left edge
		}
		size := 12.0
		if tx.Size == "10" {
			size = 10
		} else if tx.Size == "15" {
			size = 15
		}
		w := svgtext.Width(tx.Body, size)
		lo, hi := tx.X, tx.X+w
		switch tx.Anchor {
		case "middle":
			lo, hi = tx.X-w/2, tx.X+w/2
		case "end":
			lo, hi = tx.X-w, tx.X
		}
		if lo < 0 || hi > doc.Width {
			t.Errorf("label %q spans x %.0f..%.0f, outside 0..%.0f", tx.Body, lo, hi, doc.Width)
		}
	}
	joined := strings.Join(all, "|")
	for _, want := range []string{"Pareto front", "other configurations", "throughput (queries/s)", "p99 latency (µs, log scale)", "b64-d500us-w4"} {
		if !strings.Contains(joined, want) {
			t.Errorf("no label %q in %s", want, joined)
		}
	}
}
