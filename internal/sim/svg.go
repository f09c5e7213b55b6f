package sim

import (
	"fmt"
	"math"
	"strings"

	"github.com/rialto-project/rialto/internal/svgtext"
)

// Series is one line (or one set of bars) of a Plot.
type Series struct {
	Name string
	X, Y []float64
}

// Plot is a minimal chart rendered to SVG by hand: lines with markers, or
// grouped bars when Categories is set (then X holds category indices).
type Plot struct {
	Title, XLabel, YLabel string
	// Source is a caption under the title: what of which paper the plot
	// follows, the paper named by authors and title (Run sets it to the
	// experiment's ExperimentInfo.Source). It wraps to the canvas' width.
	Source string
	// XUnit and YUnit name the axes' units; an axis title reads
	// "label (unit)". A label that already ends in a parenthesised unit
	// needs none; a ratio label ("a / b") without one is marked "ratio".
	XUnit, YUnit string
	LogX, LogY   bool
	Categories   []string
	Series       []Series
	// HLines draws horizontal reference lines (e.g. a threshold).
	HLines []float64
}

func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}

// axisTitle is an axis label with its unit and scale: "label (unit, log
// scale)".
func axisTitle(label, unit string, log bool) string {
	if label == "" {
		return ""
	}
	var notes []string
	if unit != "" {
		notes = append(notes, unit)
	} else if !strings.HasSuffix(label, ")") && strings.Contains(label, " / ") {
		notes = append(notes, "ratio")
	}
	if log {
		notes = append(notes, "log scale")
	}
	if len(notes) == 0 {
		return label
	}
	if unit == "" && strings.HasSuffix(label, ")") { // "time (µs)" + log → "time (µs, log scale)"
		return strings.TrimSuffix(label, ")") + ", " + strings.Join(notes, ", ") + ")"
	}
	return label + " (" + strings.Join(notes, ", ") + ")"
}

