#!/usr/bin/env bash
# Accelerator benchmark, through accel leases of a `rialto agent` process:
# remote echo vs in-process, MCT batched vs unbatched, the lender's gateway
# vs a ZeroMQ REQ/ROUTER/DEALER/REP pipeline (the ERBIUM paper's
# integration), and a sweep of the gateway knobs. Writes
# docs/bench/accel.md and docs/bench/accel-pareto.svg. Extra arguments are
# passed to the benchmark (e.g. -runs 5 -dur 3s).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p bin docs/bench
go build -o bin/rialto ./cmd/rialto   # the agent runs this tree
(cd bench && go build -o ../bin/accel-bench ./accel)
exec bin/accel-bench -bin bin/rialto -out docs/bench/accel.md -svg docs/bench/accel-pareto.svg "$@"
