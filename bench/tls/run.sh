#!/usr/bin/env bash
# TLS benchmark, through the product path: leases created through the API of
# `rialto server` processes and served by `rialto agent` processes, images
# on tmpfs. Writes docs/bench/tls.md:
#   - NBD over TLS: a block lease of a TLS agent (nbds://, the node
#     certificate) against `nbdkit --tls=require` serving the same image
#     with the same certificate and key; nbdcopy read and write, 4 KiB
#     random reads at QD1 and QD32 (fio's nbd engine). Both negotiate TLS
#     1.3 with AES-128-GCM: GnuTLS (nbdkit, libnbd) is held to it by a
#     priority override (GNUTLS_SYSTEM_PRIORITY_FILE), Go picks it for a
#     client that offers nothing else.
#   - memory: a memory lease of the TLS agent (rialto-mems://) against one
#     of a plaintext agent (--insecure-dataplane): 4 KiB synchronous read
#     p50/p99 and bulk reads.
#   - API: lease cycles/s (create and release of a block lease) against a
#     control plane over HTTPS with its agent over mutual TLS, and one over
#     plain HTTP (--insecure-http) with a plaintext agent.
# Interleaved (rotating order), medians of REPS runs, steal recorded.
#
#   bench/tls/run.sh                  # REPS=5 SIZE_MIB=1024 FIO_RUNTIME=4 by default
#   METRICS="4K randread IOPS QD1" NBD_ONLY=1 REPS=5 OUT=/tmp/qd1.md bench/tls/run.sh
#                                     # one NBD metric, no memory or API runs
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
REPS=${REPS:-5}
SIZE_MIB=${SIZE_MIB:-1024}
MEM_MIB=${MEM_MIB:-64}
FIO_RUNTIME=${FIO_RUNTIME:-4}
FIO_RAMP=${FIO_RAMP:-1}
CYCLE_SECONDS=${CYCLE_SECONDS:-5}
OUT=${OUT:-docs/bench/tls.md}

for tool in nbdkit nbdcopy nbdinfo fio python3 go curl; do
  command -v "$tool" >/dev/null || { echo "bench/tls: $tool not installed" >&2; exit 1; }
done

WORK=$(mktemp -d /dev/shm/rialto-bench-tls.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

go build -o "$WORK/rialto" ./cmd/rialto
(cd bench && go build -o "$WORK/tls-bench" ./tls)
COMMIT=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo "+dirty")
R=$WORK/rialto

# GnuTLS (nbdkit and libnbd's tools) is held to AES-128-GCM.
cat > "$WORK/gnutls.conf" <<'CONF'
[overrides]
tls-disabled-cipher = AES-256-GCM
tls-disabled-cipher = CHACHA20-POLY1305
tls-disabled-cipher = AES-256-CCM
tls-disabled-cipher = AES-128-CCM
tls-disabled-cipher = AES-256-CBC
tls-disabled-cipher = AES-128-CBC
CONF
export GNUTLS_SYSTEM_PRIORITY_FILE=$WORK/gnutls.conf

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
secret() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
waitfor() { # what, command...
  local what=$1; shift
  for _ in $(seq 1 400); do "$@" >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "bench/tls: $what did not come up" >&2; exit 1
}

