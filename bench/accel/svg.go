package main

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"sort"
	"strings"

	"github.com/rialto-project/rialto/internal/svgtext"
)

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

type svgPoint struct {
	label  string
	x, y   float64 // queries/s, p99 µs
	pareto bool
}

const paretoTitle = "Gateway sweep: p99 latency vs throughput (MCT, 64 clients)"

// paretoSVG draws p99 latency (log scale) against throughput, with the
// Pareto front joined by a line and a legend for the two colours. Labels of
// front points near the right edge go to the point's left, so every label
// stays on the canvas. Hand-written SVG, no dependencies.
func paretoSVG(pts []svgPoint) string {
	const W, H, L, R, T, B = 760.0, 480.0, 80.0, 30.0, 60.0, 60.0
	maxX, minY, maxY := 0.0, math.Inf(1), 0.0
	for _, p := range pts {
		maxX = math.Max(maxX, p.x)
		if p.y > 0 {
			minY, maxY = math.Min(minY, p.y), math.Max(maxY, p.y)
		}
	}
	if maxX == 0 || maxY == 0 {
		return `<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>`
	}
	maxX *= 1.05
	ly0, ly1 := math.Floor(math.Log10(minY)), math.Ceil(math.Log10(maxY))
	if ly1 == ly0 {
		ly1++
	}
	px := func(x float64) float64 { return L + (W-L-R)*x/maxX }
	py := func(y float64) float64 { return H - B - (H-T-B)*(math.Log10(y)-ly0)/(ly1-ly0) }
	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12" role="img">`+"\n", W, H, W, H)
	fmt.Fprintf(&s, "<title>%s</title>\n", paretoTitle)
	fmt.Fprintf(&s, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&s, `<text x="%.0f" y="24" font-size="15" text-anchor="middle">%s</text>`+"\n", W/2, paretoTitle)
	// Legend, above the plot area on the right.
	lx := W - R - svgtext.Width("Pareto front", 12) - 18 - svgtext.Width("other configurations", 12) - 36
	fmt.Fprintf(&s, `<rect x="%.0f" y="39" width="10" height="10" fill="#d62728"/><text x="%.0f" y="48">Pareto front</text>`+"\n", lx-5, lx+10)
	lx += 10 + svgtext.Width("Pareto front", 12) + 26
	fmt.Fprintf(&s, `<rect x="%.0f" y="39" width="10" height="10" fill="#1f77b4"/><text x="%.0f" y="48">other configurations</text>`+"\n", lx-5, lx+10)
	// Axes and grid.
	fmt.Fprintf(&s, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", L, H-B, W-R, H-B)
	fmt.Fprintf(&s, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", L, T, L, H-B)
	step := niceStep(maxX / 6)
	for x := 0.0; x <= maxX; x += step {
		fmt.Fprintf(&s, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`, px(x), T, px(x), H-B)
		fmt.Fprintf(&s, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", px(x), H-B+16, kfmt(x))
	}
	for e := ly0; e <= ly1; e++ {
		y := math.Pow(10, e)
		fmt.Fprintf(&s, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`, L, py(y), W-R, py(y))
		fmt.Fprintf(&s, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", L-6, py(y)+4, kfmt(y))
	}
	fmt.Fprintf(&s, `<text x="%.0f" y="%.0f" text-anchor="middle">throughput (queries/s)</text>`+"\n", (L+W-R)/2, H-18)
	fmt.Fprintf(&s, `<text transform="translate(18 %.0f) rotate(-90)" text-anchor="middle">p99 latency (µs, log scale)</text>`+"\n", (T+H-B)/2)
	var front []svgPoint
	for _, p := range pts {
		if p.pareto {
			front = append(front, p)
		}
	}
	sort.Slice(front, func(i, j int) bool { return front[i].x < front[j].x })
	if len(front) > 1 {
		var path []string
		for _, p := range front {
			path = append(path, fmt.Sprintf("%.1f,%.1f", px(p.x), py(p.y)))
		}
		fmt.Fprintf(&s, `<polyline points="%s" fill="none" stroke="#d62728" stroke-width="1.5"/>`+"\n", strings.Join(path, " "))
	}
	for _, p := range pts {
		if p.y <= 0 {
			continue
		}
		color := "#1f77b4"
		if p.pareto {
			color = "#d62728"
		}
		label := html.EscapeString(p.label)
		fmt.Fprintf(&s, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s: %.0f queries/s, p99 %.0f µs</title></circle>`+"\n",
			px(p.x), py(p.y), color, label, p.x, p.y)
		if p.pareto {
			x, anchor := px(p.x)+6, "start"
			if x+svgtext.Width(p.label, 10) > W-4 {
				x, anchor = px(p.x)-6, "end"
			}
			fmt.Fprintf(&s, `<text x="%.1f" y="%.1f" font-size="10" text-anchor="%s">%s</text>`+"\n", x, py(p.y)-6, anchor, label)
		}
	}
	s.WriteString("</svg>\n")
	return s.String()
}

func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= x {
			return m * e
		}
	}
	return 10 * e
}

func kfmt(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", math.Round(v/1e5)/10)
	case v >= 1e3:
		return fmt.Sprintf("%gk", math.Round(v/1e2)/10)
	}
	return fmt.Sprintf("%g", v)
}
