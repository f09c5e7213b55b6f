// Package svgtext holds what Rialto's hand-written SVG charts share (the
// simulator's plots, the dashboard's charts, the benchmarks' figures): an
// estimate of a label's width, so that a layout reserves room for its
// labels and legends instead of cutting them off, and one colour palette.
//
// It is pure: no I/O, no state; safe for concurrent use.
package svgtext