echo "rat_$(secret)" > "$WORK/admin.token"
echo "rbt_$(secret)" > "$WORK/boot.token"
chmod 600 "$WORK"/*.token
IMG=$WORK/disk.img
SRC=$WORK/src.img
head -c "${SIZE_MIB}M" /dev/urandom > "$IMG"
head -c "${SIZE_MIB}M" /dev/urandom > "$SRC"

# Cluster A: HTTPS, agents enrolled, data planes over TLS.
P_A=$(port)
"$R" server --listen "127.0.0.1:$P_A" --db "$WORK/a.db" --tls-dir "$WORK/tls" \
  --bootstrap-token-file "$WORK/boot.token" --admin-token-file "$WORK/admin.token" --log-level warn \
  >"$WORK/server-a.log" 2>&1 & PIDS+=($!)
URL_A=https://127.0.0.1:$P_A
CA=$WORK/tls/ca-cert.pem
waitfor "the HTTPS control plane" curl -sf --cacert "$CA" "$URL_A/healthz"
RIALTO_BOOTSTRAP_TOKEN=$(cat "$WORK/boot.token") "$R" agent --control-plane "$URL_A" --cacert "$CA" --name tls \
  --state-dir "$WORK/agent-tls" --block "disk0=$IMG:${SIZE_MIB}MiB" --block "cyc=$WORK/cyc-a.img:256MiB" \
  --memory "${MEM_MIB}MiB" --log-level warn >"$WORK/agent-tls.log" 2>&1 & PIDS+=($!); PID_AGENT_TLS=$!

# Cluster B: plain HTTP, a plaintext agent (--insecure-dataplane).
P_B=$(port)
"$R" server --listen "127.0.0.1:$P_B" --db "$WORK/b.db" --insecure-http \
  --bootstrap-token-file "$WORK/boot.token" --admin-token-file "$WORK/admin.token" --log-level warn \
  >"$WORK/server-b.log" 2>&1 & PIDS+=($!)
URL_B=http://127.0.0.1:$P_B
waitfor "the HTTP control plane" curl -sf "$URL_B/healthz"
RIALTO_BOOTSTRAP_TOKEN=$(cat "$WORK/boot.token") "$R" agent --control-plane "$URL_B" --insecure-dataplane --name plain \
  --state-dir "$WORK/agent-plain" --block "cyc=$WORK/cyc-b.img:256MiB" --memory "${MEM_MIB}MiB" \
  --log-level warn >"$WORK/agent-plain.log" 2>&1 & PIDS+=($!)

cli_a() { RIALTO_ADDR=$URL_A RIALTO_CACERT=$CA "$R" "$@" --token-file "$WORK/admin.token"; }
cli_b() { RIALTO_ADDR=$URL_B "$R" "$@" --token-file "$WORK/admin.token"; }
ready() { [ "$("$@" nodes -o json | python3 -c 'import json,sys; print(sum(n["state"]=="ready" for n in json.load(sys.stdin)))')" = 1 ]; }
waitfor "the TLS agent" ready cli_a
waitfor "the plaintext agent" ready cli_b

field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
BLK_JSON=$(cli_a lease create --kind block --size "${SIZE_MIB}MiB" --affinity tls --ttl 24h -o json)
BLK_URI=$(echo "$BLK_JSON" | field '["uri"]')
[ "$(echo "$BLK_JSON" | field '["parts"][0]["offset"]')" = 0 ] || { echo "bench/tls: the lease is not the whole image" >&2; exit 1; }
case $BLK_URI in nbds://*) ;; *) echo "bench/tls: the TLS agent's lease is not nbds://" >&2; exit 1 ;; esac
MEM_TLS=$(cli_a lease create --kind memory --size "${MEM_MIB}MiB" --ttl 24h -o json | field '["id"]')
MEM_PLAIN=$(cli_b lease create --kind memory --size "${MEM_MIB}MiB" --ttl 24h -o json | field '["id"]')

# nbdkit serves the same image with the agent's own node certificate and key.
NK=$WORK/nbdkit-tls
mkdir -p "$NK"
cp "$CA" "$NK/ca-cert.pem"
cp "$WORK/agent-tls/node-cert.pem" "$NK/server-cert.pem"
cp "$WORK/agent-tls/node-key.pem" "$NK/server-key.pem"
chmod 600 "$NK/server-key.pem"
P_NBDKIT=$(port)
nbdkit -f -i 127.0.0.1 -p "$P_NBDKIT" --tls=require --tls-certificates="$NK" file "$IMG" 2>"$WORK/nbdkit.log" & PIDS+=($!); PID_NBDKIT=$!

# Clients trust the CA: a tls-certificates directory (nbdcopy), and
# $HOME/.pki/libnbd for fio (which refuses files named in URIs).
CT=$WORK/client-tls
mkdir -p "$CT" "$WORK/home/.pki/libnbd"
cp "$CA" "$CT/ca-cert.pem"
cp "$CA" "$WORK/home/.pki/libnbd/ca-cert.pem"
declare -A URI=([nbdkit]="nbds://127.0.0.1:$P_NBDKIT/" [rialto]="$BLK_URI")
declare -A PID=([nbdkit]=$PID_NBDKIT [rialto]=$PID_AGENT_TLS)
waitfor "nbdkit" nbdinfo --size "${URI[nbdkit]}?tls-certificates=$CT"
for s in nbdkit rialto; do
  nbdinfo --size "${URI[$s]}?tls-certificates=$CT" >/dev/null
  LIBNBD_DEBUG=1 nbdinfo --size "${URI[$s]}?tls-certificates=$CT" 2>&1 | grep -o 'connection is using TLS.*' | head -1 > "$WORK/cipher-$s" || true
  "$WORK/tls-bench" tlsinfo -uri "${URI[$s]}" -cacert "$CA" > "$WORK/goclient-$s"
done

cpustat() { awk '/^cpu /{t=0; for(i=2;i<=NF;i++) t+=$i; print $9, t}' /proc/stat; }
proccpu() { awk '{print $14+$15+$16+$17}' "/proc/$1/stat" 2>/dev/null || echo 0; }
RES=$WORK/results.tsv
: > "$RES"
measure() { # who metric rep pid -- command...
  local who=$1 metric=$2 rep=$3 pid=$4; shift 4
  local s0 t0 c0 s1 t1 c1 value
  read -r s0 t0 < <(cpustat); c0=$(proccpu "$pid")
  value=$("$@") || value=nan
  read -r s1 t1 < <(cpustat); c1=$(proccpu "$pid")
  local steal cpu
  steal=$(python3 -c "print(f'{100*($s1-$s0)/max(1,$t1-$t0):.1f}')")
  cpu=$(python3 -c "import os; print(f'{($c1-$c0)/os.sysconf(\"SC_CLK_TCK\"):.2f}')")
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$who" "$metric" "$rep" "$value" "$steal" "$cpu" >> "$RES"
  printf '%-8s %-26s rep %s: %s (steal %s%%, server cpu %ss)\n' "$who" "$metric" "$rep" "$value" "$steal" "$cpu" >&2
}

nbdcopy_read() {
  local t0 t1; t0=$(date +%s.%N)
  nbdcopy "$URI_CUR?tls-certificates=$CT" null: >/dev/null || return 1
  t1=$(date +%s.%N)
  python3 -c "print(f'{$SIZE_MIB/($t1-$t0):.0f}')"
}
nbdcopy_write() {
  local t0 t1; t0=$(date +%s.%N)
  nbdcopy "$SRC" "$URI_CUR?tls-certificates=$CT" >/dev/null || return 1
  t1=$(date +%s.%N)
  python3 -c "print(f'{$SIZE_MIB/($t1-$t0):.0f}')"
}
fio_randread() {
  HOME=$WORK/home fio --name=randread --ioengine=nbd --uri="$URI_CUR" --rw=randread --bs=4k --iodepth="$1" \
      --runtime="$FIO_RUNTIME" --ramp_time="$FIO_RAMP" --time_based --output-format=json --output="$WORK/fio.json" >/dev/null || return 1
  python3 -c "import json; j=json.load(open('$WORK/fio.json')); print(f\"{j['jobs'][0]['read']['iops']:.0f}\")"
}
mem_run() { # lease cli-flags...
  local lease=$1; shift
  "$WORK/tls-bench" mem -lease "$lease" "$@" > "$WORK/mem.out" || return 1
  cat "$WORK/mem.out"
}
mem_p50() { awk '{print $1}' "$WORK/mem.out"; }

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
NBD_METRICS=("nbdcopy read MiB/s" "nbdcopy write MiB/s" "4K randread IOPS QD1" "4K randread IOPS QD32")
if [ -n "${METRICS:-}" ]; then IFS=',' read -r -a NBD_METRICS <<< "$METRICS"; fi
SERVERS=(nbdkit rialto)
i=0
for rep in $(seq 1 "$REPS"); do
  for metric in "${NBD_METRICS[@]}"; do
    k=$(( i % 2 )); i=$(( i + 1 ))
    order=("${SERVERS[@]:$k}" "${SERVERS[@]:0:$k}")
    for s in "${order[@]}"; do
      URI_CUR=${URI[$s]}
      case $metric in
        "nbdcopy read MiB/s") measure "$s" "$metric" "$rep" "${PID[$s]}" nbdcopy_read ;;
        "nbdcopy write MiB/s") measure "$s" "$metric" "$rep" "${PID[$s]}" nbdcopy_write ;;
        "4K randread IOPS QD1") measure "$s" "$metric" "$rep" "${PID[$s]}" fio_randread 1 ;;
        "4K randread IOPS QD32") measure "$s" "$metric" "$rep" "${PID[$s]}" fio_randread 32 ;;
      esac
    done
  done
  [ -n "${NBD_ONLY:-}" ] && continue
  # Memory: TLS and plaintext leases, alternating first.
  for which in $( [ $((rep % 2)) = 1 ] && echo "tls plain" || echo "plain tls" ); do
    if [ "$which" = tls ]; then
      out=$(mem_run "$MEM_TLS" -addr "$URL_A" -cacert "$CA" -token-file "$WORK/admin.token") || out="nan nan nan"
    else
      out=$(mem_run "$MEM_PLAIN" -addr "$URL_B" -token-file "$WORK/admin.token") || out="nan nan nan"
    fi
    read -r p50 p99 bulk <<< "$out"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$which" "memory 4K read p50 µs" "$rep" "$p50" nan nan >> "$RES"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$which" "memory 4K read p99 µs" "$rep" "$p99" nan nan >> "$RES"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$which" "memory bulk read MiB/s" "$rep" "$bulk" nan nan >> "$RES"
    echo "memory $which rep $rep: p50 $p50 µs, p99 $p99 µs, bulk $bulk MiB/s" >&2
  done
  # API: lease cycles over HTTPS (mutual TLS to the agent) and HTTP.
  for which in $( [ $((rep % 2)) = 1 ] && echo "https http" || echo "http https" ); do
    if [ "$which" = https ]; then
      v=$("$WORK/tls-bench" cycles -addr "$URL_A" -cacert "$CA" -token-file "$WORK/admin.token" -duration "${CYCLE_SECONDS}s") || v=nan
    else
      v=$("$WORK/tls-bench" cycles -addr "$URL_B" -token-file "$WORK/admin.token" -duration "${CYCLE_SECONDS}s") || v=nan
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$which" "API lease cycles/s" "$rep" "$v" nan nan >> "$RES"
    echo "API $which rep $rep: $v lease cycles/s" >&2
  done
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

CIPHER_NBDKIT=$(cat "$WORK/cipher-nbdkit"); CIPHER_RIALTO=$(cat "$WORK/cipher-rialto")
GO_NBDKIT=$(cat "$WORK/goclient-nbdkit"); GO_RIALTO=$(cat "$WORK/goclient-rialto")
GOAMD64=$(go env GOAMD64)
mkdir -p "$(dirname "$OUT")"
python3 - "$RES" "$OUT" <<PY
import sys, statistics, collections
res, out = sys.argv[1], sys.argv[2]
vals = collections.defaultdict(list); steal = collections.defaultdict(list); cpu = collections.defaultdict(list)
order = []
for line in open(res):
    w, m, rep, v, st, c = line.rstrip("\n").split("\t")
    if m not in order: order.append(m)
    vals[(w, m)].append(float(v))
    if st != "nan": steal[(w, m)].append(float(st))
    if c != "nan": cpu[(w, m)].append(float(c))
med = lambda xs: statistics.median([x for x in xs if x == x]) if [x for x in xs if x == x] else float("nan")
def fmt(v):
    return f"{v/1000:.1f}K" if v >= 10000 else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")
L = []
L.append("## TLS\n")
L.append("Generated by \`bench/tls/run.sh\` on $(date -u +%Y-%m-%dT%H:%MZ) at commit $COMMIT, $(nproc) vCPU, kernel $(uname -r), $(go version | cut -d' ' -f3) (GOAMD64=$GOAMD64; the CPU has AES-NI and PCLMULQDQ: $(grep -m1 -o -w aes /proc/cpuinfo | head -1)).")
L.append("Everything goes through the product path: leases created through the API of \`rialto server\` processes and served by \`rialto agent\` processes, the images on tmpfs (\`/dev/shm\`).")
L.append("Runs are interleaved (rotating order) and each figure is the median of $REPS runs.")
L.append("")
L.append("### NBD over TLS against nbdkit\n")
L.append("A ${SIZE_MIB} MiB block lease of a TLS agent (\`nbds://\`, served with its node certificate) and \`nbdkit --tls=require\` serving the same image file with the same certificate and key (ECDSA P-256, from the cluster CA).")
L.append("Both negotiate TLS 1.3 with AES-128-GCM: GnuTLS (nbdkit, and libnbd in nbdcopy and fio) is held to it by a priority override, Go's server picks it for a client offering nothing else. As libnbd reported it:")
L.append("")
L.append("- nbdkit: \`$CIPHER_NBDKIT\`")
L.append("- rialto: \`$CIPHER_RIALTO\`")
L.append("")
L.append("and as Go's client (\`tls-bench tlsinfo\`) saw them: nbdkit \`$GO_NBDKIT\`, rialto \`$GO_RIALTO\`.")
L.append("")
L.append("| metric | nbdkit --tls=require | rialto agent (nbds://) | ratio |")
L.append("|---|---|---|---|")
nbd = [m for m in order if not m.startswith("memory") and not m.startswith("API")]
for m in nbd:
    a, b = med(vals[("nbdkit", m)]), med(vals[("rialto", m)])
    L.append(f"| {m} | {fmt(a)} | {fmt(b)} | **{b/a:.2f}** |")
L.append("")
L.append("Server CPU seconds per run (median; the nbdkit process, the rialto agent process):\n")
L.append("| metric | nbdkit | rialto |")
L.append("|---|---|---|")
for m in nbd:
    L.append(f"| {m} | {med(cpu[('nbdkit', m)]):.2f} | {med(cpu[('rialto', m)]):.2f} |")
L.append("")
L.append("### Memory with and without TLS\n")
L.append("A ${MEM_MIB} MiB memory lease of the TLS agent (\`rialto-mems://\`) and one of a plaintext agent (\`--insecure-dataplane\`, \`rialto-mem://\`), read by \`bench/tls\`'s client through the lease's URI: 4 KiB reads on the synchronous channel (one at a time; p50 and p99 of 20,000) and bulk reads of the whole region (the bulk channel, 2 streams of 512 KiB chunks).")
L.append("")
L.append("| metric | plaintext | TLS | TLS / plaintext |")
L.append("|---|---|---|---|")
for m in [m for m in order if m.startswith("memory")]:
    a, b = med(vals[("plain", m)]), med(vals[("tls", m)])
    L.append(f"| {m} | {fmt(a)} | {fmt(b)} | {b/a:.2f} |")
L.append("")
L.append("### API lease cycles\n")
L.append("Lease cycles (create, then release, of a 1 MiB block lease; 8 concurrent clients, ${CYCLE_SECONDS} s per run) against a control plane serving HTTPS whose agent is called over mutual TLS, and one serving plain HTTP (\`--insecure-http\`) with a plaintext agent. Each cycle is two API calls and two lender calls (prepare, teardown).")
L.append("")
L.append("| metric | HTTP | HTTPS | HTTPS / HTTP |")
L.append("|---|---|---|---|")
for m in [m for m in order if m.startswith("API")]:
    a, b = med(vals[("http", m)]), med(vals[("https", m)])
    L.append(f"| {m} | {fmt(a)} | {fmt(b)} | {b/a:.2f} |")
L.append("")
L.append("All runs (value; steal % of all CPU time during the run, from /proc/stat, for the NBD rows):\n")
L.append("| who | metric | runs | steal % |")
L.append("|---|---|---|---|")
for m in order:
    for w in ["nbdkit", "rialto", "plain", "tls", "http", "https"]:
        if (w, m) in vals:
            L.append(f"| {w} | {m} | " + ", ".join(fmt(v) for v in vals[(w, m)]) + " | " + (", ".join(f"{x:.1f}" for x in steal[(w, m)]) or "-") + " |")
L.append("")
L.append("Load average at start / end: $LOAD_START / $LOAD_END (a shared 2-vCPU VM: absolute figures are noisy; ratios come from interleaved runs).")
L.append("")
L.append("Commands (PORT differs per server; IMG and SRC are ${SIZE_MIB} MiB of /dev/urandom on tmpfs; CT holds ca-cert.pem):\n")
L.append("\`\`\`")
L.append("rialto server --tls-dir TLS --bootstrap-token-file F --admin-token-file F          # and --insecure-http for the HTTP one")
L.append("rialto agent --cacert TLS/ca-cert.pem --block disk0=IMG:${SIZE_MIB}MiB --memory ${MEM_MIB}MiB   # and --insecure-dataplane")
L.append("rialto lease create --kind block --size ${SIZE_MIB}MiB                              # → nbds://127.0.0.1:PORT/EXPORT")
L.append("nbdkit -f -i 127.0.0.1 -p PORT --tls=require --tls-certificates=DIR file IMG      # DIR: the agent's node-cert.pem/node-key.pem as server-cert.pem/server-key.pem")
L.append("GNUTLS_SYSTEM_PRIORITY_FILE=F   # [overrides] tls-disabled-cipher = AES-256-GCM, CHACHA20-POLY1305, AES-{128,256}-{CCM,CBC}")
L.append("nbdcopy 'URI?tls-certificates=CT' null:       # read")
L.append("nbdcopy SRC 'URI?tls-certificates=CT'        # write")
L.append("HOME=H fio --name=randread --ioengine=nbd --uri=URI --rw=randread --bs=4k --iodepth={1,32} \\\\")
L.append("    --runtime=$FIO_RUNTIME --ramp_time=$FIO_RAMP --time_based   # H/.pki/libnbd/ca-cert.pem")
L.append("tls-bench mem -lease ID -addr URL [-cacert CA] -token-file F     # (cd bench && go build ./tls)")
L.append("tls-bench cycles -addr URL [-cacert CA] -token-file F -duration ${CYCLE_SECONDS}s")
L.append("\`\`\`")
open(out, "w").write("\n".join(L) + "\n")
print("wrote", out)
PY
