// Command summarize turns the raw output of bench/houseab's scripts into
// the Markdown tables of docs/bench/house.md.
//
//	go run ./bench/houseab/summarize OUTDIR/raw.txt > table.md                    # compare.sh
//	go run ./bench/houseab/summarize -steps OUTDIR/steps.txt LABEL... > t.md      # steps.sh
//	go run ./bench/houseab/summarize -pathsteps OUTDIR/pathsteps.txt LABEL...     # pathsteps.sh
//
// For compare.sh's raw.txt it prints, per metric, the median and min–max of
// each side, the ratio of medians (after / before), the min–max of the
// per-round paired ratios, and two verdicts: "within spread" when each
// side's median lies inside the other side's min–max range; "same side every
// round" when the per-round paired ratios (after / before, measured back to
// back) are all above or all below 1.0 -- a consistent difference even when
// the spreads overlap (with 6 rounds, chance alone gives that 1 time in 32).
// Then the steal of every run and every value by round.
//
// For steps.sh and pathsteps.sh it prints one row per LABEL (the commit a
// binary was built at, in the order given): the median (min–max) of lease
// cycles per CPU-second and lease cycles/s (steps), or of lease cycles/s,
// lease cycles per server CPU-second and create/release p50 (pathsteps).
//
// It reads files only and measures nothing.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

