package ui

import (
	"fmt"
	"html/template"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/rialto-project/rialto/internal/resource"
	"github.com/rialto-project/rialto/internal/svgtext"
)

// Plots are SVG built here, inline in the pages: no script, no external
// file. Every text is escaped; every plot has a title and a description
// for screen readers, and the page shows the same numbers in a table.

func esc(s string) string { return template.HTMLEscapeString(s) }

// niceTicks returns round tick values from 0 to at least hi.
func niceTicks(hi float64) []float64 {
	if hi <= 0 || math.IsNaN(hi) || math.IsInf(hi, 0) {
		hi = 1
	}
	step := math.Pow(10, math.Floor(math.Log10(hi/4)))
	for _, m := range []float64{1, 2, 5, 10} {
		if hi/(step*m) <= 5 {
			step *= m
			break
		}
	}
	var out []float64
	for v := 0.0; v < hi+step*0.999; v += step {
		out = append(out, v)
	}
	return out
}

func fmtTick(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// timePoint is one value at a time.
type timePoint struct {
	At time.Time
	V  float64
}

// timeSeries is one line of a timeChart.
type timeSeries struct {
	Name string
	Pts  []timePoint
}

// timeChart draws lines over the last window up to now: x in seconds
// before now, y in unit (values are divided by scale). id makes the
// title's element ID unique in the page.
func timeChart(id, title, desc, yTitle string, scale float64, now time.Time, window time.Duration, series []timeSeries) string {
	const fs = 12.0
	const pw, ph, T, B = 560.0, 240.0, 34.0, 48.0
	hi := 0.0
	for _, s := range series {
		for _, p := range s.Pts {
			hi = math.Max(hi, p.V/scale)
		}
	}
	ticks := niceTicks(hi)
	top := ticks[len(ticks)-1]
	maxTick := 0.0
	for _, t := range ticks {
		maxTick = math.Max(maxTick, svgtext.Width(fmtTick(t), fs))
	}
	L := 30 + maxTick + 8
	legendW := 0.0
	for _, s := range series {
		legendW = math.Max(legendW, 12+6+svgtext.Width(s.Name, fs))
	}
	legendW += 30
	W := L + pw + legendW
	H := math.Max(T+ph+B, T+10+18*float64(len(series))+10)
	if tw := svgtext.Width(title, 14); tw+20 > W {
		W = tw + 20
	}
	span := window.Seconds()
	px := func(t time.Time) float64 { return L + pw - now.Sub(t).Seconds()/span*pw }
	py := func(v float64) float64 { return T + ph - v/top*ph }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" role="img" aria-labelledby="%s-t %s-d" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" font-family="sans-serif" font-size="%g">`, id, id, W, H, W, H, fs)
	fmt.Fprintf(&b, `<title id="%s-t">%s</title><desc id="%s-d">%s</desc>`, id, esc(title), id, esc(desc))
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="#fff" stroke="#555"/>`, L, T, pw, ph)
	for _, t := range ticks {
		y := py(t)
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.0f" y="%.1f" text-anchor="end" fill="#222">%s</text>`, L, L+pw, y, y, L-6, y+4, fmtTick(t))
	}
	xstep := 60.0
	for _, st := range []float64{10, 15, 30, 60} {
		if span/st <= 8 {
			xstep = st
			break
		}
	}
	for s := 0.0; s <= span+1e-9; s += xstep {
		x := L + pw - s/span*pw
		label := fmt.Sprintf("−%.0fs", s)
		if s == 0 {
			label = "now"
		}
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#eee"/><text x="%.1f" y="%.0f" text-anchor="middle" fill="#222">%s</text>`, x, x, T, T+ph, x, T+ph+16, label)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" fill="#222">time (seconds before now)</text>`, L+pw/2, T+ph+36)
	fmt.Fprintf(&b, `<text transform="translate(16,%.0f) rotate(-90)" text-anchor="middle" fill="#222">%s</text>`, T+ph/2, esc(yTitle))
	fmt.Fprintf(&b, `<text x="%.0f" y="20" font-size="14" font-weight="bold" fill="#111">%s</text>`, L, esc(title))
	for i, s := range series {
		col := svgtext.Color(i)
		var pts []string
		for _, p := range s.Pts {
			if now.Sub(p.At) > window || p.At.After(now) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p.At), py(p.V/scale)))
		}
		if len(pts) == 1 {
			xy := strings.Split(pts[0], ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`, xy[0], xy[1], col)
		} else if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, col, strings.Join(pts, " "))
		}
		ly := T + 10 + 18*float64(i)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/><text x="%.0f" y="%.0f" fill="#222">%s</text>`, L+pw+12, ly, col, L+pw+30, ly+10, esc(s.Name))
	}
	if len(series) == 0 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" fill="#555">no traffic reported yet</text>`, L+pw/2, T+ph/2)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// allocBar is one device of an allocation chart.
