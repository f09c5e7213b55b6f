#!/usr/bin/env bash
# (Not named run.sh: bench/run.sh runs every bench/*/run.sh, and this one needs two worktrees.)
# Before/after benchmark of a restructuring (issue 16): the same commands
# on two builds, interleaved A B / B A in rotating order, ROUNDS rounds.
#
#   bench/houseab/compare.sh BEFORE_WORKTREE AFTER_WORKTREE OUTDIR
#
# Builds at each worktree: internal/placement's test binary, the sqlite
# store's test binary, bench/controlplane and cmd/rialto; builds this
# driver (bench/houseab) once from this worktree. Then per round, for each
# measurement, runs both sides back to back (order alternating by round):
#  - placement: BenchmarkPlace10k (5000x), BenchmarkPlaceSelectors10k
#    (5000x), BenchmarkNewIndex10k (3x), BenchmarkPlaceAdd10k (3000x);
#  - sqlite: BenchmarkLeaseCycle (-test.benchtime 3s);
#  - bench/controlplane -runs 1 -cycle-duration 5s -workers 16 -agents 200
#    -hb-duration 5s (in-process control plane, fake lender);
#  - product path: a `rialto server` process and 3 `rialto agent` processes
#    (2 file-backed 1 GiB disks each, images on /dev/shm), then this driver
#    (16 workers creating and releasing 4 MiB block leases over the HTTP
#    API for DUR, default 10s). The cluster is started fresh for each run.
# Every run's output goes to OUTDIR/raw.txt with a header line
#   ### ROUND SIDE NAME steal=PCT wall=S load1=L
# (steal: % of all CPU time during the run, from /proc/stat; load1: the
# 1-minute load average when the run started). At the end,
# bench/houseab/summarize writes the tables to OUTDIR/table.md.
set -euo pipefail
BEFORE=$(realpath "$1"); AFTER=$(realpath "$2"); OUT=$(realpath -m "$3")
ROUNDS=${ROUNDS:-5}; DUR=${DUR:-10s}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"/{before,after}
RAW=$OUT/raw.txt; : > "$RAW"

for side in before after; do
  src=$BEFORE; [ "$side" = after ] && src=$AFTER
  (cd "$src" && git rev-parse HEAD > "$OUT/$side/commit" &&
    go test -c -o "$OUT/$side/placement.test" ./internal/placement &&
    go test -c -o "$OUT/$side/sqlite.test" ./internal/controlplane/store/sqlite &&
    # bench/ became a module of its own (bench/go.mod): build it there.
    if [ -f bench/go.mod ]; then (cd bench && go build -o "$OUT/$side/cpbench" ./controlplane)
    else go build -o "$OUT/$side/cpbench" ./bench/controlplane; fi &&
    go build -o "$OUT/$side/rialto" ./cmd/rialto)
done
(cd "$HERE/bench" && go build -o "$OUT/houseab" ./houseab && go build -o "$OUT/summarize" ./houseab/summarize)

cpu() { awk '/^cpu /{t=0; for(i=2;i<=NF;i++) t+=$i; print $9, t}' /proc/stat; }

# run ROUND SIDE NAME CMD...: run CMD, append its output with a header.
run() {
  local r=$1 side=$2 name=$3; shift 3
  local a b t0 t1 o load
  load=$(cut -d' ' -f1 /proc/loadavg); a=$(cpu); t0=$(date +%s.%N)
  o=$("$@" 2>&1) || o="$o
FAILED: exit $?"
  t1=$(date +%s.%N); b=$(cpu)
  local steal
  steal=$(echo "$a $b" | awk '{ d=$4-$2; if (d>0) printf "%.1f", 100*($3-$1)/d; else print "n/a" }')
  { echo "### $r $side $name steal=$steal wall=$(echo "$t0 $t1" | awk '{printf "%.1f", $2-$1}') load1=$load"; echo "$o"; } >> "$RAW"
  echo "### $r $side $name steal=$steal"
}