func main() {
	steps := flag.Bool("steps", false, "RAW is steps.sh's steps.txt; the arguments after it are the commit labels")
	pathsteps := flag.Bool("pathsteps", false, "RAW is pathsteps.sh's pathsteps.txt; the arguments after it are the commit labels")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: summarize [-steps | -pathsteps] RAW [LABEL...]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 1 || (*steps && *pathsteps) {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(os.Stdout, os.Stderr, flag.Arg(0), flag.Args()[1:], *steps, *pathsteps); err != nil {
		fmt.Fprintln(os.Stderr, "summarize:", err)
		os.Exit(1)
	}
}

func run(stdout, stderr io.Writer, raw string, labels []string, steps, pathsteps bool) error {
	f, err := os.Open(raw)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriter(stdout)
	switch {
	case steps:
		err = summarizeSteps(w, f, labels)
	case pathsteps:
		err = summarizePathSteps(w, f, labels)
	default:
		if len(labels) > 0 {
			return fmt.Errorf("labels are only for -steps and -pathsteps")
		}
		err = summarizeAB(w, stderr, f)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", raw, err)
	}
	return w.Flush()
}

var (
	abHeader = regexp.MustCompile(`^### (\d+) (before|after) (\S+) steal=(\S+) wall=(\S+)`)
	benchRow = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?\s+(\d+)\s+(.*)$`)
	cpCycles = regexp.MustCompile(`run 1: (\d+) lease cycles/s \(create p99 ([\d.]+) ms\), (\d+) cycles per CPU-second, ([\d.]+) writes`)
	cpBeats  = regexp.MustCompile(`run 1: \d+ agents, (\d+) heartbeats/s, p99 heartbeat ([\d.]+) ms, p99 API ([\d.]+) ms`)
	cpRow    = regexp.MustCompile(`^\| (release p99 during cycles \(ms\)|CPU cores the process got: cycle runs / heartbeat runs) \| ([^|]+) \|`)
)

// want lists the rows of the before/after table: run name (the NAME of the
// raw header), metric, label.
var want = []struct{ name, metric, label string }{
	{"BenchmarkPlace10k", "decisions/cpu-s", "Place10k: decisions per CPU-second"},
	{"BenchmarkPlace10k", "cpu-µs/op", "Place10k: CPU µs per decision"},
	{"BenchmarkPlace10k", "decisions/s", "Place10k: decisions/s (wall)"},
	{"BenchmarkPlace10k", "allocs/op", "Place10k: allocations per decision"},
	{"BenchmarkPlaceSelectors10k", "decisions/cpu-s", "PlaceSelectors10k: decisions per CPU-second"},
	{"BenchmarkPlaceSelectors10k", "decisions/s", "PlaceSelectors10k: decisions/s (wall)"},
	{"BenchmarkPlaceSelectors10k", "allocs/op", "PlaceSelectors10k: allocations per decision"},
	{"BenchmarkNewIndex10k", "cpu-s/op", "NewIndex10k: CPU s per index"},
	{"BenchmarkNewIndex10k", "s/op", "NewIndex10k: s per index (wall)"},
	{"BenchmarkNewIndex10k", "allocs/op", "NewIndex10k: allocations per index"},
	{"BenchmarkPlaceAdd10k", "decisions/cpu-s", "PlaceAdd10k: decisions per CPU-second"},
	{"BenchmarkPlaceAdd10k", "decisions/s", "PlaceAdd10k: decisions/s (wall)"},
	{"BenchmarkPlaceAdd10k", "allocs/op", "PlaceAdd10k: allocations per decision"},
	{"BenchmarkLeaseCycle", "µs/op", "sqlite LeaseCycle: µs per cycle (wall)"},
	{"controlplane", "cycles/s", "bench/controlplane: lease cycles/s (wall)"},
	{"controlplane", "cycles/cpu-s", "bench/controlplane: lease cycles per CPU-second"},
	{"controlplane", "cores", "bench/controlplane: CPU cores the process got (cycle run)"},
	{"controlplane", "create p99 ms", "bench/controlplane: create p99 ms"},
	{"controlplane", "release p99 ms", "bench/controlplane: release p99 ms"},
	{"controlplane", "writes/txn", "bench/controlplane: lease writes per transaction"},
	{"controlplane", "hb/s", "bench/controlplane: heartbeats/s (200 agents)"},
	{"controlplane", "api p99 ms", "bench/controlplane: API p99 ms under heartbeats"},
	{"productpath", "cycles_per_s", "product path: lease cycles/s (wall)"},
	{"productpath", "cycles_per_server_cpu_s", "product path: lease cycles per server CPU-second"},
	{"productpath", "server_cores", "product path: CPU cores the server got"},
	{"productpath", "create_p50_ms", "product path: create p50 ms"},
	{"productpath", "create_p99_ms", "product path: create p99 ms"},
	{"productpath", "release_p50_ms", "product path: release p50 ms"},
	{"productpath", "release_p99_ms", "product path: release p99 ms"},
	{"productpath", "errors", "product path: errors"},
}

type metricKey struct{ name, metric string }

// byRound is one side's values of one metric, by round.
type byRound map[int]float64

// abData is compare.sh's raw.txt parsed: vals[{name, metric}][side][round],
// and the steal of every run by name (in order of first appearance) and side.
type abData struct {
	vals       map[metricKey]map[string]byRound
	stealNames []string
	steal      map[string]map[string][]string
}

func parseAB(r io.Reader, stderr io.Writer) (*abData, error) {
	d := &abData{vals: map[metricKey]map[string]byRound{}, steal: map[string]map[string][]string{}}
	var (
		have        bool
		round       int
		side, name  string
		sc          = bufio.NewScanner(r)
		lineNo      int
		errParseNum error
	)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	put := func(metric string, v float64) {
		k := metricKey{name, metric}
		if d.vals[k] == nil {
			d.vals[k] = map[string]byRound{}
		}
		if d.vals[k][side] == nil {
			d.vals[k][side] = byRound{}
		}
		d.vals[k][side][round] = v
	}
	putS := func(metric, s string) {
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil && errParseNum == nil {
			errParseNum = fmt.Errorf("line %d: %w", lineNo, err)
		}
		put(metric, v)
	}
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		if m := abHeader.FindStringSubmatch(line); m != nil {
			n, err := strconv.Atoi(m[1])
			if err != nil {
				return nil, fmt.Errorf("line %d: round: %w", lineNo, err)
			}
			have, round, side, name = true, n, m[2], m[3]
			if d.steal[name] == nil {
				d.steal[name] = map[string][]string{}
				d.stealNames = append(d.stealNames, name)
			}
			d.steal[name][side] = append(d.steal[name][side], m[4])
			continue
		}
		if !have {
			continue
		}
		if strings.HasPrefix(line, "FAILED") {
			fmt.Fprintf(stderr, "warning: round %d %s %s: %s\n", round, side, name, line)
		}
		if m := benchRow.FindStringSubmatch(line); m != nil {
			f := strings.Fields(m[4])
			for i := 0; i+1 < len(f); i += 2 {
				unit := f[i+1]
				putS(unit, f[i])
				if unit == "ns/op" {
					v, _ := strconv.ParseFloat(f[i], 64)
					put("s/op", v/1e9)
					put("µs/op", v/1e3)
				}
			}
		} else if m := cpCycles.FindStringSubmatch(line); m != nil {
			putS("cycles/s", m[1])
			putS("create p99 ms", m[2])
			putS("cycles/cpu-s", m[3])
			putS("writes/txn", m[4])
		} else if m := cpBeats.FindStringSubmatch(line); m != nil {
			putS("hb/s", m[1])
			putS("api p99 ms", m[3])
		} else if m := cpRow.FindStringSubmatch(line); m != nil {
			if strings.HasPrefix(m[1], "release") {
				putS("release p99 ms", m[2])
			} else {
				putS("cores", strings.SplitN(m[2], "/", 2)[0])
			}
		} else if strings.HasPrefix(line, "{") && name == "productpath" {
			var j map[string]any
			if err := json.Unmarshal([]byte(line), &j); err != nil {
				return nil, fmt.Errorf("line %d: %w", lineNo, err)
			}
			for k, v := range j {
				if x, ok := v.(float64); ok {
					put(k, x)
				}
			}
			if cpu, _ := j["server_cpu_s"].(float64); cpu != 0 {
				cycles, _ := j["cycles"].(float64)
				wall, _ := j["wall_s"].(float64)
				put("cycles_per_server_cpu_s", cycles/cpu)
				put("server_cores", cpu/wall)
			}
		}
		if errParseNum != nil {
			return nil, errParseNum
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return d, nil
}

func summarizeAB(w io.Writer, stderr io.Writer, r io.Reader) error {
	d, err := parseAB(r, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "| measurement | before: median (min–max) | after: median (min–max) | ratio after/before | per-round ratios min–max | runs | within spread? | same side every round? |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, m := range want {
		v := d.vals[metricKey{m.name, m.metric}]
		b, a := v["before"], v["after"]
		if len(b) == 0 || len(a) == 0 {
			continue
		}
		bv, av := values(b), values(a)
		bm, am := median(bv), median(av)
		var pr []float64
		for _, r := range rounds(b) {
			if x, ok := a[r]; ok && b[r] != 0 {
				pr = append(pr, x/b[r])
			}
		}
		within, side := "identical", "—"
		if bm != am {
			within = "**no**"
			if minOf(bv) <= am && am <= maxOf(bv) && minOf(av) <= bm && bm <= maxOf(av) {
				within = "yes"
			}
			switch {
			case len(pr) > 0 && minOf(pr) > 1:
				side = "**yes, higher**"
			case len(pr) > 0 && maxOf(pr) < 1:
				side = "**yes, lower**"
			default:
				side = "no"
			}
		}
		prs := "n/a"
		if len(pr) > 0 {
			prs = fmt.Sprintf("%.2f–%.2f", minOf(pr), maxOf(pr))
		}
		rs := "—"
		if bm != 0 {
			rs = fmt.Sprintf("%.2f", am/bm)
		}
		fmt.Fprintf(w, "| %s | %s (%s–%s) | %s (%s–%s) | %s | %s | %d+%d | %s | %s |\n",
			m.label, num(bm), num(minOf(bv)), num(maxOf(bv)), num(am), num(minOf(av)), num(maxOf(av)),
			rs, prs, len(bv), len(av), within, side)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Steal (% of all CPU time during each run, from /proc/stat), by run and side:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | before | after |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, name := range d.stealNames {
		fmt.Fprintf(w, "| %s | %s | %s |\n", name, strings.Join(d.steal[name]["before"], ", "), strings.Join(d.steal[name]["after"], ", "))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "All values per round (before → after):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| measurement | before, by round | after, by round |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, m := range want {
		v := d.vals[metricKey{m.name, m.metric}]
		if v == nil {
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", m.label, joinRounds(v["before"]), joinRounds(v["after"]))
	}
	return nil
}

func joinRounds(b byRound) string {
	var s []string
	for _, r := range rounds(b) {
		s = append(s, num(b[r]))
	}
	return strings.Join(s, ", ")
}

// num formats a value with about three significant figures: no decimals
// from 100, one from 10, two from 1, three significant digits below.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case v == 0:
		return "0"
	case math.IsNaN(v):
		return "nan"
	case math.IsInf(v, 0):
		return strings.TrimPrefix(strings.ToLower(strconv.FormatFloat(v, 'f', -1, 64)), "+")
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

var (
	stepsHeader = regexp.MustCompile(`^### \d+ (\S+) controlplane steal=(\S+)`)
	stepsRun    = regexp.MustCompile(`run 1: (\d+) lease cycles/s .*?, (\d+) cycles per CPU-second`)
	pathHeader  = regexp.MustCompile(`^### \d+ (\S+) productpath steal=(\S+)`)
)

type series struct {
	cpu, wall, c50, r50 []float64
	errs                float64
	steal               []string
}

func newSeries(labels []string) map[string]*series {
	v := make(map[string]*series, len(labels))
	for _, l := range labels {
		v[l] = &series{}
	}
	return v
}

// summarizeSteps reads steps.sh's steps.txt: per label, bench/controlplane's
// lease cycles per CPU-second and lease cycles/s.
func summarizeSteps(w io.Writer, r io.Reader, labels []string) error {
	v := newSeries(labels)
	var cur *series
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := stepsHeader.FindStringSubmatch(line); m != nil {
			if cur = v[m[1]]; cur == nil {
				return fmt.Errorf("line %d: commit %q is not among the labels given", n, m[1])
			}
			cur.steal = append(cur.steal, m[2])
			continue
		}
		if m := stepsRun.FindStringSubmatch(line); m != nil && cur != nil {
			wall, err1 := strconv.ParseFloat(m[1], 64)
			cpu, err2 := strconv.ParseFloat(m[2], 64)
			if err1 != nil || err2 != nil {
				return fmt.Errorf("line %d: bad number", n)
			}
			cur.wall = append(cur.wall, wall)
			cur.cpu = append(cur.cpu, cpu)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	fmt.Fprintln(w, "| commit | lease cycles per CPU-second: median (min–max) | lease cycles/s: median (min–max) | runs | steal % |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, l := range labels {
		x := v[l]
		if len(x.cpu) == 0 {
			fmt.Fprintf(w, "| %s | n/a | n/a | 0 | |\n", l)
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d | %s |\n", l, spread(x.cpu, 0), spread(x.wall, 0), len(x.cpu), strings.Join(x.steal, ", "))
	}
	return nil
}

// summarizePathSteps reads pathsteps.sh's pathsteps.txt: per label, the
// driver's lease cycles/s, lease cycles per server CPU-second, create and
// release p50 and errors.
func summarizePathSteps(w io.Writer, r io.Reader, labels []string) error {
	v := newSeries(labels)
	var cur *series
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := pathHeader.FindStringSubmatch(line); m != nil {
			if cur = v[m[1]]; cur == nil {
				return fmt.Errorf("line %d: commit %q is not among the labels given", n, m[1])
			}
			cur.steal = append(cur.steal, m[2])
			continue
		}
		if !strings.HasPrefix(line, "{") || cur == nil {
			continue
		}
		var j struct {
			CyclesPerS   *float64 `json:"cycles_per_s"`
			CreateP50    *float64 `json:"create_p50_ms"`
			ReleaseP50   *float64 `json:"release_p50_ms"`
			Errors       *float64 `json:"errors"`
			Cycles       float64  `json:"cycles"`
			ServerCPUSec float64  `json:"server_cpu_s"`
		}
		if err := json.Unmarshal([]byte(line), &j); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
		if j.CyclesPerS == nil || j.CreateP50 == nil || j.ReleaseP50 == nil || j.Errors == nil {
			return fmt.Errorf("line %d: the driver's JSON lacks cycles_per_s, create_p50_ms, release_p50_ms or errors", n)
		}
		cur.wall = append(cur.wall, *j.CyclesPerS)
		cur.c50 = append(cur.c50, *j.CreateP50)
		cur.r50 = append(cur.r50, *j.ReleaseP50)
		cur.errs += *j.Errors
		if j.ServerCPUSec != 0 {
			cur.cpu = append(cur.cpu, j.Cycles/j.ServerCPUSec)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	fmt.Fprintln(w, "| commit | lease cycles/s | lease cycles per server CPU-second | create p50 ms | release p50 ms | runs | errors | steal % |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, l := range labels {
		x := v[l]
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %d | %s | %s |\n", l, spread(x.wall, 0), spread(x.cpu, 0),
			spread(x.c50, 2), spread(x.r50, 2), len(x.wall), strconv.FormatFloat(x.errs, 'f', -1, 64), strings.Join(x.steal, ", "))
	}
	return nil
}

// spread is "median (min–max)" with prec decimals, or "n/a" for no values.
func spread(x []float64, prec int) string {
	if len(x) == 0 {
		return "n/a"
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	return fmt.Sprintf("%s (%s–%s)", f(median(x)), f(minOf(x)), f(maxOf(x)))
}

func rounds(b byRound) []int {
	rs := make([]int, 0, len(b))
	for r := range b {
		rs = append(rs, r)
	}
	sort.Ints(rs)
	return rs
}

func values(b byRound) []float64 {
	v := make([]float64, 0, len(b))
	for _, r := range rounds(b) {
		v = append(v, b[r])
	}
	return v
}

// median is the middle value, or the mean of the two middle ones.
func median(x []float64) float64 {
	s := append([]float64(nil), x...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func minOf(x []float64) float64 {
	m := x[0]
	for _, v := range x[1:] {
		m = math.Min(m, v)
	}
	return m
}

func maxOf(x []float64) float64 {
	m := x[0]
	for _, v := range x[1:] {
		m = math.Max(m, v)
	}
	return m
}
