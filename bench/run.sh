#!/usr/bin/env bash
# Runs every benchmark area (bench/*/run.sh) and assembles docs/BENCHMARKS.md.
# Each area script writes its own fragment docs/bench/AREA.md with the peer's
# figures measured in the same run, the exact commands and medians, the
# commit and the machine. Rialto's data-plane figures (block, pgbench,
# compose, memory, accel) are measured through leases created by the API and
# served by `rialto agent` processes built from this tree (bin/rialto).
#
#   bench/run.sh              # full mode (each area's defaults; well over an hour)
#   bench/run.sh --quick      # quick mode (BENCH_MODE=quick): 3 rounds everywhere,
#                             # shorter measurements, a smaller scale run, no
#                             # real-vs-simulated validation (33 minutes here)
#   bench/run.sh --assemble   # rebuild docs/BENCHMARKS.md from the fragments
# Knobs set in the environment win over the quick mode's (REPS, RUNS, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/bin:$PATH"
mkdir -p docs/bench
mode=${BENCH_MODE:-full}
assemble=""
for arg in "$@"; do
  case $arg in
    --quick) mode=quick ;;
    --assemble) assemble=1 ;;
    *) echo "bench/run.sh: unknown argument $arg (--quick, --assemble)" >&2; exit 2 ;;
  esac
done
case $mode in
  full) ;;
  quick)
    # Fewer rounds (never fewer than 3: medians of at least 3) and shorter
    # measurements; each fragment still states its own rounds and durations.
    export REPS=${REPS:-3} RUNS=${RUNS:-3} ROUNDS=${ROUNDS:-3}
    export FIO_RUNTIME=${FIO_RUNTIME:-3} T=${T:-10} FIO_SECS=${FIO_SECS:-8}
    export CYCLE_DURATION=${CYCLE_DURATION:-3s} HB_DURATION=${HB_DURATION:-5s}
    export OPS=${OPS:-5000} SCALE_LEASES=${SCALE_LEASES:-100000}
    export SIM_VALIDATE=${SIM_VALIDATE:-0}
    export ACCEL_ARGS=${ACCEL_ARGS:--runs 3 -dur 1s -sweepruns 3 -sweepdur 300ms -runaways 3}
    export NIC_ARGS=${NIC_ARGS:--runs 3 -dur 3s}
    ;;
  *) echo "bench/run.sh: BENCH_MODE is full or quick, not $mode" >&2; exit 2 ;;
esac
areas=${BENCH_AREAS:-$(ls -d bench/*/ | xargs -n1 basename)}
[ -n "$assemble" ] && areas=""
[ -n "$assemble" ] && mode=assembled
failed=()
for a in $areas; do
  [ -x "bench/$a/run.sh" ] || continue
  echo "== bench $a ($mode mode, $(date -u +%H:%M:%SZ))"
  args=()
  case $a in
    accel) read -ra args <<<"${ACCEL_ARGS:-}" ;;
    nic) read -ra args <<<"${NIC_ARGS:-}" ;;
  esac
  "bench/$a/run.sh" "${args[@]}" || { echo "bench $a failed (exit $?)" >&2; failed+=("$a"); }
done
{
  echo "# Benchmarks"
  echo
  echo "Assembled by bench/run.sh (\`make bench\`; \`make bench-quick\` for the quick mode) on $(date -u +%Y-%m-%d) from the fragments in"
  echo "docs/bench/, each written by bench/AREA/run.sh with its own date and conditions. Machine: $(nproc) vCPU,"
  echo "$(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo) RAM, kernel $(uname -r),"
  echo "CPU: $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo), $(go version | cut -d' ' -f3)."
  echo "Figures are medians of interleaved runs unless a section says otherwise; where a"
  echo "section compares with a peer, the peer was measured in the same run as Rialto."
  echo "Rialto's data-plane figures (block, PostgreSQL, composition, memory, accelerators) are"
  echo "measured through leases made with \`rialto lease create\` and served by separate \`rialto agent\`"
  echo "processes (the product path); a side server appears at most as an extra, labelled row."
  echo "Each section names the process that served each row and the commit it was measured at."
  echo "The agents' data planes serve plaintext, like the peers they are compared with (with"
  echo "\`--insecure-dataplane\` where the binary serves TLS by default; the commands show it);"
  echo "bench/tls compares the TLS data planes."
  echo
  case ${mode:-full} in
    quick) echo "Mode: **quick** (\`bench/run.sh --quick\`): every area ran with 3 rounds and"
           echo "shorter measurements than the full mode (\`make bench\`, each area's defaults), the simulator's scale"
           echo "run with ${SCALE_LEASES:-100000} leases and without the real-vs-simulated validation; each section states"
           echo "its own rounds and durations." ;;
    assembled) echo "Mode: **assembled** (\`bench/run.sh --assemble\`): the page was rebuilt from the fragments in docs/bench/,"
               echo "which come from separate runs of their areas, in the full or the quick mode; each section states its"
               echo "date, commit, rounds and durations." ;;
    *) echo "Mode: **full** (\`make bench\`: each area's defaults)." ;;
  esac
  if [ -n "${BENCH_AREAS:-}" ] && [ -z "$assemble" ]; then
    echo
    echo "This run measured only: ${BENCH_AREAS}; the other sections are from earlier runs (see their dates)."
  fi
  if [ ${#failed[@]} -gt 0 ] 2>/dev/null; then
    echo
    echo "**Areas that failed in this run** (their sections below are from earlier runs; see their dates): ${failed[*]}."
  fi
  echo
  for f in docs/bench/*.md; do
    [ -f "$f" ] || continue
    cat "$f"; echo
  done
} > docs/BENCHMARKS.md
echo "wrote docs/BENCHMARKS.md"
