// Command accel is the accelerator benchmark of bench/accel/run.sh. It runs
// a `rialto server` and a `rialto agent --accel` (bench/internal/lab) and
// leases slots from it with `rialto lease create`: an echo slot, three MCT
// slots, and three shared MCT leases served by the agent's batching
// gateway. Against them it measures, in its own process, a batching
// gateway used as a library (in-process, over the dedicated slots) and, as
// the baseline a user would otherwise build, the same MCT kernel behind a
// ZeroMQ REQ/REP + ROUTER/DEALER pipeline like the ERBIUM paper's (Maschi
// and Alonso); it measures them interleaved and writes a Markdown fragment
// and an SVG Pareto plot.
//
// Concurrency: main owns every goroutine it starts and stops them before
// writing the report.
package main
