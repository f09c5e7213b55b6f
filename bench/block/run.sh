#!/usr/bin/env bash
# Block data plane benchmark: Rialto's NBD server (bench/block/nbdserve, the
# internal/dataplane/block/nbd package) against nbdkit (file plugin), qemu-nbd
# and nbd-server serving the same 1 GiB random-data image on tmpfs, measured
# interleaved in the same run (medians of REPS runs). Writes docs/bench/block.md.
#
#   bench/block/run.sh            # REPS=5 FIO_RUNTIME=4 SIZE_MIB=1024 by default
#   ONLY="4K randread IOPS QD32" OUT=/tmp/qd32.md bench/block/run.sh   # one metric
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
REPS=${REPS:-5}
FIO_RUNTIME=${FIO_RUNTIME:-4}
FIO_RAMP=${FIO_RAMP:-1}
SIZE_MIB=${SIZE_MIB:-1024}
OUT=${OUT:-docs/bench/block.md}

for tool in nbdkit qemu-nbd nbd-server nbdcopy fio python3 go; do
  command -v "$tool" >/dev/null || { echo "bench/block: $tool not installed" >&2; exit 1; }
done

# Images live on a tmpfs so that every server reads memory, not the VM's disk.
WORK=$(mktemp -d /dev/shm/rialto-bench-block.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

go build -o "$WORK/nbdserve" ./bench/block/nbdserve
IMG=$WORK/disk.img
SRC=$WORK/src.img
head -c "${SIZE_MIB}M" /dev/urandom > "$IMG"
head -c "${SIZE_MIB}M" /dev/urandom > "$SRC"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 1 200); do
    if nbdinfo --size "$1" >/dev/null 2>&1; then return 0; fi
    sleep 0.05
  done
  echo "server at $1 did not come up" >&2; exit 1
}

P_NBDKIT=$(port); P_QEMU=$(port); P_NBDSRV=$(port); P_RIALTO=$(port)
EXPORT=bench-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')

CMD_NBDKIT="nbdkit -f -i 127.0.0.1 -p $P_NBDKIT file $IMG"
CMD_QEMU="qemu-nbd -f raw -b 127.0.0.1 -p $P_QEMU -x '' -t -e 16 $IMG"
CMD_RIALTO="nbdserve -addr 127.0.0.1:$P_RIALTO -name EXPORT -file $IMG"
cat > "$WORK/nbd-server.conf" <<CONF
[generic]
listenaddr = 127.0.0.1
port = $P_NBDSRV
allowlist = false
[exp]
exportname = $IMG
flush = true
fua = true
trim = true
CONF
CMD_NBDSRV="nbd-server -C CONF"

nbdkit -f -i 127.0.0.1 -p "$P_NBDKIT" file "$IMG" 2>"$WORK/nbdkit.log" & PIDS+=($!); PID_nbdkit=$!
qemu-nbd -f raw -b 127.0.0.1 -p "$P_QEMU" -x '' -t -e 16 "$IMG" 2>"$WORK/qemu.log" & PIDS+=($!); PID_qemu=$!
# nbd-server daemonises and forks one process per connection; its pid file
# gives the parent, whose cutime/cstime collect the reaped children's CPU.
nbd-server -C "$WORK/nbd-server.conf" -p "$WORK/nbd-server.pid" >"$WORK/nbd-server.log" 2>&1
for _ in $(seq 1 100); do [ -s "$WORK/nbd-server.pid" ] && break; sleep 0.05; done
PID_nbdserver=$(cat "$WORK/nbd-server.pid"); PIDS+=("$PID_nbdserver")
"$WORK/nbdserve" -addr "127.0.0.1:$P_RIALTO" -name "$EXPORT" -file "$IMG" >"$WORK/rialto.log" 2>&1 & PIDS+=($!); PID_rialto=$!

declare -A URI=(
  [nbdkit]="nbd://127.0.0.1:$P_NBDKIT/"
  [qemu-nbd]="nbd://127.0.0.1:$P_QEMU/"
  [nbd-server]="nbd://127.0.0.1:$P_NBDSRV/exp"
  [rialto]="nbd://127.0.0.1:$P_RIALTO/$EXPORT"
)
declare -A PID=([nbdkit]=$PID_nbdkit [qemu-nbd]=$PID_qemu [nbd-server]=$PID_nbdserver [rialto]=$PID_rialto)
for s in nbdkit qemu-nbd nbd-server rialto; do wait_port "${URI[$s]}"; done

# steal and total jiffies from /proc/stat
cpustat() { awk '/^cpu /{t=0; for(i=2;i<=NF;i++) t+=$i; print $9, t}' /proc/stat; }
# utime+stime (+ reaped children) of a server process (the server process), in clock ticks
proccpu() { awk '{print $14+$15+$16+$17}' "/proc/$1/stat" 2>/dev/null || echo 0; }

