#!/usr/bin/env bash
# Accelerator benchmark: remote echo vs in-process, MCT batched vs
# unbatched, the Rialto gateway vs a ZeroMQ REQ/ROUTER/DEALER/REP pipeline
# (seed 002's integration), and a sweep of the gateway knobs. Writes
# docs/bench/accel.md and docs/bench/accel-pareto.svg. Extra arguments are
# passed to the benchmark (e.g. -runs 5 -dur 3s).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p bin docs/bench
(cd bench && go build -o ../bin/accel-bench ./accel)
exec bin/accel-bench -out docs/bench/accel.md -svg docs/bench/accel-pareto.svg -rev "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$@"
