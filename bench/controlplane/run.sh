#!/usr/bin/env bash
# Control-plane benchmark: lease cycles/s against SQLite and API p99 while
# 1,000 simulated agents heartbeat once a second. Writes docs/bench/controlplane.md.
# There is no peer to compare against (see the fragment).
# Takes about a minute with the defaults. To profile, run the program itself:
#   (cd bench && go run ./controlplane -runs 1 -cycles-cpuprofile /tmp/cycles.prof)
# (the first lease-cycle run only; -cpuprofile covers everything).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p docs/bench
# Databases go to tmpfs when there is one.
dir=$(mktemp -d "${TMPDIR:-/tmp}/rialto-bench-cp.XXXXXX")
trap 'rm -rf "$dir"' EXIT
(cd bench && go build -o "$dir/controlplane-bench" ./controlplane)
"$dir/controlplane-bench" -dir "$dir" -runs "${RUNS:-3}" -cycle-duration "${CYCLE_DURATION:-5s}" \
  -workers "${WORKERS:-16}" -agents "${AGENTS:-1000}" -hb-duration "${HB_DURATION:-10s}" \
  -out docs/bench/controlplane.md
