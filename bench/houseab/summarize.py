#!/usr/bin/env python3
"""Summarise bench/houseab/compare.sh's raw.txt: per metric, the median and
min–max of each side, the ratio of medians (after / before), the min–max of
the per-round paired ratios, and whether the difference is within noise.

    bench/houseab/summarize.py OUTDIR/raw.txt > table.md

Two verdicts per metric: "within spread" when each side's median lies
inside the other side's min–max range; "same side every round" when the
per-round paired ratios (after / before, measured back to back) are all
above or all below 1.0 -- a consistent difference even when the spreads
overlap (with 6 rounds, chance alone gives that 1 time in 32)."""
import json
import re
import statistics
import sys
from collections import defaultdict

HDR = re.compile(r"^### (\d+) (before|after) (\S+) steal=(\S+) wall=(\S+)")
BENCH = re.compile(r"^(Benchmark\S+?)(-\d+)?\s+(\d+)\s+(.*)$")
CP_CYC = re.compile(r"run 1: (\d+) lease cycles/s \(create p99 ([\d.]+) ms\), (\d+) cycles per CPU-second, ([\d.]+) writes")
CP_HB = re.compile(r"run 1: \d+ agents, (\d+) heartbeats/s, p99 heartbeat ([\d.]+) ms, p99 API ([\d.]+) ms")
CP_ROW = re.compile(r"^\| (release p99 during cycles \(ms\)|CPU cores the process got: cycle runs / heartbeat runs) \| ([^|]+) \|")

# (run name, metric) -> label, higher is better?
WANT = [
    ("BenchmarkPlace10k", "decisions/cpu-s", "Place10k: decisions per CPU-second", True),
    ("BenchmarkPlace10k", "cpu-µs/op", "Place10k: CPU µs per decision", False),
    ("BenchmarkPlace10k", "decisions/s", "Place10k: decisions/s (wall)", True),
    ("BenchmarkPlace10k", "allocs/op", "Place10k: allocations per decision", False),
    ("BenchmarkPlaceSelectors10k", "decisions/cpu-s", "PlaceSelectors10k: decisions per CPU-second", True),
    ("BenchmarkPlaceSelectors10k", "decisions/s", "PlaceSelectors10k: decisions/s (wall)", True),
    ("BenchmarkPlaceSelectors10k", "allocs/op", "PlaceSelectors10k: allocations per decision", False),
    ("BenchmarkNewIndex10k", "cpu-s/op", "NewIndex10k: CPU s per index", False),
    ("BenchmarkNewIndex10k", "s/op", "NewIndex10k: s per index (wall)", False),
    ("BenchmarkNewIndex10k", "allocs/op", "NewIndex10k: allocations per index", False),
    ("BenchmarkPlaceAdd10k", "decisions/cpu-s", "PlaceAdd10k: decisions per CPU-second", True),
    ("BenchmarkPlaceAdd10k", "decisions/s", "PlaceAdd10k: decisions/s (wall)", True),
    ("BenchmarkPlaceAdd10k", "allocs/op", "PlaceAdd10k: allocations per decision", False),
    ("BenchmarkLeaseCycle", "µs/op", "sqlite LeaseCycle: µs per cycle (wall)", False),
    ("controlplane", "cycles/s", "bench/controlplane: lease cycles/s (wall)", True),
    ("controlplane", "cycles/cpu-s", "bench/controlplane: lease cycles per CPU-second", True),
    ("controlplane", "cores", "bench/controlplane: CPU cores the process got (cycle run)", True),
    ("controlplane", "create p99 ms", "bench/controlplane: create p99 ms", False),
    ("controlplane", "release p99 ms", "bench/controlplane: release p99 ms", False),
    ("controlplane", "writes/txn", "bench/controlplane: lease writes per transaction", True),
    ("controlplane", "hb/s", "bench/controlplane: heartbeats/s (200 agents)", True),
    ("controlplane", "api p99 ms", "bench/controlplane: API p99 ms under heartbeats", False),
    ("productpath", "cycles_per_s", "product path: lease cycles/s (wall)", True),
    ("productpath", "cycles_per_server_cpu_s", "product path: lease cycles per server CPU-second", True),
    ("productpath", "server_cores", "product path: CPU cores the server got", True),
    ("productpath", "create_p50_ms", "product path: create p50 ms", False),
    ("productpath", "create_p99_ms", "product path: create p99 ms", False),
    ("productpath", "release_p50_ms", "product path: release p50 ms", False),
    ("productpath", "release_p99_ms", "product path: release p99 ms", False),
    ("productpath", "errors", "product path: errors", False),
]


