// Command accel is the accelerator benchmark of bench/accel/run.sh. It runs
// a `rialto server` and a `rialto agent --accel` (bench/internal/lab) and
// leases slots from it with `rialto lease create`: an echo slot, three MCT
// slots, and three shared MCT leases served by the agent's batching
// gateway. Against them it measures, in its own process, a batching
// gateway used as a library (in-process, over the dedicated slots) and, as
// the baseline a user would otherwise build, the same MCT kernel behind a
// ZeroMQ REQ/REP + ROUTER/DEALER pipeline like the ERBIUM paper's (Maschi
// and Alonso); it measures them interleaved and writes a Markdown fragment
// and an SVG Pareto plot. On a second agent it leases two shares of one
// shared gateway (weights 1:3 with the default -share-a and -share-b) and
// measures, through their lease URIs, each tenant's throughput, latency and
// share of the served queries against its ideal share (cross-checked with
// the agent's per-lease metrics), what one tenant's expiring calls cost the
// other, and how long releasing a lease takes to stop its runaway Wasm
// call on the slot.
//
// Concurrency: main owns every goroutine it starts and stops them before
// writing the report.
package main
