package sim

import (
	"fmt"
	"math"
	"strings"
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
	LogX, LogY            bool
	Categories            []string
	Series                []Series
	// HLines draws horizontal reference lines (e.g. a threshold).
	HLines []float64
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}

// SVG renders the plot as a standalone SVG document.
func (p Plot) SVG() []byte {
	const W, H = 720.0, 440.0
	const L, R, T, B = 80.0, 170.0, 40.0, 60.0
	pw, ph := W-L-R, H-T-B
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
	px := func(x float64) float64 { return L + (x-xmin)/(xmax-xmin)*pw }
	py := func(y float64) float64 { return T + ph - (y-ymin)/(ymax-ymin)*ph }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="15" text-anchor="middle">%s</text>`+"\n", L+pw/2, esc(p.Title))
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#333"/>`+"\n", L, T, pw, ph)
	// Y ticks.
	for _, v := range ticks(ymin, ymax, p.LogY) {
		y := py(v)
		label := v
		if p.LogY {
			label = math.Pow(10, v)
		}
		fmt.Fprintf(&b, `<line x1="%g" x2="%g" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%g" y="%.1f" text-anchor="end">%s</text>`+"\n", L, L+pw, y, y, L-6, y+4, fmtNum(label))
	}
	if bars {
		for i, c := range p.Categories {
			fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", px(float64(i)), T+ph+18, esc(c))
		}
	} else {
		for _, v := range ticks(xmin, xmax, p.LogX) {
			x := px(v)
			label := v
			if p.LogX {
				label = math.Pow(10, v)
			}
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%g" y2="%g" stroke="#ddd"/><text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", x, x, T, T+ph, x, T+ph+18, fmtNum(label))
		}
	}
	for _, h := range p.HLines {
		y := py(ty(h))
		fmt.Fprintf(&b, `<line x1="%g" x2="%g" y1="%.1f" y2="%.1f" stroke="#888" stroke-dasharray="5,4"/>`+"\n", L, L+pw, y, y)
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`+"\n", L+pw/2, H-18, esc(p.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(20,%g) rotate(-90)" text-anchor="middle">%s</text>`+"\n", T+ph/2, esc(p.YLabel))
	ns := len(p.Series)
	for si, s := range p.Series {
		col := palette[si%len(palette)]
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
		fmt.Fprintf(&b, `<rect x="%g" y="%g" width="12" height="12" fill="%s"/><text x="%g" y="%g">%s</text>`+"\n", L+pw+10, ly, col, L+pw+28, ly+10, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
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