# cluster SIDE DIR: start `rialto server` + 3 agents of SIDE's binary in
# DIR; sets SPID and APIDS.
cluster() {
  local side=$1 dir=$2 bin=$OUT/$1/rialto extra=()
  mkdir -p "$dir"
  # The restructured build serves HTTPS by default; both sides get plain
  # HTTP so that the API costs the same.
  local help
  help=$("$bin" server --help 2>&1 || true)
  [[ $help == *-insecure-http* ]] && extra=(--insecure-http)
  local port
  port=$("$OUT/houseab" -free-port)
  URL=http://127.0.0.1:$port
  RIALTO_BOOTSTRAP_TOKEN=$BOOT RIALTO_ADMIN_TOKEN=$ADMIN "$bin" server --listen "127.0.0.1:$port" \
    --db "$dir/rialto.db" --log-level warn "${extra[@]}" 2> "$dir/server.log" &
  SPID=$!
  for i in 1 2 3; do
    # The API must answer before the agents join.
    for _ in $(seq 1 200); do curl -sf -o /dev/null "$URL/healthz" && break; sleep 0.1; done
    RIALTO_BOOTSTRAP_TOKEN=$BOOT "$bin" agent --control-plane "$URL" --name "node$i" \
      --state-dir "$dir/node$i" --block "disk0=$dir/node$i-d0.img:1GiB" --block "disk1=$dir/node$i-d1.img:1GiB" \
      --log-level warn 2> "$dir/agent$i.log" &
    APIDS+=($!)
  done
}

stopcluster() {
  for p in "${APIDS[@]}" "$SPID"; do kill "$p" 2>/dev/null || true; done
  for p in "${APIDS[@]}" "$SPID"; do wait "$p" 2>/dev/null || true; done
  APIDS=()
}

BOOT=rbt_bench$RANDOM$RANDOM; ADMIN=rat_bench$RANDOM$RANDOM
export RIALTO_ADMIN_TOKEN=$ADMIN
APIDS=()
SHM=$(mktemp -d /dev/shm/rialto-houseab.XXXXXX)
trap 'stopcluster; rm -rf "$SHM"' EXIT

{ echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"; } > "$OUT/meta.txt"
for r in $(seq 1 "$ROUNDS"); do
  order="before after"; [ $((r % 2)) -eq 0 ] && order="after before"
  for bench in 'BenchmarkPlace10k 5000x' 'BenchmarkPlaceSelectors10k 5000x' 'BenchmarkNewIndex10k 3x' 'BenchmarkPlaceAdd10k 3000x'; do
    set -- $bench
    for side in $order; do
      run "$r" "$side" "$1" "$OUT/$side/placement.test" -test.run '^$' -test.bench "^$1\$" -test.benchtime "$2" -test.timeout 30m
    done
  done
  for side in $order; do
    run "$r" "$side" BenchmarkLeaseCycle "$OUT/$side/sqlite.test" -test.run '^$' -test.bench '^BenchmarkLeaseCycle$' -test.benchtime 3s
  done
  for side in $order; do
    d=$(mktemp -d "$SHM/cp.XXXXXX")
    run "$r" "$side" controlplane "$OUT/$side/cpbench" -dir "$d" -runs 1 -cycle-duration 5s -workers 16 -agents 200 -hb-duration 5s
    rm -rf "$d"
  done
  for side in $order; do
    d=$(mktemp -d "$SHM/up.XXXXXX")
    cluster "$side" "$d"
    run "$r" "$side" productpath "$OUT/houseab" -url "$URL" -workers 16 -duration "$DUR" -nodes 3 -server-pid "$SPID"
    stopcluster
    cp "$d/server.log" "$OUT/$side/server-r$r.log" 2>/dev/null || true
    rm -rf "$d"
  done
done
{ echo "end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"; } >> "$OUT/meta.txt"
"$OUT/summarize" "$RAW" > "$OUT/table.md"
echo "done: $RAW, tables in $OUT/table.md"
