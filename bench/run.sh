#!/usr/bin/env bash
# Runs every benchmark area (bench/*/run.sh) and assembles docs/BENCHMARKS.md.
# Each area script writes its own fragment docs/bench/AREA.md with the peer's
# figures measured in the same run, the exact commands and medians, the
# commit and the machine. Rialto's data-plane figures (block, pgbench,
# compose, memory, accel) are measured through leases created by the API and
# served by `rialto agent` processes built from this tree (bin/rialto).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/bin:$PATH"
mkdir -p docs/bench
# --assemble rebuilds docs/BENCHMARKS.md from the fragments without measuring.
areas=${BENCH_AREAS:-$(ls -d bench/*/ | xargs -n1 basename)}
[ "${1:-}" = "--assemble" ] && areas=""
for a in $areas; do
  [ -x "bench/$a/run.sh" ] || continue
  echo "== bench $a"
  "bench/$a/run.sh" || echo "bench $a failed (exit $?)" >&2
done
{
  echo "# Benchmarks"
  echo
  echo "Assembled by \`make bench\` (bench/run.sh) on $(date -u +%Y-%m-%d) from the fragments in"
  echo "docs/bench/, each written by bench/AREA/run.sh with its own date and conditions. Machine: $(nproc) vCPU,"
  echo "$(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo) RAM, kernel $(uname -r),"
  echo "CPU: $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo), $(go version | cut -d' ' -f3)."
  echo "Figures are medians of interleaved runs unless a section says otherwise; where a"
  echo "section compares with a peer, the peer was measured in the same run as Rialto."
  echo "Rialto's data-plane figures (block, PostgreSQL, composition, memory, accelerators) are"
  echo "measured through leases made with \`rialto lease create\` and served by separate \`rialto agent\`"
  echo "processes (the product path); a side server appears at most as an extra, labelled row."
  echo "Each section names the process that served each row and the commit it was measured at."
  echo
  for f in docs/bench/*.md; do
    [ -f "$f" ] || continue
    cat "$f"; echo
  done
} > docs/BENCHMARKS.md
echo "wrote docs/BENCHMARKS.md"
