#!/usr/bin/env bash
# Control-plane benchmark, side by side in one run: lease cycles/s and p99 on
# SQLite, PostgreSQL with 1 replica and with 3 replicas (interleaved runs);
# failover time when the elected replica (a `rialto server` process) is
# SIGKILLed; 10,000 simulated agents heartbeating at the interval the control
# plane spreads them to, while a tenant runs lease cycles. Needs PostgreSQL
# (initdb/pg_ctl; Debian: apt-get install postgresql). Writes
# docs/bench/controlplane.md. Takes about five minutes with the defaults.
# To profile, run the program itself, e.g.
#   (cd bench && go run ./controlplane -runs 1 -skip-failover -skip-heartbeats -cpuprofile /tmp/cp.prof)
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p docs/bench
dir=$(mktemp -d "${TMPDIR:-/tmp}/rialto-bench-cp.XXXXXX")
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/rialto" ./cmd/rialto
(cd bench && go build -o "$dir/controlplane-bench" ./controlplane)
"$dir/controlplane-bench" -dir "$dir" -rialto "$dir/rialto" -runs "${RUNS:-3}" -cycle-duration "${CYCLE_DURATION:-5s}" \
  -workers "${WORKERS:-64}" -replicas "${REPLICAS:-3}" -agents "${AGENTS:-10000}" -hb-duration "${HB_DURATION:-20s}" \
  -failover-runs "${FAILOVER_RUNS:-3}" -failover-workers "${FAILOVER_WORKERS:-16}" -out docs/bench/controlplane.md
