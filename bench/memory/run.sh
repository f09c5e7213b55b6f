#!/usr/bin/env bash
# Remote-memory benchmark: Rialto's memory channels, mapping and adaptive
# chooser against redis-server (GET/SET) and the iperf3 loopback ceiling, all
# measured interleaved in one run. Writes docs/bench/memory.md.
#   RUNS=5 OPS=10000 BULK=1073741824 bench/memory/run.sh   (defaults; ~3 min)
# The donor is a memory lease of a `rialto agent` process (bin/rialto, built
# here). Knobs for experiments: PARTS=small,bulk,mapping,link,mixed (a subset;
# link puts a second agent in a network namespace, so it needs root and ip),
# SPIN (the client's sync-channel busy-poll budget, e.g. 30us; default off),
# MAP_SPIN (the mapping's handler; default 50us).
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

go build -o bin/rialto ./cmd/rialto   # the agents run this tree
(cd bench && go build -o "$tmp/memory-bench" ./memory)
export RIALTO_BENCH_CRED=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')   # the side donor's

rport=$(freeport)
redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no \
  --daemonize no --logfile "$tmp/redis.log" &
pids+=($!)
iport=$(freeport)
iperf3 -s -B 127.0.0.1 -p "$iport" >"$tmp/iperf.log" 2>&1 &
pids+=($!)
# What a lease cannot give: a donor that never polls (an extra, labelled row)
# and the floor probe, in a side process. The donor every Rialto figure is
# measured against is a memory lease of a `rialto agent` that memory-bench
# run starts (with a `rialto server`) from bin/rialto.
"$tmp/memory-bench" serve -addr 127.0.0.1:0 -size "$BULK" -side >"$tmp/side.addr" 2>"$tmp/side.log" &
sidepid=$!
pids+=($sidepid)
for _ in $(seq 100); do
  [ -s "$tmp/side.addr" ] && redis-cli -p "$rport" ping >/dev/null 2>&1 && break
  sleep 0.1
done
read -r addrblock addrfloor < "$tmp/side.addr"
[ -n "$addrfloor" ] || { cat "$tmp/side.log" >&2; exit 1; }

mkdir -p docs/bench
"$tmp/memory-bench" run -bin bin/rialto -redis "127.0.0.1:$rport" -iperf-port "$iport" \
  -runs "$RUNS" -ops "$OPS" -bulk "$BULK" -parts "$PARTS" -spin "${SPIN:-0s}" \
  -addr-block "$addrblock" -addr-floor "$addrfloor" -block-pid "$sidepid" -map-spin "${MAP_SPIN:-0s}" >"$tmp/memory.md"
{
  cat "$tmp/memory.md"
  echo
  echo "Peers' and probes' commands (ports chosen free at run time):"
  echo '```'
  echo "redis-server --bind 127.0.0.1 --port PORT --save '' --appendonly no"
  echo "iperf3 -s -B 127.0.0.1 -p PORT ; iperf3 -c 127.0.0.1 -p PORT -t 4 -P {1,2} -J"
  echo "memory-bench serve -addr 127.0.0.1:0 -size $BULK -side   # the non-polling side donor (extra row) and the floor probe"
  echo "memory-bench run -bin bin/rialto -addr-block DONOR2 -addr-floor FLOOR -block-pid PID -redis 127.0.0.1:PORT -iperf-port PORT -runs $RUNS -ops $OPS -bulk $BULK"
  echo '```'
  echo "Redis is driven by memory-bench's own RESP client (one TCP_NODELAY connection per"
  echo "client goroutine), so both sides are timed by the same code. $(redis-server --version | cut -d' ' -f1-3), $(iperf3 --version | head -1 | cut -d' ' -f1-2)."
} > docs/bench/memory.md
echo "wrote docs/bench/memory.md"
