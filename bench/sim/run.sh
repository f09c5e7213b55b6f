#!/usr/bin/env bash
# Simulator scale benchmark. Writes docs/bench/sim.md:
#  - engine events/s: Rialto's 4-ary calendar vs the same calendar on Go's
#    container/heap (the usual peer in Go DES code), 3 interleaved rounds;
#  - the full Alibaba openb trace (1,523 nodes, 8,152 pods) replayed under
#    whole-device allocation and under Rialto placement, 3 rounds;
#  - the data-centre run through the product's CLI, `rialto sim run scale`
#    (10,000 nodes, 1,000,000 leases, 80% borrowing another node's devices,
#    25% composed; one run; SCALE_LEASES and SCALE_NODES override): placement
#    decisions/s and events/s per CPU and wall second, shares, slowdowns,
#    max RSS.
#
#   bench/sim/run.sh                 # full size
#   SCALE_LEASES=100000 bench/sim/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-docs/bench/sim.md}
ROUNDS=${ROUNDS:-3}
SCALE_LEASES=${SCALE_LEASES:-1000000}
SCALE_NODES=${SCALE_NODES:-10000}
WORK=$(mktemp -d /dev/shm/rialto-bench-sim.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$(dirname "$OUT")"

go test -c -o "$WORK/sim.test" ./internal/sim
go build -o "$WORK/rialto" ./cmd/rialto
# The openb trace: $RIALTO_TRACES, else ../shared/data/traces next to the
# checkout (for a git worktree: next to the main checkout).
if [ -z "${RIALTO_TRACES:-}" ]; then
  for d in ../shared/data/traces "$(git rev-parse --git-common-dir)/../../shared/data/traces"; do
    if [ -d "$d" ]; then RIALTO_TRACES=$(cd "$d" && pwd); break; fi
  done
fi
export RIALTO_TRACES=${RIALTO_TRACES:-}
steal() { awk '/^cpu /{print $9}' /proc/stat; }
ticks=$(getconf CLK_TCK)
s0=$(steal); t0=$(date +%s)

cd internal/sim # the test binary finds the traces relative to the package
for r in $(seq 1 "$ROUNDS"); do
  "$WORK/sim.test" -test.run '^$' -test.bench '^BenchmarkEngine$' -test.benchtime 3000000x | tee -a "$WORK/engine.txt"
  "$WORK/sim.test" -test.run '^$' -test.bench '^BenchmarkEngineStdHeap$' -test.benchtime 3000000x | tee -a "$WORK/engine.txt"
done
for r in $(seq 1 "$ROUNDS"); do
  "$WORK/sim.test" -test.run '^$' -test.bench '^BenchmarkOpenbReplay$' -test.benchtime 1x | tee -a "$WORK/openb.txt"
done
cd ../..
/usr/bin/time -v "$WORK/rialto" sim run scale --nodes "$SCALE_NODES" --leases "$SCALE_LEASES" --out "$WORK/scale" -o json \
  > "$WORK/scale.json" 2> "$WORK/scale.time"
cat "$WORK/scale.json"
# Real vs simulated writers (needs root for the namespaces; skipped otherwise):
# the full 1–6 × 1–3 matrix with the lab's Reno, then the test's 1/3/6-writer
# subset with the machine's own congestion control, for comparison.
VAL=""
VALCC=""
# SIM_VALIDATE=0 (bench/run.sh --quick) skips it.
if [ "${SIM_VALIDATE:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v tc >/dev/null; then
  RIALTO_VALIDATE_OUT=$PWD/docs/bench RIALTO_VALIDATE_FULL=1 go test -count=1 -run 'TestRealVsSimulated$' -v -timeout 20m ./internal/lab > "$WORK/validate.txt" 2>&1 || true
  VAL=$(grep -E 'lenders, .* writers:|load average|summary:|FAIL|SKIP' "$WORK/validate.txt" | sed 's/^ *writers_test.go:[0-9]*: /- /')
  hostcc=$(sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null || echo "")
  if [ -n "$hostcc" ] && [ "$hostcc" != reno ]; then
    RIALTO_VALIDATE_CC=$hostcc go test -count=1 -run 'TestRealVsSimulated$' -v -timeout 10m ./internal/lab > "$WORK/validate-cc.txt" 2>&1 || true
    VALCC=$(grep -E 'lenders, .* writers: real|load average|summary:' "$WORK/validate-cc.txt" | sed 's/^ *writers_test.go:[0-9]*: /- /')
  fi
fi
s1=$(steal); t1=$(date +%s)

# metric NAME FILE BENCH: median of the values reported as NAME by BENCH.
metric() {
  awk -v b="$3" -v m="$1" '$1 ~ "^"b"(-[0-9]+)?$" { for (i=2;i<NF;i++) if ($(i+1)==m) print $i }' "$2" | sort -g | awk '{a[NR]=$1} END{ if (NR) print a[int((NR+1)/2)]; else print "n/a" }'
}
eng=$(metric events/s "$WORK/engine.txt" BenchmarkEngine)
std=$(metric events/s "$WORK/engine.txt" BenchmarkEngineStdHeap)
engc=$(metric events/cpu-s "$WORK/engine.txt" BenchmarkEngine)
stdc=$(metric events/cpu-s "$WORK/engine.txt" BenchmarkEngineStdHeap)
wd=$(metric s/replay "$WORK/openb.txt" BenchmarkOpenbReplay/whole-device)
ri=$(metric s/replay "$WORK/openb.txt" BenchmarkOpenbReplay/rialto)
wdc=$(metric cpu-s/replay "$WORK/openb.txt" BenchmarkOpenbReplay/whole-device)
ric=$(metric cpu-s/replay "$WORK/openb.txt" BenchmarkOpenbReplay/rialto)
# scale: figures from `rialto sim run scale -o json` and /usr/bin/time.
sj() { jq -r "$1" "$WORK/scale.json"; }
srow() { awk -F, -v k="$1" '$1==k {print $2}' "$WORK/scale/scale.csv"; }
sc=$(sj '.wall_seconds | . * 100 | round / 100')
scc=$(sj '.cpu_seconds | . * 100 | round / 100')
ev=$(sj '.events')
calls=$(srow place_calls)
dps=$(awk -v a="$calls" -v c="$scc" 'BEGIN{ if (c>0) printf "%.0f", a/c; else print "n/a" }')
dpsw=$(awk -v a="$calls" -v c="$sc" 'BEGIN{ if (c>0) printf "%.0f", a/c; else print "n/a" }')
eps=$(awk -v a="$ev" -v c="$scc" 'BEGIN{ if (c>0) printf "%.0f", a/c; else print "n/a" }')
epsw=$(awk -v a="$ev" -v c="$sc" 'BEGIN{ if (c>0) printf "%.0f", a/c; else print "n/a" }')
remote=$(sj '.metrics[] | select(.name=="leases on another node'"'"'s devices") | .value * 1000 | round / 10')
comp=$(sj '.metrics[] | select(.name=="leases composed") | .value * 1000 | round / 10')
refused=$(srow rejected)
act=$(srow max_active)
p50=$(srow slowdown_p50); p90=$(srow slowdown_p90); p99=$(srow slowdown_p99); smax=$(srow slowdown_max); slow=$(srow slowdown_mean)
rss=$(awk -F: '/Maximum resident set size/ {printf "%.0f", $2/1024}' "$WORK/scale.time")
ratio=$(awk -v a="$eng" -v b="$std" 'BEGIN{ if (b>0) printf "%.2f", a/b; else print "n/a" }')
ratioc=$(awk -v a="$engc" -v b="$stdc" 'BEGIN{ if (b>0) printf "%.2f", a/b; else print "n/a" }')
stealpct=$(awk -v s="$((s1-s0))" -v t="$((t1-t0))" -v hz="$ticks" -v n="$(nproc)" 'BEGIN{ if (t>0) printf "%.1f", 100*s/hz/t/n; else print "n/a" }')
load=$(cut -d' ' -f1-3 /proc/loadavg)

cat > "$OUT" <<MD
## Simulator (internal/sim)

Measured $(date -u +%Y-%m-%dT%H:%MZ) by \`bench/sim/run.sh\`; $(nproc) vCPU shared with other
work (load average at the end: $load; steal $stealpct% of CPU time during the run).
Medians of $ROUNDS interleaved rounds except the scale run (one run).

Wall-clock figures include time the CPU spent on other people's work; CPU-time
figures (user + system time of the benchmark process) do not.

| figure | Rialto | peer | ratio | goal |
|---|---|---|---|---|
| engine events per CPU second (10,000 pending events, each schedules one) | $engc | $stdc (container/heap calendar) | $ratioc× | ≥ 1,000,000/s |
| engine events per wall second | $eng | $std | $ratio× | |
| full openb trace, 1,523 nodes / 8,152 pods, Rialto placement: wall s (CPU s) | $ri ($ric) | $wd ($wdc) whole-device policy, same replay | | < 10 s |
| \`rialto sim run scale\`: $SCALE_NODES nodes, $SCALE_LEASES leases: wall s (CPU s) | $sc ($scc) | — | | < 300 s |
| placement decisions per CPU second (per wall second) | $dps ($dpsw) | — | | |
| simulation events per CPU second (per wall second) | $eps ($epsw) | — | | |

Scale run (\`rialto sim run scale --nodes $SCALE_NODES --leases $SCALE_LEASES\`): $remote% of the
leases on another node's devices, $comp% composed, $refused refused; at most $act leases running
at once; slowdown mean $slow, p50 $p50, p90 $p90, p99 $p99, max $smax; max RSS $rss MiB.
Each lease is placed by \`internal/placement\` (Index.Place/Add/Remove), its bytes move
through the fabric model with max-min sharing (\`fabric.Solver\`), recomputed when
flows start or finish. The rates are the CLI's: the simulator reads no clock.

Real vs simulated (\`internal/lab\`: 1–6 sequential writers, 8 MiB per writer and
lender, striping over 1–3 NBD lenders in network namespaces whose links are shaped with tc
tbf at 40 Mbit/s with a 1.25 MB queue, TCP Reno; the simulator runs the same scenario;
per-writer bandwidth is bytes over the writer's own elapsed time; "links busy" is what the
lenders' tbf qdiscs sent over what they could send in the makespan — errors are asserted
where it is at least 95% (the links, not the CPU, bound the writers); headroom is what the
machine moved through the same path unshaped just before, over what the scenario needs;
table and plot in \`docs/bench/validate-writers.csv\` / \`.svg\`):

${VAL:-not run ($([ "${SIM_VALIDATE:-1}" = 0 ] && echo "SIM_VALIDATE=0, the quick mode of bench/run.sh; the figures in docs/bench/validate-writers.* are from an earlier full run" || echo "needs root and tc"))}

With the machine's own congestion control (\`${hostcc:-}\`) instead of Reno, the test's
subset (1 and 6 writers on 1 and 3 lenders, 4 MiB per writer and lender):

${VALCC:-not run ($([ "${SIM_VALIDATE:-1}" = 0 ] && echo "SIM_VALIDATE=0, quick mode" || echo "needs root and tc, or the machine already uses Reno"))}

Commands: \`go test -c ./internal/sim\`, then in \`internal/sim\`:
\`sim.test -test.bench '^BenchmarkEngine\$|^BenchmarkEngineStdHeap\$' -test.benchtime 3000000x\`,
\`sim.test -test.bench '^BenchmarkOpenbReplay\$' -test.benchtime 1x\`;
\`/usr/bin/time -v rialto sim run scale --nodes $SCALE_NODES --leases $SCALE_LEASES -o json\`.
MD
echo "wrote $OUT"