def parse(path):
    # vals[(name, metric)][side][round] = value; steal[(name)][side] = [..]
    vals = defaultdict(lambda: defaultdict(dict))
    steal = defaultdict(lambda: defaultdict(list))
    cur = None
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        m = HDR.match(line)
        if m:
            cur = (int(m[1]), m[2], m[3])
            steal[m[3]][m[2]].append(m[4])
            continue
        if cur is None:
            continue
        r, side, name = cur
        put = lambda k, v: vals[(name, k)][side].__setitem__(r, float(v))
        if line.startswith("FAILED"):
            print(f"warning: round {r} {side} {name}: {line}", file=sys.stderr)
        m = BENCH.match(line)
        if m:
            f = m[4].split()
            for v, unit in zip(f[0::2], f[1::2]):
                put(unit, v)
                if unit == "ns/op":
                    put("s/op", float(v) / 1e9)
                    put("µs/op", float(v) / 1e3)
            continue
        m = CP_CYC.search(line)
        if m:
            put("cycles/s", m[1]); put("create p99 ms", m[2]); put("cycles/cpu-s", m[3]); put("writes/txn", m[4])
            continue
        m = CP_HB.search(line)
        if m:
            put("hb/s", m[1]); put("api p99 ms", m[3])
            continue
        m = CP_ROW.match(line)
        if m:
            if m[1].startswith("release"):
                put("release p99 ms", m[2].strip())
            else:
                put("cores", m[2].split("/")[0].strip())
            continue
        if line.startswith("{") and name == "productpath":
            j = json.loads(line)
            for k, v in j.items():
                if isinstance(v, (int, float)):
                    put(k, v)
            if j.get("server_cpu_s"):
                put("cycles_per_server_cpu_s", j["cycles"] / j["server_cpu_s"])
                put("server_cores", j["server_cpu_s"] / j["wall_s"])
    return vals, steal


def fmt(v):
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000:
        return f"{v:.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def main():
    vals, steal = parse(sys.argv[1])
    print("| measurement | before: median (min–max) | after: median (min–max) | ratio after/before | per-round ratios min–max | runs | within spread? | same side every round? |")
    print("|---|---|---|---|---|---|---|---|")
    for name, metric, label, _ in WANT:
        d = vals.get((name, metric))
        if not d:
            continue
        b, a = d.get("before", {}), d.get("after", {})
        if not b or not a:
            continue
        bv, av = list(b.values()), list(a.values())
        bm, am = statistics.median(bv), statistics.median(av)
        rounds = sorted(set(b) & set(a))
        pr = [a[r] / b[r] for r in rounds if b[r]]
        ratio = am / bm if bm else float("nan")
        if bm == am:
            within, side = "identical", "—"
        else:
            overlap = min(bv) <= am <= max(bv) and min(av) <= bm <= max(av)
            within = "yes" if overlap else "**no**"
            if pr and min(pr) > 1:
                side = "**yes, higher**"
            elif pr and max(pr) < 1:
                side = "**yes, lower**"
            else:
                side = "no"
        prs = f"{min(pr):.2f}–{max(pr):.2f}" if pr else "n/a"
        rs = f"{ratio:.2f}" if bm else "—"
        print(f"| {label} | {fmt(bm)} ({fmt(min(bv))}–{fmt(max(bv))}) | {fmt(am)} ({fmt(min(av))}–{fmt(max(av))}) | {rs} | {prs} | {len(bv)}+{len(av)} | {within} | {side} |")
    print()
    print("Steal (% of all CPU time during each run, from /proc/stat), by run and side:")
    print()
    print("| run | before | after |")
    print("|---|---|---|")
    for name in steal:
        print(f"| {name} | {', '.join(steal[name]['before'])} | {', '.join(steal[name]['after'])} |")
    print()
    print("All values per round (before → after):")
    print()
    print("| measurement | before, by round | after, by round |")
    print("|---|---|---|")
    for name, metric, label, _ in WANT:
        d = vals.get((name, metric))
        if not d:
            continue
        b, a = d.get("before", {}), d.get("after", {})
        print(f"| {label} | {', '.join(fmt(b[r]) for r in sorted(b))} | {', '.join(fmt(a[r]) for r in sorted(a))} |")


if __name__ == "__main__":
    main()
