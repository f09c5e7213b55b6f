package svgtext

import "strings"

// Palette is the series colours, in order (a colour-blind-safe set).
var Palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// Color is series i's colour, cycling through Palette.
func Color(i int) string { return Palette[i%len(Palette)] }

// Width estimates the width in pixels of s set in a sans-serif font of the
// given size, erring wide: layouts reserve room for labels with it.
func Width(s string, size float64) float64 {
	w := 0.0
	for _, r := range s {
		switch {
		case strings.ContainsRune("il.,:;'|!()[]", r):
			w += 0.30
		case strings.ContainsRune("fjrt -/", r):
			w += 0.40
		case strings.ContainsRune("mwMW%@", r):
			w += 0.90
		case r >= 'A' && r <= 'Z':
			w += 0.70
		default:
			w += 0.58
		}
	}
	return w * size
}
