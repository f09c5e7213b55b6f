#!/usr/bin/env bash
# Database benchmark: PostgreSQL + pgbench on ext4 on a loop device on a FUSE
# file, nbdkit (through nbdfuse) against Rialto through leases of `rialto
# agent` processes (dedicated, through nbdfuse; a dedicated and a 3-way
# composed lease through `rialto attach --fuse`; extra rows: nbdfuse in front
# of `rialto attach`), interleaved; nbdkit's nbd plugin in front of its file
# plugin (nbdkit-proxy: two servers in a request's path) is a reference row,
# never a goal. Needs root, bin/rialto
# (built here), nbdkit, nbdfuse, PostgreSQL 15. Writes docs/bench/pgbench.md.
#
#   bench/pgbench/run.sh                 # REPS=5 SCALE=10 CLIENTS=4 T=15
#   REPS=1 T=5 OUT=/tmp/pg.md bench/pgbench/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then echo "bench/pgbench: needs root (mount, loop devices, FUSE)" >&2; exit 1; fi
go build -o bin/rialto ./cmd/rialto   # the agents run this tree
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
(cd bench && go build -o "$BIN/pgbench" ./pgbench)
"$BIN/pgbench" -bin bin/rialto -reps "${REPS:-5}" -size-mib "${SIZE_MIB:-900}" -scale "${SCALE:-10}" \
  -clients "${CLIENTS:-4}" -time "${T:-15}" -targets "${TARGETS:-nbdkit,nbdkit-proxy,dedicated,attach-fuse,composed-fuse,attach,composed}" \
  -out "${OUT:-docs/bench/pgbench.md}"
