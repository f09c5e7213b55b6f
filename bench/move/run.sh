#!/usr/bin/env bash
# Live migration of a block lease between lenders (`rialto lease move`) over
# an emulated rack with tc-tbf-shaped links (internal/rack): the migration's
# throughput against the link's iperf3 ceiling measured in the same run, and
# the borrower's I/O latency (fio through `rialto attach`) during a move
# against the same workload without one. Needs root, ip, tc, go, fio and
# iperf3. Writes docs/bench/move.md.
#
#   bench/move/run.sh                     # RATE=400mbit SIZE_MIB=256 REPS=3 FIO_SECS=12
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${RATE:-400mbit}
SIZE_MIB=${SIZE_MIB:-256}
REPS=${REPS:-3}
FIO_SECS=${FIO_SECS:-12}
OUT=${OUT:-docs/bench/move.md}

for tool in ip tc go fio iperf3; do
  command -v "$tool" >/dev/null || { echo "bench/move: $tool not installed" >&2; exit 1; }
done
if [ "$(id -u)" != 0 ]; then echo "bench/move: needs root (network namespaces)" >&2; exit 1; fi

BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
go build -o "$BIN/rialto" ./cmd/rialto
(cd bench && go build -o "$BIN/move" ./move)
"$BIN/move" -bin "$BIN/rialto" -rate "$RATE" -size-mib "$SIZE_MIB" -reps "$REPS" -fio-secs "$FIO_SECS" -out "$OUT"
echo "wrote $OUT"
