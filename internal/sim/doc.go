// Package sim is Rialto's discrete-event simulator: a virtual clock and an
// event calendar (Engine), a fluid model of flows sharing links and devices
// whose rates come from max-min fair sharing and are recomputed whenever a
// flow starts or finishes (Net), device models calibrated from
// characterization profiles (delivered bandwidth versus concurrency),
// synthetic workloads after the source papers (SMUFIN-like sequential writers,
// a Redis-like cache with Zipf key popularity, ERBIUM-like batched query
// streams, multi-GPU training jobs), trace replay of the Alibaba openb GPU
// cluster traces, and named experiments that put the source papers' figures
// to the test. Every figure an experiment reports is tagged Fit or
// Prediction against a registry of the papers' figures (Figures) and of the
// calibrated constants and the figures they were tuned to (Calibrations);
// Run refuses a result that counts a fitted figure as a prediction.
//
// The simulator is pure: no goroutines, no wall-clock reads, no I/O in the
// engine, the models and the experiments. Runs are deterministic for a
// seed. Run returns a Result (table, plot, tagged metrics) and writes
// nothing: package sim/report writes its CSV, SVG and text files.
//
// Zero values: the zero Engine is ready to use at virtual time 0. A Net must
// be built with NewNet. Experiments are looked up by name with Experiments
// and run with Run.
//
// Concurrency: none of the types are safe for concurrent use; a simulation is
// single-threaded by design. Distinct Engines may run on distinct goroutines.
package sim
