#!/usr/bin/env bash
# Composition scaling benchmark: a lease over 1, 2 and 3 `rialto agent`
# lenders, each agent in its own network namespace behind a tc-tbf-shaped
# link, served to the borrower (the root namespace) by `rialto attach`,
# measured with nbdcopy against iperf3's ceiling for the same links in the
# same run. Needs root, ip, tc, nbdcopy, iperf3. Writes docs/bench/compose.md.
#
#   bench/compose/run.sh                     # RATE=200mbit SIZE_MIB=240 REPS=5
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${RATE:-200mbit}
SIZE_MIB=${SIZE_MIB:-240}
REPS=${REPS:-5}
UNIT=${UNIT:-131072}
CONNS=${CONNS:-0}
OUT=${OUT:-docs/bench/compose.md}

for tool in ip tc nbdcopy iperf3 go; do
  command -v "$tool" >/dev/null || { echo "bench/compose: $tool not installed" >&2; exit 1; }
done
if [ "$(id -u)" != 0 ]; then echo "bench/compose: needs root (network namespaces)" >&2; exit 1; fi

go build -o bin/rialto ./cmd/rialto   # the agents run this tree
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
(cd bench && go build -o "$BIN/compose" ./compose)
"$BIN/compose" -bin bin/rialto -rate "$RATE" -size-mib "$SIZE_MIB" -reps "$REPS" -unit "$UNIT" -conns "$CONNS" -out "$OUT"
echo "wrote $OUT"
