#!/usr/bin/env bash
# Accelerator benchmark, through accel leases of a `rialto agent` process:
# remote echo vs in-process, MCT batched vs unbatched, the lender's gateway
# vs a ZeroMQ REQ/ROUTER/DEALER/REP pipeline (the ERBIUM paper's
# integration), a sweep of the gateway knobs, and, on a second agent's
# shared gateway, two tenants' shared leases (--share 0.25 and 0.75, weights
# 1:3) under saturation against their ideal shares, what one tenant's
# cancelled calls cost the other, and the time from releasing a lease to its
# slot having stopped a runaway Wasm call. Writes docs/bench/accel.md and
# docs/bench/accel-pareto.svg. Extra arguments are passed to the benchmark,
# e.g. -runs 5 -dur 3s; -share-a/-share-b (the shares), -share-clients,
# -share-group (queries per request), -cancel-deadline, -runaways N;
# -shares=false skips the shared-gateway sections, -base=false all others.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p bin docs/bench
go build -o bin/rialto ./cmd/rialto   # the agent runs this tree
(cd bench && go build -o ../bin/accel-bench ./accel)
exec bin/accel-bench -bin bin/rialto -out docs/bench/accel.md -svg docs/bench/accel-pareto.svg "$@"
