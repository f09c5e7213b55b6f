// Command accel is the accelerator benchmark of bench/accel/run.sh. In one
// process it starts an appliance (echo and MCT slots), a batching gateway
// (in-process and served over TCP) and, as the baseline a user would
// otherwise build, the same MCT kernel behind a ZeroMQ REQ/REP + ROUTER/
// DEALER pipeline like seed 002's; it measures them interleaved and writes
// a Markdown fragment and an SVG Pareto plot.
//
// Concurrency: main owns every goroutine it starts and stops them before
// writing the report.
package main