// SVG renders the plot as a standalone SVG document. The canvas grows to
// fit its labels: the y-axis margin fits the tick labels, the legend on
// the right fits the longest series name, category labels that would
// overlap are slanted, and the title fits the width.
func (p Plot) SVG() []byte {
	const fs, titleFS, captionFS, captionLine = 12.0, 15.0, 11.0, 14.0
	const pw, ph = 470.0, 340.0 // plot area
	T := 40.0                   // plot area's top; a source caption pushes it down
	tx := func(v float64) float64 {
		if p.LogX {
			return math.Log10(math.Max(v, 1e-300))
		}
		return v
	}
	ty := func(v float64) float64 {
		if p.LogY {
			return math.Log10(math.Max(v, 1e-300))
		}
		return v
	}
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		for i := range s.X {
			if i >= len(s.Y) || math.IsNaN(s.Y[i]) || math.IsInf(s.Y[i], 0) {
				continue
			}
			x, y := tx(s.X[i]), ty(s.Y[i])
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			ymin, ymax = math.Min(ymin, y), math.Max(ymax, y)
		}
	}
	for _, h := range p.HLines {
		ymin, ymax = math.Min(ymin, ty(h)), math.Max(ymax, ty(h))
	}
	bars := len(p.Categories) > 0
	if bars {
		xmin, xmax = -0.5, float64(len(p.Categories))-0.5
		if !p.LogY && ymin > 0 {
			ymin = 0
		}
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax, ymin, ymax = 0, 1, 0, 1
	}
	if xmax == xmin {
		xmin, xmax = xmin-1, xmax+1
	}
	if ymax == ymin {
		ymin, ymax = ymin-1, ymax+1
	}
	if !p.LogY && !bars && ymin > 0 && ymin < 0.5*ymax {
		ymin = 0
	}
	pad := (ymax - ymin) * 0.05
	if !(bars && ymin == 0) {
		ymin -= pad
	}
	ymax += pad

	// Layout: measure the labels, then size the margins and the canvas.
	type tick struct {
		at    float64
		label string
	}
	var yticks, xticks []tick
	maxYTick := 0.0
	for _, v := range ticks(ymin, ymax, p.LogY) {
		label := v
		if p.LogY {
			label = math.Pow(10, v)
		}
		t := tick{v, fmtNum(label)}
		yticks = append(yticks, t)
		maxYTick = math.Max(maxYTick, svgtext.Width(t.label, fs))
	}
	if !bars {
		for _, v := range ticks(xmin, xmax, p.LogX) {
			label := v
			if p.LogX {
				label = math.Pow(10, v)
			}
			xticks = append(xticks, tick{v, fmtNum(label)})
		}
	}
	xTitle, yTitle := axisTitle(p.XLabel, p.XUnit, p.LogX), axisTitle(p.YLabel, p.YUnit, p.LogY)
	L := math.Max(60, 30+maxYTick+8) // rotated y title, gap, tick labels
	// Category labels slant when they would overlap their neighbours.
	slant, maxCat := false, 0.0
	for _, c := range p.Categories {
		w := svgtext.Width(c, fs)
		maxCat = math.Max(maxCat, w)
		if w > pw/float64(len(p.Categories))-6 {
			slant = true
		}
	}
	B := 60.0
	if slant {
		B = 44 + maxCat*0.5 + 14 // sin(30°) of the longest label, then the x title
	}
	legendW := 0.0
	for _, s := range p.Series {
		legendW = math.Max(legendW, 12+6+svgtext.Width(s.Name, fs))
	}
	if legendW > 0 {
		legendW += 24 // gap before the legend and margin after it
	} else {
		legendW = 20
	}
	W := L + pw + legendW
	if slant {
		// A slanted label reaches left of its category by cos(30°) of its width.
		if need := maxCat*0.87 + 10 - (L + pw/float64(2*len(p.Categories))); need > 0 {
			L += need
			W += need
		}
	}
	titleX := L + pw/2
	if tw := svgtext.Width(p.Title, titleFS); tw+20 > W {
		W = tw + 20
		titleX = W / 2
	} else if titleX-tw/2 < 10 || titleX+tw/2 > W-10 {
		titleX = W / 2
	}
	if tw := svgtext.Width(xTitle, fs); tw+20 > W {
		W = tw + 20
	}
	caption := wrap(p.Source, captionFS, W-20)
	T += captionLine * float64(len(caption))
	H := T + ph + B
	if lh := T + 10 + 18*float64(len(p.Series)) + 10; lh > H {
		H = lh
	}

	px := func(x float64) float64 { return L + (x-xmin)/(xmax-xmin)*pw }
	py := func(y float64) float64 { return T + ph - (y-ymin)/(ymax-ymin)*ph }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="%g" role="img">`+"\n", W, H, W, H, fs)
	fmt.Fprintf(&b, "<title>%s</title>\n", esc(p.Title))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="%g" text-anchor="middle">%s</text>`+"\n", titleX, titleFS, esc(p.Title))
	for i, c := range caption {
		x := titleX // under the title, unless that would cross the canvas' edge
		if tw := svgtext.Width(c, captionFS); x-tw/2 < 10 || x+tw/2 > W-10 {
			x = W / 2
		}
		fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="%g" text-anchor="middle" fill="#444">%s</text>`+"\n", x, 38+captionLine*float64(i), captionFS, esc(c))
	}
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#333"/>`+"\n", L, T, pw, ph)
	for _, t := range yticks {
		y := py(t.at)
		fmt.Fprintf(&b, `<line x1="%g" x2="%g" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%g" y="%.1f" text-anchor="end">%s</text>`+"\n", L, L+pw, y, y, L-6, y+4, t.label)
	}
	if bars {
		for i, c := range p.Categories {
			x, y := px(float64(i)), T+ph+18
			if slant {
				fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="end" transform="rotate(-30 %.1f %g)">%s</text>`+"\n", x, y, x, y, esc(c))
			} else {
				fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", x, y, esc(c))
			}
		}
	} else {
		for _, t := range xticks {
			x := px(t.at)
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%g" y2="%g" stroke="#ddd"/><text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", x, x, T, T+ph, x, T+ph+18, t.label)
		}
	}
	for _, h := range p.HLines {
		y := py(ty(h))
		fmt.Fprintf(&b, `<line x1="%g" x2="%g" y1="%.1f" y2="%.1f" stroke="#888" stroke-dasharray="5,4"/>`+"\n", L, L+pw, y, y)
	}
	if xTitle != "" {
		x := L + pw/2
		if tw := svgtext.Width(xTitle, fs); x+tw/2 > W-10 || x-tw/2 < 10 {
			x = W / 2
		}
		fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`+"\n", x, H-18, esc(xTitle))
	}
	if yTitle != "" {
		fmt.Fprintf(&b, `<text transform="translate(20,%g) rotate(-90)" text-anchor="middle">%s</text>`+"\n", T+ph/2, esc(yTitle))
	}
	ns := len(p.Series)
	for si, s := range p.Series {
		col := svgtext.Color(si)
		if bars {
			bw := 0.8 / float64(max(ns, 1))
			for i := range s.X {
				if i >= len(s.Y) {
					break
				}
				x0 := px(s.X[i] - 0.4 + bw*float64(si))
				x1 := px(s.X[i] - 0.4 + bw*float64(si+1))
				y0 := py(math.Max(ymin, 0))
				y1 := py(ty(s.Y[i]))
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x0, math.Min(y0, y1), x1-x0-1, math.Abs(y0-y1), col)
			}
		} else {
			var pts []string
			for i := range s.X {
				if i >= len(s.Y) || math.IsNaN(s.Y[i]) || math.IsInf(s.Y[i], 0) {
					continue
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(tx(s.X[i])), py(ty(s.Y[i]))))
			}
			if len(pts) > 0 {
				fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", col, strings.Join(pts, " "))
				if len(pts) <= 60 {
					for _, pt := range pts {
						xy := strings.Split(pt, ",")
						fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], col)
					}
				}
			}
		}
		ly := T + 10 + 18*float64(si)
		fmt.Fprintf(&b, `<rect x="%g" y="%g" width="12" height="12" fill="%s"/><text x="%g" y="%g">%s</text>`+"\n", L+pw+12, ly, col, L+pw+30, ly+10, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// wrap breaks s into lines no wider than width at font size size,
// between words (a word wider than the width gets a line of its own).
func wrap(s string, size, width float64) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && svgtext.Width(line+" "+w, size) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// ticks returns about five round tick positions in [lo, hi] (in transformed
// units; decades when log).
func ticks(lo, hi float64, log bool) []float64 {
	if log {
		var out []float64
		for v := math.Ceil(lo); v <= hi; v++ {
			out = append(out, v)
		}
		if len(out) > 0 {
			return out
		}
	}
	span := hi - lo
	step := math.Pow(10, math.Floor(math.Log10(span/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if span/(step*m) <= 6 {
			step *= m
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step) * step; v <= hi+1e-9*span; v += step {
		out = append(out, v)
	}
	return out
}

func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case v == 0:
		return "0"
	case a >= 1e9:
		return fmt.Sprintf("%gG", round3(v/1e9))
	case a >= 1e6:
		return fmt.Sprintf("%gM", round3(v/1e6))
	case a >= 1e4:
		return fmt.Sprintf("%gk", round3(v/1e3))
	default:
		return fmt.Sprintf("%g", round3(v))
	}
}

func round3(v float64) float64 {
	if v == 0 {
		return 0
	}
	d := math.Pow(10, 3-math.Ceil(math.Log10(math.Abs(v))))
	return math.Round(v*d) / d
}
