#!/usr/bin/env bash
# Attribute a control-plane difference to merges: run bench/controlplane
# as built at several commits, ROUNDS rounds, the order of the commits
# rotated each round, and print per commit the median (min–max) of lease
# cycles per CPU-second of the process and of lease cycles/s (the table
# comes from bench/houseab/summarize).
#
#   for c in C1 C2 ...; do (cd WORKTREE_AT_C && go build -o BIN/cpbench-$c ./bench/controlplane); done
#   (at commits where bench/ is a module of its own: cd WORKTREE_AT_C/bench && go build ./controlplane)
#   bench/houseab/steps.sh OUTDIR BIN/cpbench-C1 BIN/cpbench-C2 ...
set -euo pipefail
OUT=$(realpath -m "$1"); shift
ROUNDS=${ROUNDS:-4}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"; RAW=$OUT/steps.txt; : > "$RAW"
(cd "$HERE/bench" && go build -o "$OUT/summarize" ./houseab/summarize)
SHM=$(mktemp -d /dev/shm/rialto-houseab-steps.XXXXXX)
trap 'rm -rf "$SHM"' EXIT
cpu() { awk '/^cpu /{t=0; for(i=2;i<=NF;i++) t+=$i; print $9, t}' /proc/stat; }
bins=("$@"); n=${#bins[@]}
for r in $(seq 1 "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    bin=${bins[$(((k + r - 1) % n))]}
    label=${bin##*cpbench-}
    d=$(mktemp -d "$SHM/cp.XXXXXX"); a=$(cpu); load=$(cut -d' ' -f1 /proc/loadavg)
    o=$("$bin" -dir "$d" -runs 1 -cycle-duration 5s -workers 16 -agents 200 -hb-duration 5s 2>&1 | grep 'run 1:' || true)
    b=$(cpu); rm -rf "$d"
    steal=$(echo "$a $b" | awk '{ d=$4-$2; if (d>0) printf "%.1f", 100*($3-$1)/d; else print "n/a" }')
    { echo "### $r $label controlplane steal=$steal load1=$load"; echo "$o"; } >> "$RAW"
    echo "### $r $label steal=$steal"
  done
done
"$OUT/summarize" -steps "$RAW" "${bins[@]##*cpbench-}"