RES=$WORK/results.tsv
: > "$RES"
measure() { # server metric rep -- command... ; prints value on stdout of the command parser
  local server=$1 metric=$2 rep=$3; shift 3
  local s0 t0 c0 s1 t1 c1 value
  read -r s0 t0 < <(cpustat); c0=$(proccpu "${PID[$server]}")
  rm -f "$WORK/client.cpu"
  value=$("$@") || value=nan
  local ccpu=nan
  [ -s "$WORK/client.cpu" ] && ccpu=$(cat "$WORK/client.cpu")
  read -r s1 t1 < <(cpustat); c1=$(proccpu "${PID[$server]}")
  local steal
  steal=$(python3 -c "print(f'{100*($s1-$s0)/max(1,$t1-$t0):.1f}')")
  local cpu
  cpu=$(python3 -c "import os; print(f'{($c1-$c0)/os.sysconf(\"SC_CLK_TCK\"):.2f}')")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$server" "$metric" "$rep" "$value" "$steal" "$cpu" "$ccpu" >> "$RES"
  printf '%-10s %-22s rep %s: %s (steal %s%%, server cpu %ss)\n' "$server" "$metric" "$rep" "$value" "$steal" "$cpu" >&2
}

nbdcopy_read() { # MiB/s
  local t0 t1; t0=$(date +%s.%N)
  nbdcopy "$@" "$URI_CUR" null: >/dev/null || return 1
  t1=$(date +%s.%N)
  python3 -c "print(f'{$SIZE_MIB/($t1-$t0):.0f}')"
}
nbdcopy_write() {
  local t0 t1; t0=$(date +%s.%N)
  nbdcopy "$SRC" "$URI_CUR" >/dev/null || return 1
  t1=$(date +%s.%N)
  python3 -c "print(f'{$SIZE_MIB/($t1-$t0):.0f}')"
}
fio_randread() { # IOPS
  fio --name=randread --ioengine=nbd --uri="$URI_CUR" --rw=randread --bs=4k --iodepth="$1" \
      --runtime="$FIO_RUNTIME" --ramp_time="$FIO_RAMP" --time_based --output-format=json --output="$WORK/fio.json" >/dev/null || return 1
  # The client's own CPU (fio and libnbd, one thread), for the client-CPU table.
  python3 -c "import json; j=json.load(open('$WORK/fio.json'))['jobs'][0]; print(f\"{j['usr_cpu']+j['sys_cpu']:.1f}\")" > "$WORK/client.cpu"
  python3 -c "import json; j=json.load(open('$WORK/fio.json')); print(f\"{j['jobs'][0]['read']['iops']:.0f}\")"
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
SERVERS=(nbdkit qemu-nbd nbd-server rialto)
METRICS=("nbdcopy read MiB/s" "nbdcopy read --no-extents MiB/s" "nbdcopy write MiB/s" "4K randread IOPS QD1" "4K randread IOPS QD32")
if [ -n "${ONLY:-}" ]; then # e.g. ONLY="4K randread IOPS QD32" (experiments; OUT elsewhere)
  METRICS=("$ONLY")
fi
run_metric() {
  case $1 in
    "nbdcopy read MiB/s") nbdcopy_read ;;
    "nbdcopy read --no-extents MiB/s") nbdcopy_read --no-extents ;;
    "nbdcopy write MiB/s") nbdcopy_write ;;
    "4K randread IOPS QD1") fio_randread 1 ;;
    "4K randread IOPS QD32") fio_randread 32 ;;
  esac
}
# Interleave finely: for each repetition and each metric, every server runs
# once back to back (A B C D), in an order that rotates, so that the load on
# this shared machine changes as little as possible between peers.
i=0
for rep in $(seq 1 "$REPS"); do
  for metric in "${METRICS[@]}"; do
    k=$(( i % 4 )); i=$(( i + 1 ))
    order=("${SERVERS[@]:$k}" "${SERVERS[@]:0:$k}")
    for s in "${order[@]}"; do
      URI_CUR=${URI[$s]}
      measure "$s" "$metric" "$rep" run_metric "$metric"
    done
  done
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$(dirname "$OUT")"
python3 - "$RES" "$OUT" <<PY
import sys, statistics, collections
res, out = sys.argv[1], sys.argv[2]
vals = collections.defaultdict(list); steal = collections.defaultdict(list); cpu = collections.defaultdict(list); ccpu = collections.defaultdict(list)
metrics = []
for line in open(res):
    s, m, rep, v, st, c, cc = line.rstrip("\n").split("\t")
    if m not in metrics: metrics.append(m)
    vals[(s, m)].append(float(v)); steal[(s, m)].append(float(st)); cpu[(s, m)].append(float(c))
    if cc != "nan": ccpu[(s, m)].append(float(cc))