type allocBar struct {
	Label                     string
	Capacity, Allocated, Used int64
	HasUsed                   bool
}

// allocChart draws, per device, its capacity (outline), what leases
// hold (filled) and what it actually holds (a narrow dark bar inside).
func allocChart(id, title, desc string, bars []allocBar, format func(int64) string) string {
	const fs = 12.0
	const bw, rowH, T = 360.0, 26.0, 34.0
	labelW := 0.0
	for _, b := range bars {
		labelW = math.Max(labelW, svgtext.Width(b.Label, fs))
	}
	L := labelW + 16
	noteW := 0.0
	notes := make([]string, len(bars))
	for i, b := range bars {
		notes[i] = format(b.Allocated) + " of " + format(b.Capacity) + " leased"
		if b.HasUsed {
			notes[i] += ", " + format(b.Used) + " used"
		}
		noteW = math.Max(noteW, svgtext.Width(notes[i], fs))
	}
	W := L + bw + 12 + noteW + 12
	H := T + rowH*float64(len(bars)) + 40
	if tw := svgtext.Width(title, 14); tw+20 > W {
		W = tw + 20
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" role="img" aria-labelledby="%s-t %s-d" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" font-family="sans-serif" font-size="%g">`, id, id, W, H, W, H, fs)
	fmt.Fprintf(&b, `<title id="%s-t">%s</title><desc id="%s-d">%s</desc>`, id, esc(title), id, esc(desc))
	fmt.Fprintf(&b, `<text x="4" y="20" font-size="14" font-weight="bold" fill="#111">%s</text>`, esc(title))
	for i, d := range bars {
		y := T + rowH*float64(i)
		frac := func(n int64) float64 {
			if d.Capacity <= 0 {
				return 0
			}
			return math.Min(1, float64(n)/float64(d.Capacity))
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="end" fill="#222">%s</text>`, L-8, y+15, esc(d.Label))
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="18" fill="#f2f2f2" stroke="#777"/>`, L, y+2, bw)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.1f" height="18" fill="#8fb8de"/>`, L, y+2, bw*frac(d.Allocated))
		if d.HasUsed {
			fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.1f" height="6" fill="#1b3a5c"/>`, L, y+8, bw*frac(d.Used))
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="#222">%s</text>`, L+bw+12, y+15, esc(notes[i]))
	}
	ly := T + rowH*float64(len(bars)) + 14
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="#8fb8de"/><text x="%.0f" y="%.0f" fill="#222">leased (allocated)</text>`, L, ly, L+18, ly+10)
	for _, d := range bars {
		if d.HasUsed {
			fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="6" fill="#1b3a5c"/><text x="%.0f" y="%.0f" fill="#222">actually used</text>`, L+150, ly+3, L+168, ly+10)
			break
		}
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// graphNode is a vertex of the topology graph.
type graphNode struct {
	ID, Label, State string
	Hub              bool // the control plane
}

// graphEdge joins two vertices; RTT in µs (either direction's, the
// larger), load in bytes/s.
type graphEdge struct {
	A, B    string
	RTT     float64
	Load    float64
	Up      bool
	HasLoad bool
}

// topologyGraph lays the control plane in the middle and the nodes on a
// circle around it; edge width and colour follow load, labels give RTT
// and load.
func topologyGraph(id, title, desc string, nodes []graphNode, edges []graphEdge) string {
	const fs = 12.0
	const R, hubR, nodeR = 190.0, 38.0, 24.0
	pos := map[string][2]float64{}
	var ring []graphNode
	for _, n := range nodes {
		if n.Hub {
			pos[n.ID] = [2]float64{0, 0}
		} else {
			ring = append(ring, n)
		}
	}
	sort.Slice(ring, func(i, j int) bool { return ring[i].Label < ring[j].Label })
	for i, n := range ring {
		a := -math.Pi/2 + 2*math.Pi*float64(i)/float64(max(len(ring), 1))
		pos[n.ID] = [2]float64{R * math.Cos(a), R * math.Sin(a)}
	}
	// The canvas fits the drawing: the circles, and the labels under them.
	minX, maxX, minY, maxY := -hubR, hubR, -hubR, hubR
	for _, n := range ring {
		p := pos[n.ID]
		half := math.Max(nodeR, svgtext.Width(n.Label, fs)/2)
		minX, maxX = math.Min(minX, p[0]-half), math.Max(maxX, p[0]+half)
		minY, maxY = math.Min(minY, p[1]-nodeR), math.Max(maxY, p[1]+nodeR+32)
	}
	const pad, top = 24.0, 34.0
	W := math.Max(maxX-minX+2*pad, svgtext.Width(title, 14)+20)
	H := maxY - minY + top + pad
	ox, oy := pad-minX+(W-(maxX-minX+2*pad))/2, top-minY
	for k, p := range pos {
		pos[k] = [2]float64{p[0] + ox, p[1] + oy}
	}
	maxLoad := 0.0
	for _, e := range edges {
		maxLoad = math.Max(maxLoad, e.Load)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart graph" role="img" aria-labelledby="%s-t %s-d" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" font-family="sans-serif" font-size="%g">`, id, id, W, H, W, H, fs)
	fmt.Fprintf(&b, `<title id="%s-t">%s</title><desc id="%s-d">%s</desc>`, id, esc(title), id, esc(desc))
	fmt.Fprintf(&b, `<text x="8" y="20" font-size="14" font-weight="bold" fill="#111">%s</text>`, esc(title))
	for _, e := range edges {
		pa, okA := pos[e.A]
		pb, okB := pos[e.B]
		if !okA || !okB {
			continue
		}
		width, col := 2.0, "#888"
		if e.Load > 0 && maxLoad > 0 {
			width = 2 + 8*e.Load/maxLoad
			col = "#d9480f"
		}
		dash := ""
		if !e.Up {
			dash = ` stroke-dasharray="6,4"`
			col = "#c00"
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"%s/>`, pa[0], pa[1], pb[0], pb[1], col, width, dash)
		label := rtt(e.RTT)
		if e.HasLoad {
			label += " · " + resource.FormatRate(e.Load)
		}
		if !e.Up {
			label = "down"
		}
		mx, my := (pa[0]+pb[0])/2, (pa[1]+pb[1])/2
		tw := svgtext.Width(label, 11)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="16" rx="3" fill="#fff" fill-opacity="0.92"/><text x="%.1f" y="%.1f" text-anchor="middle" font-size="11" fill="#222">%s</text>`,
			mx-tw/2-3, my-11, tw+6, mx, my+1, esc(label))
	}
	for _, n := range nodes {
		p, ok := pos[n.ID]
		if !ok {
			continue
		}
		if n.Hub {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="%.0f" fill="#1c4e80" stroke="#111"/>`, p[0], p[1], hubR)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#fff" font-weight="bold">control</text><text x="%.1f" y="%.1f" text-anchor="middle" fill="#fff" font-weight="bold">plane</text>`,
				p[0], p[1]-2, p[0], p[1]+12)
			continue
		}
		fill := map[string]string{"ready": "#2f9e44", "suspect": "#e8a200", "down": "#c92a2a"}[n.State]
		if fill == "" {
			fill = "#777"
		}
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="%.0f" fill="%s" stroke="#111"/>`, p[0], p[1], nodeR, fill)
		lw := math.Max(svgtext.Width(n.Label, fs), svgtext.Width(n.State, fs)) + 6
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="30" rx="3" fill="#fff" fill-opacity="0.92"/>`, p[0]-lw/2, p[1]+nodeR+3, lw)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#111" font-weight="bold">%s</text>`, p[0], p[1]+nodeR+15, esc(n.Label))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#222">%s</text>`, p[0], p[1]+nodeR+29, esc(n.State))
	}
	if len(ring) == 0 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" fill="#555">no nodes have joined</text>`, W/2, H-10)
	}
	b.WriteString(`</svg>`)
	return b.String()
}
