#!/usr/bin/env bash
# Devices reading devices: an accelerator slot hashing a range of a block lease
# on another lender, reading it itself (`rialto accel run --input-lease`),
# against the same task fed through the borrower (`--relay`), side by side in
# one run over an emulated rack with tc-tbf-shaped links (internal/rack). Needs
# root, ip, tc and go; iperf3 for the link ceiling. Writes docs/bench/devread.md.
#
#   bench/devread/run.sh                     # RATE=200mbit SIZE_MIB=64 REPS=5
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${RATE:-200mbit}
SIZE_MIB=${SIZE_MIB:-64}
REPS=${REPS:-5}
OUT=${OUT:-docs/bench/devread.md}

for tool in ip tc go; do
  command -v "$tool" >/dev/null || { echo "bench/devread: $tool not installed" >&2; exit 1; }
done
if [ "$(id -u)" != 0 ]; then echo "bench/devread: needs root (network namespaces)" >&2; exit 1; fi

BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
go build -o "$BIN/rialto" ./cmd/rialto
(cd bench && go build -o "$BIN/devread" ./devread)
"$BIN/devread" -bin "$BIN/rialto" -rate "$RATE" -size-mib "$SIZE_MIB" -reps "$REPS" -out "$OUT"
echo "wrote $OUT"
