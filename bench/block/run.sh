#!/usr/bin/env bash
# Block data-plane benchmark: Rialto through leases of `rialto agent`
# processes (dedicated, shared partition, 3-way composed through `rialto
# attach`) against nbdkit (file plugin), nbd-server and qemu-nbd (and, as a
# reference row that never sets a goal, nbdkit-proxy: nbdkit's nbd plugin in
# front of its file plugin, two servers in a request's path), every
# export the same size on tmpfs, interleaved (medians of REPS runs). Writes
# docs/bench/block.md. Needs bin/rialto (make build), nbdkit, nbd-server,
# qemu-nbd, nbdcopy, nbdinfo and fio.
#
#   bench/block/run.sh                          # REPS=5 SIZE_MIB=900 FIO_RUNTIME=4
#   REPS=1 METRICS=rr1,flush OUT=/tmp/b.md bench/block/run.sh   # a quick look
#   RIALTO=dedicated,attach bench/block/run.sh   # other Rialto targets
#   RIALTO=composed,composed-unix bench/block/run.sh   # attach on TCP and on a Unix socket
set -euo pipefail
cd "$(dirname "$0")/../.."
go build -o bin/rialto ./cmd/rialto   # the agents run this tree
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
(cd bench && go build -o "$BIN/block" ./block)
"$BIN/block" -bin bin/rialto -reps "${REPS:-5}" -size-mib "${SIZE_MIB:-900}" \
  -fio-runtime "${FIO_RUNTIME:-4}" -fio-ramp "${FIO_RAMP:-1}" \
  -peers "${PEERS:-nbdkit,nbd-server,qemu-nbd,nbdkit-proxy}" -rialto "${RIALTO:-dedicated,shared,composed}" \
  -metrics "${METRICS:-}" -out "${OUT:-docs/bench/block.md}"
