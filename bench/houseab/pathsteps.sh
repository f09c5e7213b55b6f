#!/usr/bin/env bash
# Attribute a product-path difference to merges: for each `rialto` binary
# given (built at several commits, named rialto-COMMIT), start a fresh
# `rialto server` process (plain HTTP) and 3 `rialto agent` processes with
# 2 file-backed 1 GiB disks each on /dev/shm, and run the bench/houseab
# driver (16 workers creating and releasing 4 MiB block leases over the
# HTTP API for DUR). ROUNDS rounds, the order of the binaries rotated each
# round. Raw lines go to OUTDIR/pathsteps.txt; a table is printed (by
# bench/houseab/summarize).
#
#   for c in C1 C2 ...; do (cd WORKTREE_AT_C && go build -o BIN/rialto-$c ./cmd/rialto); done
#   (cd bench && go build -o BIN/houseab ./houseab)
#   bench/houseab/pathsteps.sh OUTDIR BIN/houseab BIN/rialto-C1 BIN/rialto-C2 ...
set -euo pipefail
OUT=$(realpath -m "$1"); DRIVER=$(realpath "$2"); shift 2
ROUNDS=${ROUNDS:-4}; DUR=${DUR:-10s}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"; RAW=$OUT/pathsteps.txt; : > "$RAW"
(cd "$HERE/bench" && go build -o "$OUT/summarize" ./houseab/summarize)
cpu() { awk '/^cpu /{t=0; for(i=2;i<=NF;i++) t+=$i; print $9, t}' /proc/stat; }
BOOT=rbt_bench$RANDOM$RANDOM; ADMIN=rat_bench$RANDOM$RANDOM
export RIALTO_ADMIN_TOKEN=$ADMIN
APIDS=(); SPID=
SHM=$(mktemp -d /dev/shm/rialto-houseab-path.XXXXXX)
stopcluster() {
  for p in "${APIDS[@]}" $SPID; do kill "$p" 2>/dev/null || true; done
  for p in "${APIDS[@]}" $SPID; do wait "$p" 2>/dev/null || true; done
  APIDS=(); SPID=
}
trap 'stopcluster; rm -rf "$SHM"' EXIT
cluster() { # BIN DIR
  local bin=$1 dir=$2 extra=() help port
  mkdir -p "$dir"
  help=$("$bin" server --help 2>&1 || true)
  [[ $help == *-insecure-http* ]] && extra=(--insecure-http)
  port=$("$DRIVER" -free-port)
  URL=http://127.0.0.1:$port
  RIALTO_BOOTSTRAP_TOKEN=$BOOT RIALTO_ADMIN_TOKEN=$ADMIN "$bin" server --listen "127.0.0.1:$port" \
    --db "$dir/rialto.db" --log-level warn "${extra[@]}" 2> "$dir/server.log" &
  SPID=$!
  for _ in $(seq 1 200); do curl -sf -o /dev/null "$URL/healthz" && break; sleep 0.1; done
  for i in 1 2 3; do
    RIALTO_BOOTSTRAP_TOKEN=$BOOT "$bin" agent --control-plane "$URL" --name "node$i" \
      --state-dir "$dir/node$i" --block "disk0=$dir/node$i-d0.img:1GiB" --block "disk1=$dir/node$i-d1.img:1GiB" \
      --log-level warn 2> "$dir/agent$i.log" &
    APIDS+=($!)
  done
}
bins=("$@"); n=${#bins[@]}
for r in $(seq 1 "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    bin=${bins[$(((k + r - 1) % n))]}
    label=${bin##*rialto-}
    d=$(mktemp -d "$SHM/up.XXXXXX")
    cluster "$bin" "$d"
    a=$(cpu); load=$(cut -d' ' -f1 /proc/loadavg)
    o=$("$DRIVER" -url "$URL" -workers 16 -duration "$DUR" -nodes 3 -server-pid "$SPID" 2>&1 || true)
    b=$(cpu)
    stopcluster; rm -rf "$d"
    steal=$(echo "$a $b" | awk '{ d=$4-$2; if (d>0) printf "%.1f", 100*($3-$1)/d; else print "n/a" }')
    { echo "### $r $label productpath steal=$steal load1=$load"; echo "$o"; } >> "$RAW"
    echo "### $r $label steal=$steal"
  done
done
"$OUT/summarize" -pathsteps "$RAW" "${bins[@]##*rialto-}"
