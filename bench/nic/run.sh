#!/usr/bin/env bash
# Lent NICs and the accelerator slots' UDP message path, side by side with
# their peers in one run: one lent NIC against the same link used directly,
# bonds of 2 and 3 lenders (leases made through the API of an emulated
# rack, served by rialto agents, attached by rialto attach), and 64-byte
# messages per second through a slot's UDP path against a
# one-syscall-per-message UDP echo, over tbf-shaped links. Writes
# docs/bench/nic.md. Needs root, ip, tc, nft and iperf3. Extra arguments go
# to nic-bench run (e.g. -runs 5 -dur 5s -rate 400mbit -parts udp).
set -euo pipefail
cd "$(dirname "$0")/../.."
for t in ip tc nft iperf3; do
  command -v "$t" >/dev/null || { echo "bench/nic: $t not installed" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "bench/nic: needs root (network namespaces)" >&2; exit 1; }
mkdir -p bin docs/bench
go build -o bin/rialto ./cmd/rialto
(cd bench && go build -o ../bin/nic-bench ./nic)
bin/nic-bench run -rialto bin/rialto -out docs/bench/nic.md "$@"
echo "wrote docs/bench/nic.md"