servers = ["nbdkit", "qemu-nbd", "nbd-server", "rialto"]
peers = servers[:3]
med = lambda xs: statistics.median(xs) if xs else float("nan")
def fmt(v):
    return f"{v/1000:.1f}K" if v >= 10000 else f"{v:.0f}"
L = []
L.append("## Block (NBD)\n")
L.append("Generated by \`bench/block/run.sh\` on $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) vCPU, kernel $(uname -r).")
L.append("Every server serves the same ${SIZE_MIB} MiB random-data image on a tmpfs (\`/dev/shm\`), bound to 127.0.0.1;")
L.append("runs are interleaved finely (for each repetition and metric the four servers run back to back, in a rotating order) and each figure is the median of $REPS runs.")
L.append("Ratio = rialto / best peer (higher is better). Versions: $(nbdkit --version 2>&1 | head -1), $(qemu-nbd --version | head -1), nbd-server $(nbd-server -V 2>&1 | grep -o '[0-9][0-9.]*' | head -1), $(nbdcopy --version | head -1), $(fio --version).")
L.append("")
L.append("| metric | " + " | ".join(servers) + " | best peer | ratio |")
L.append("|---|" + "---|" * (len(servers) + 2))
for m in metrics:
    row = [med(vals[(s, m)]) for s in servers]
    best = max(row[:3]); bi = peers[row[:3].index(best)]
    L.append(f"| {m} | " + " | ".join(fmt(v) for v in row) + f" | {bi} | **{row[3]/best:.2f}** |")
L.append("")
L.append("Server CPU seconds per run (median; utime+stime of the server process, from /proc/PID/stat):\n")
L.append("| metric | " + " | ".join(servers) + " |")
L.append("|---|" + "---|" * len(servers))
for m in metrics:
    L.append(f"| {m} | " + " | ".join(f"{med(cpu[(s, m)]):.2f}" for s in servers) + " |")
L.append("")
fio_metrics = [m for m in metrics if ccpu[(servers[0], m)]]
if fio_metrics:
    L.append("fio client CPU, % of one core (median; usr+sys from fio's JSON), and in brackets the client CPU per I/O.")
    L.append("fio's nbd engine drives libnbd from one thread: where it is near 100% the client bounds the IOPS, and a")
    L.append("server can only do better by costing the client less CPU per I/O.\n")
    L.append("| metric | " + " | ".join(servers) + " |")
    L.append("|---|" + "---|" * len(servers))
    for m in fio_metrics:
        L.append(f"| {m} | " + " | ".join(f"{med(ccpu[(s, m)]):.0f}% ({med(ccpu[(s, m)])*1e4/med(vals[(s, m)]):.1f} µs)" for s in servers) + " |")
    L.append("")
L.append("All runs (value; steal % of all CPU time during the run, from /proc/stat):\n")
L.append("| server | metric | runs | steal % |")
L.append("|---|---|---|---|")
for m in metrics:
    for s in servers:
        L.append(f"| {s} | {m} | " + ", ".join(fmt(v) for v in vals[(s, m)]) + " | " + ", ".join(f"{x:.1f}" for x in steal[(s, m)]) + " |")
L.append("")
L.append("Load average at start / end: $LOAD_START / $LOAD_END (a shared 2-vCPU VM: absolute figures are noisy,")
L.append("ratios come from interleaved runs).")
L.append("")
L.append("Commands (PORT differs per server; IMG and SRC are ${SIZE_MIB} MiB of /dev/urandom on tmpfs):\n")
L.append("\`\`\`")
L.append("nbdkit -f -i 127.0.0.1 -p PORT file IMG")
L.append("qemu-nbd -f raw -b 127.0.0.1 -p PORT -x '' -t -e 16 IMG")
L.append("nbd-server -C CONF   # [generic] listenaddr=127.0.0.1 port=PORT allowlist=false; [exp] exportname=IMG flush=true fua=true trim=true")
L.append("nbdserve -addr 127.0.0.1:PORT -name EXPORT -file IMG   # go build ./bench/block/nbdserve")
L.append("nbdcopy URI null:                    # read (and with --no-extents)")
L.append("nbdcopy SRC URI                      # write")
L.append("fio --name=randread --ioengine=nbd --uri=URI --rw=randread --bs=4k --iodepth={1,32} \\\\")
L.append("    --runtime=$FIO_RUNTIME --ramp_time=$FIO_RAMP --time_based --output-format=json")
L.append("\`\`\`")
open(out, "w").write("\n".join(L) + "\n")
print("wrote", out)
PY
