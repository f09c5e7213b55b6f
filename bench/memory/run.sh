#!/usr/bin/env bash
# Remote-memory benchmark: Rialto's memory channels, mapping and adaptive
# chooser against redis-server (GET/SET) and the iperf3 loopback ceiling, all
# measured interleaved in one run. Writes docs/bench/memory.md.
#   RUNS=5 OPS=10000 BULK=1073741824 bench/memory/run.sh   (defaults; ~3 min)
# Knobs for experiments: PARTS=small,bulk,mapping,link,mixed (a subset; link
# puts a second donor in a network namespace, so it needs root and ip), SPIN and
# DONOR_SPIN (busy-poll budgets of the sync channel, e.g. 30us; default off),
# MAP_SPIN and FAULT_SPIN (the mapping's handler and the donor's fault
# connections; default 50us each).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-5}
OPS=${OPS:-10000}
BULK=${BULK:-1073741824}
PARTS=${PARTS:-}
for t in redis-server iperf3; do
  command -v "$t" >/dev/null || { echo "bench/memory: $t not installed" >&2; exit 1; }
done
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

(cd bench && go build -o "$tmp/memory-bench" ./memory)
export RIALTO_BENCH_CRED=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

rport=$(freeport)
redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no \
  --daemonize no --logfile "$tmp/redis.log" &
pids+=($!)
iport=$(freeport)
iperf3 -s -B 127.0.0.1 -p "$iport" >"$tmp/iperf.log" 2>&1 &
pids+=($!)
"$tmp/memory-bench" serve -addr 127.0.0.1:0 -size "$BULK" -spin "${DONOR_SPIN:-0s}" \
  -fault-spin "${FAULT_SPIN:-0s}" -pair >"$tmp/donor.addr" 2>"$tmp/donor.log" &
donorpid=$!
pids+=($donorpid)
for _ in $(seq 100); do
  [ -s "$tmp/donor.addr" ] && redis-cli -p "$rport" ping >/dev/null 2>&1 && break
  sleep 0.1
done
read -r addr addr2 addr3 < "$tmp/donor.addr"
[ -n "$addr" ] || { cat "$tmp/donor.log" >&2; exit 1; }

mkdir -p docs/bench
"$tmp/memory-bench" run -addr "$addr" -redis "127.0.0.1:$rport" -iperf-port "$iport" \
  -runs "$RUNS" -ops "$OPS" -bulk "$BULK" -parts "$PARTS" -spin "${SPIN:-0s}" \
  -addr-block "$addr2" -addr-floor "$addr3" -donor-pid "$donorpid" -map-spin "${MAP_SPIN:-0s}" >"$tmp/memory.md"
{
  cat "$tmp/memory.md"
  echo
  echo "Commands (ports chosen free at run time):"
  echo '```'
  echo "redis-server --bind 127.0.0.1 --port PORT --save '' --appendonly no"
  echo "iperf3 -s -B 127.0.0.1 -p PORT ; iperf3 -c 127.0.0.1 -p PORT -t 4 -P {1,2} -J"
  echo "memory-bench serve -addr 127.0.0.1:0 -size $BULK -pair   # donor, a non-polling twin and the floor probe, own process"
  echo "memory-bench run -addr DONOR -addr-block DONOR2 -addr-floor FLOOR -donor-pid PID -redis 127.0.0.1:PORT -iperf-port PORT -runs $RUNS -ops $OPS -bulk $BULK"
  echo '```'
  echo "Redis is driven by memory-bench's own RESP client (one TCP_NODELAY connection per"
  echo "client goroutine), so both sides are timed by the same code. $(redis-server --version | cut -d' ' -f1-3), $(iperf3 --version | head -1 | cut -d' ' -f1-2)."
} > docs/bench/memory.md
echo "wrote docs/bench/memory.md"
