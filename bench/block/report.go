package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/rialto-project/rialto/bench/internal/stats"
	"github.com/rialto-project/rialto/bench/internal/targets"
)

type report struct {
	reps, fioRuntime, fioRamp int
	sizeMiB                   int64
	targets                   []*targets.Target
	metrics                   []metric
	res                       []result
	commands                  []string
	loadStart, loadEnd        float64
}

func (r *report) runs(target, metric string) []result {
	var out []result
	for _, x := range r.res {
		if x.target == target && x.metric == metric {
			out = append(out, x)
		}
	}
	return out
}

// med returns the median of f over the successful runs.
func (r *report) med(target, metric string, f func(result) float64) float64 {
	var xs []float64
	for _, x := range r.runs(target, metric) {
		if x.err == nil {
			xs = append(xs, f(x))
		}
	}
	return stats.Median(xs)
}

func value(x result) float64 { return x.s.value }

func fmtv(v float64, unit string) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case unit == "IOPS" && v >= 10000:
		return fmt.Sprintf("%.1fK", v/1000)
	case unit == "µs":
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// againstReferences writes, for each reference peer (a two-hop chain),
// each Rialto target's ratio to it: no goal, a measure of the hop that
// `rialto attach` adds against the field's own.
func (r *report) againstReferences(w func(string, ...any), rialto []*targets.Target) {
	for _, ref := range r.targets {
		if !ref.Reference {
			continue
		}
		w("Against %s (no goal; the same ratios as above, with %s in place of the best peer):\n\n", ref.Name, ref.Name)
		w("| metric | %s |\n|---|%s\n", joinNames(rialto), strings.Repeat("---|", len(rialto)))
		for _, m := range r.metrics {
			w("| %s | ", m.Name)
			k := r.med(ref.Name, m.Name, value)
			for _, t := range rialto {
				v := r.med(t.Name, m.Name, value)
				ratio := v / k
				if m.Lower {
					ratio = k / v
				}
				w("%.2f× | ", ratio)
			}
			w("\n")
		}
		w("\n")
	}
}

// verdict compares a Rialto target's median with the goal of m: the best
// peer (higher is better) or nbdkit's (latency, lower is better).
func (r *report) verdict(m metric, t *targets.Target) (ratio float64, ref string, ok bool) {
	v := r.med(t.Name, m.Name, value)
	if m.Goal == "nbdkit" {
		k := r.med("nbdkit", m.Name, value)
		return k / v, "nbdkit", v <= k
	}
	best, bestName := math.NaN(), ""
	for _, p := range r.targets {
		if p.Rialto || p.Reference {
			continue
		}
		pv := r.med(p.Name, m.Name, value)
		if math.IsNaN(best) || pv > best {
			best, bestName = pv, p.Name
		}
	}
	return v / best, bestName, v >= best
}

