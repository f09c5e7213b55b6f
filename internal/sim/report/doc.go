// Package report is the file layer of the simulator: it runs a named
// experiment of package sim (with its real counterpart when given one, see
// Real) and writes its table as CSV, its plot as SVG and its figures as text
// into a directory, timing the run; All runs every experiment and writes the
// fit/prediction table, which ReplaceTable puts into a document. It is what
// `rialto sim run` calls; package sim itself does no I/O.
//
// Zero values: Options is sim.Options plus the trace directory path. The
// functions are safe for concurrent use on distinct output directories.
package report