func (r *report) markdown() string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	var peers, rialto []*targets.Target
	for _, t := range r.targets {
		if t.Rialto {
			rialto = append(rialto, t)
		} else {
			peers = append(peers, t)
		}
	}
	w("## Block (NBD): Rialto through leases against nbdkit, nbd-server and qemu-nbd\n\n")
	w("Measured %s by `bench/block/run.sh` (bench/block) at commit %s on %s.\n", stats.Stamp(), stats.Commit("."), stats.Machine())
	w("Every export is %d MiB on a tmpfs (`/dev/shm`), bound to 127.0.0.1, filled with the same random data before the first run.\n", r.sizeMiB)
	w("Rialto is measured through leases created by `rialto lease create` against a `rialto server` process and served by separate\n")
	w("`rialto agent` processes (the product path; no side server). For each repetition and metric every target runs once, back to\n")
	w("back, in an order that rotates; each figure is the median of %d runs. fio runs %d s after a %d s ramp.\n\n", r.reps, r.fioRuntime, r.fioRamp)
	w("Which process served each column:\n\n| column | served by |\n|---|---|\n")
	for _, t := range r.targets {
		w("| %s | %s |\n", t.Name, t.Served)
	}
	w("\n")

	// Main table.
	w("| metric | ")
	for _, t := range r.targets {
		w("%s | ", t.Name)
	}
	w("best peer | ")
	for _, t := range rialto {
		w("%s ratio | ", t.Name)
	}
	w("\n|---|")
	w("%s", strings.Repeat("---|", len(r.targets)+1+len(rialto)))
	w("\n")
	met, total := 0, 0
	var misses []string
	for _, m := range r.metrics {
		w("| %s (%s) | ", m.Name, m.Unit)
		for _, t := range r.targets {
			w("%s | ", fmtv(r.med(t.Name, m.Name, value), m.Unit))
		}
		_, ref, _ := r.verdict(m, rialto0(rialto))
		w("%s | ", ref)
		for _, t := range rialto {
			ratio, ref, ok := r.verdict(m, t)
			mark := "✗"
			total++
			if ok {
				mark = "✓"
				met++
			} else if !math.IsNaN(ratio) {
				misses = append(misses, fmt.Sprintf("%s on the %s target: %.2f× %s", m.Name, t.Name, ratio, ref))
			}
			w("%.2f× %s | ", ratio, mark)
		}
		w("\n")
	}
	w("\nRatio: Rialto ÷ best peer for throughput and IOPS (higher is better); for the two latency rows, nbdkit's p50 ÷ Rialto's\n")
	w("(so ≥ 1.00× means Rialto's p50 is at most nbdkit's). Goals (the issue \"The product path is the proven path\"): every\n")
	w("throughput row ≥ 1.0× the best peer, both latency rows ≤ nbdkit's; ✓ met, ✗ not met. Met %d of %d.\n", met, total)
	if len(misses) > 0 {
		w("Missed: %s.\n", strings.Join(misses, "; "))
	}
	w("\n")
	r.againstReferences(w, rialto)

	// Server CPU.
	w("Server CPU per run (median, seconds: utime+stime of the serving processes from /proc/PID/stat, children included;\n")
	w("for the attach targets the agents and the attach process together), and per unit of work in brackets\n")
	w("(µs per I/O for IOPS rows, s per GiB for MiB/s rows, µs per write for latency rows):\n\n")
	w("| metric | %s |\n|---|%s\n", joinNames(r.targets), strings.Repeat("---|", len(r.targets)))
	for _, m := range r.metrics {
		w("| %s | ", m.Name)
		for _, t := range r.targets {
			cpu := r.med(t.Name, m.Name, func(x result) float64 { return x.serverCPU })
			per := r.med(t.Name, m.Name, func(x result) float64 { return perUnit(x, m, r.fioRuntime+r.fioRamp, x.serverCPU) })
			w("%.2f (%s) | ", cpu, fmtPer(per, m))
		}
		w("\n")
	}
	w("\nClient CPU per run (median seconds; nbdcopy: its rusage; fio: usr+sys from its JSON over the %d s run, one thread of\n", r.fioRuntime)
	w("fio driving libnbd), and per unit of work in brackets:\n\n")
	w("| metric | %s |\n|---|%s\n", joinNames(r.targets), strings.Repeat("---|", len(r.targets)))
	for _, m := range r.metrics {
		w("| %s | ", m.Name)
		for _, t := range r.targets {
			cpu := r.med(t.Name, m.Name, func(x result) float64 { return x.s.clientCPU })
			per := r.med(t.Name, m.Name, func(x result) float64 { return perUnit(x, m, r.fioRuntime, x.s.clientCPU) })
			w("%.2f (%s) | ", cpu, fmtPer(per, m))
		}
		w("\n")
	}

	w("\nAll runs, in run order per target (value; steal %% of all CPU time during the run from /proc/stat; server CPU s; the\n")
	w("1-minute load average when the run started; a secondary figure where there is one):\n\n")
	w("| metric | target | values | steal %% | server CPU s | load | other |\n|---|---|---|---|---|---|---|\n")
	for _, m := range r.metrics {
		for _, t := range r.targets {
			var vs, st, cpu, ld, ex []string
			for _, x := range r.runs(t.Name, m.Name) {
				if x.err != nil {
					vs = append(vs, "error")
				} else {
					vs = append(vs, fmtv(x.s.value, m.Unit))
				}
				st = append(st, fmt.Sprintf("%.1f", x.steal))
				cpu = append(cpu, fmt.Sprintf("%.2f", x.serverCPU))
				ld = append(ld, fmt.Sprintf("%.2f", x.load))
				if x.s.extra != "" {
					ex = append(ex, x.s.extra)
				}
			}
			w("| %s | %s | %s | %s | %s | %s | %s |\n", m.Name, t.Name, strings.Join(vs, ", "), strings.Join(st, ", "),
				strings.Join(cpu, ", "), strings.Join(ld, ", "), strings.Join(ex, "; "))
		}
	}
	var errs []string
	for _, x := range r.res {
		if x.err != nil {
			errs = append(errs, fmt.Sprintf("%s rep %d on %s: %v", x.metric, x.rep, x.target, x.err))
		}
	}
	if len(errs) > 0 {
		w("\nFailed runs (left out of the medians):\n\n")
		for _, e := range errs {
			w("- %s\n", e)
		}
	}
	w("\nLoad average (1 min) at start / end: %.2f / %.2f. This is a shared VM: absolute figures move with the other tenants;\n", r.loadStart, r.loadEnd)
	w("the ratios come from runs interleaved in time.\n\n")
	w("Commands (URI is the target's NBD URI; SRC and the peers' IMG are %d MiB of /dev/urandom on tmpfs; the fio options go in a\n", r.sizeMiB)
	w("job file so that a lease's URI, which names a secret export, stays out of `ps`):\n\n```\n")
	for _, t := range peers {
		w("%s\n", targets.Peers[t.Name])
	}
	for _, c := range r.commands {
		w("%s\n", c)
	}
	for _, m := range r.metrics {
		if strings.HasPrefix(m.Cmd, "fio") {
			note := m.Name
			if m.Note != "" {
				note += ": " + m.Note
			}
			w("%s --ioengine=nbd --uri=URI --runtime=%d --ramp_time=%d --time_based --lat_percentiles=1 --output-format=json   # %s\n", m.Cmd, r.fioRuntime, r.fioRamp, note)
		} else {
			w("%s   # %s\n", m.Cmd, m.Name)
		}
	}
	w("```\n\nVersions: %s; %s; %s; %s; %s.\n", stats.Version("nbdkit", "--version"), stats.Version("qemu-nbd", "--version"),
		stats.Version("nbd-server", "-V"), stats.Version("nbdcopy", "--version"), stats.Version("fio", "--version"))
	return sb.String()
}

func rialto0(ts []*targets.Target) *targets.Target {
	if len(ts) == 0 {
		return &targets.Target{Name: "none"}
	}
	return ts[0]
}

func joinNames(ts []*targets.Target) string {
	var s []string
	for _, t := range ts {
		s = append(s, t.Name)
	}
	return strings.Join(s, " | ")
}

// perUnit is cpu per GiB (s) for MiB/s rows, else per I/O (µs); a fio
// run does secs seconds of I/O at its measured rate.
func perUnit(x result, m metric, secs int, cpu float64) float64 {
	switch {
	case x.s.bytes > 0:
		return cpu / (x.s.bytes / (1 << 30))
	case m.Unit == "MiB/s" && x.s.value > 0:
		return cpu / (x.s.value * float64(secs) / 1024)
	case x.s.iops > 0:
		return cpu / (x.s.iops * float64(secs)) * 1e6
	}
	return math.NaN()
}

func fmtPer(v float64, m metric) string {
	if math.IsNaN(v) {
		return "—"
	}
	if m.Unit == "MiB/s" {
		return fmt.Sprintf("%.2f s/GiB", v)
	}
	return fmt.Sprintf("%.1f µs", v)
}
