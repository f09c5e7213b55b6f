package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/internal/lab"
	"github.com/rialto-project/rialto/internal/sim"
	"github.com/rialto-project/rialto/internal/sim/report"
)

func init() {
	register(&command{Name: "sim list", Summary: "List the simulator's named experiments and the papers they follow (by authors and title).", Flags: runSimList})
	register(&command{Name: "sim run", Args: "EXPERIMENT|all", Summary: "Run a simulator experiment (or all of them): write its CSV, SVG and text, and print every figure tagged fit or prediction with its verdict. " +
		"`all` also writes the fit/prediction table (results.md) and, with --doc, puts it into a document. " +
		"`scale` is the data-centre run (10,000 nodes and 1,000,000 leases by default).", Flags: runSimRun, MinArgs: 1, MaxArgs: 1})
}

type simExperiment struct {
	ID          string `json:"id"`
	State       string `json:"state"`
	Description string `json:"description"`
	Paper       string `json:"paper,omitempty"` // authors and title of the paper it follows or is after
}

func runSimList(e *env, fs *pflag.FlagSet) runFunc {
	output := outputVar(fs)
	return func(ctx context.Context, _ []string) error {
		exps := sim.Experiments()
		if output.structured() {
			out := make([]simExperiment, 0, len(exps))
			for _, x := range exps {
				out = append(out, simExperiment{ID: x.Name, State: "available", Description: x.Description, Paper: sim.Papers[x.Paper].Cite})
			}
			return output.print(e.stdout, out)
		}
		tw := newTable(e.stdout)
		fmt.Fprintln(tw, "EXPERIMENT\tDESCRIPTION")
		for _, x := range exps {
			fmt.Fprintf(tw, "%s\t%s\n", x.Name, x.Description)
		}
		return tw.Flush()
	}
}

type simSensitivity struct {
	Input   string  `json:"input"`
	Nominal float64 `json:"nominal"`
	Lo      float64 `json:"lo"`
	Hi      float64 `json:"hi"`
	LoOpen  bool    `json:"lo_open,omitempty"`
	HiOpen  bool    `json:"hi_open,omitempty"`
}

type simMetric struct {
	Name        string           `json:"name"`
	Value       float64          `json:"value"`
	Unit        string           `json:"unit,omitempty"`
	Kind        string           `json:"kind"` // fit, prediction or pending
	Figure      string           `json:"figure,omitempty"`
	Paper       float64          `json:"paper,omitempty"`
	Tolerance   float64          `json:"tolerance,omitempty"`
	Verdict     string           `json:"verdict"`
	Miss        string           `json:"miss,omitempty"`
	Real        *float64         `json:"real,omitempty"`
	Sensitivity []simSensitivity `json:"sensitivity,omitempty"`
}

type simRunOut struct {
	ID          string      `json:"id"`
	State       string      `json:"state"` // ok, or miss when a prediction misses its paper figure
	Description string      `json:"description"`
	Seed        uint64      `json:"seed"`
	Events      uint64      `json:"events"`
	WallSeconds float64     `json:"wall_seconds"`
	CPUSeconds  float64     `json:"cpu_seconds"`
	Metrics     []simMetric `json:"metrics"`
	Notes       []string    `json:"notes,omitempty"`
	CSV         string      `json:"csv"`
	SVG         string      `json:"svg"`
	Summary     string      `json:"summary"`
	Skipped     string      `json:"skipped,omitempty"`
}

func simOut(res sim.Result, files report.Files, seed uint64) simRunOut {
	out := simRunOut{ID: res.Name, State: "ok", Description: res.Description, Seed: seed, Events: res.Events,
		WallSeconds: files.Wall.Seconds(), CPUSeconds: files.CPU.Seconds(),
		Notes: res.Notes, CSV: files.CSV, SVG: files.SVG, Summary: files.Summary, Metrics: []simMetric{}}
	for _, m := range res.Metrics {
		sm := simMetric{Name: m.Name, Value: m.Value, Unit: m.Unit, Kind: string(m.Kind), Figure: m.Figure, Paper: m.Paper, Tolerance: m.Tolerance, Verdict: m.Verdict(), Miss: m.Miss}
		if m.Real != nil {
			v := m.Real.Value
			sm.Real = &v
		}
		for _, s := range m.Sensitivity {
			sm.Sensitivity = append(sm.Sensitivity, simSensitivity{s.Input, s.Nominal, s.Lo, s.Hi, s.LoOpen, s.HiOpen})
		}
		out.Metrics = append(out.Metrics, sm)
		if m.Kind == sim.Prediction && m.Figure != "" && !m.Hit() {
			out.State = "miss"
		}
	}
	return out
}

func runSimRun(e *env, fs *pflag.FlagSet) runFunc {
	outDir := fs.String("out", "sim-out", "directory for EXPERIMENT.csv, .svg and .txt (and results.md with all)")
	seed := fs.Uint64("seed", 0, "random seed (the same seed gives the same result)")
	scale := fs.Float64("scale", 1, "size multiplier of the run (headline ratios do not depend on it)")
	traces := fs.String("traces", e.getenv("RIALTO_TRACES"), "trace directory for trace-driven experiments (env RIALTO_TRACES; default "+report.DefaultTraceDir+", from the current directory)")
	podList := fs.String("pod-list", "", "openb pod list to replay (default openb_pod_list_default.csv)")
	sample := fs.Int("sample", 0, "replay every Nth node and pod of a trace (quick runs)")
	sens := fs.Bool("sensitivity", true, "report how far each prediction's inputs may move before its conclusion changes (reruns the model)")
	real := fs.Bool("real", false, "also measure the real counterparts on Rialto's own code (loopback; some need root for network namespaces)")
	doc := fs.String("doc", "", "with all: replace the generated table in this markdown file (e.g. docs/simulator.md)")
	nodes := fs.Int("nodes", sim.DefaultScale.Nodes, "scale: nodes")
	leases := fs.Int("leases", sim.DefaultScale.Leases, "scale: leases")
	conc := fs.Int("concurrency", sim.DefaultScale.Concurrency, "scale: leases running at once (about)")
	remote := fs.Float64("remote-share", sim.DefaultScale.RemoteShare, "scale: share of leases that must borrow from another node")
	compose := fs.Float64("compose-share", sim.DefaultScale.ComposeShare, "scale: share of leases that need a composition (1.5× a device's bandwidth)")
	output := outputVar(fs)
	return func(ctx context.Context, pos []string) error {
		if *scale <= 0 {
			return usagef("--scale must be positive")
		}
		if *nodes <= 0 || *leases <= 0 || *conc <= 0 || *remote < 0 || *remote > 1 || *compose < 0 || *compose > 1 {
			return usagef("--nodes, --leases and --concurrency must be positive and --remote-share, --compose-share within [0, 1]")
		}
		if *doc != "" && pos[0] != "all" {
			return usagef("--doc goes with `rialto sim run all`")
		}
		o := report.Options{
			Options: sim.Options{Seed: *seed, OutDir: *outDir, Scale: *scale, PodList: *podList, Sample: *sample, Sensitivity: *sens,
				ScaleSpec: sim.ScaleSpec{Nodes: *nodes, Leases: *leases, Concurrency: *conc, RemoteShare: *remote, ComposeShare: *compose}},
			TraceDir: *traces,
		}
		if *real {
			o.Real = lab.Counterpart
		}
		if pos[0] == "all" {
			return runSimAll(ctx, e, o, *doc, output)
		}
		bar := newProgress(e, -1, "sim: "+pos[0])
		res, files, err := report.Run(ctx, pos[0], o)
		bar.done()
		if errors.Is(err, sim.ErrUnknownExperiment) {
			names := make([]string, 0)
			for _, x := range sim.Experiments() {
				names = append(names, x.Name)
			}
			return fmt.Errorf("unknown experiment %q (rialto sim list: %s, or all)", pos[0], strings.Join(names, ", "))
		}
		if errors.Is(err, sim.ErrNoTraces) || isTraceFileMissing(err) {
			return traceDirError(fs, pos[0], *traces, err)
		}
		if err != nil {
			return err
		}
		if output.structured() {
			return output.print(e.stdout, simOut(res, files, *seed))
		}
		fmt.Fprint(e.stdout, res.Summary())
		fmt.Fprintln(e.stdout)
		if res.Name == "scale" {
			printScaleRates(e, res, files)
		}
		if res.Events > 0 {
			fmt.Fprintf(e.stdout, "%d events; ", res.Events)
		}
		fmt.Fprintf(e.stdout, "wrote %s, %s and %s\n", files.CSV, files.SVG, files.Summary)
		return nil
	}
}

// isTraceFileMissing reports whether err is a trace-driven experiment's
// failure to find a file in its trace directory (a name relative to it).
func isTraceFileMissing(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe) && errors.Is(err, fs.ErrNotExist) && !filepath.IsAbs(pe.Path)
}

// traceDirError explains a trace-driven experiment's failure to find its
// traces (err): which directory it looked in, where that came from, and
// what to pass instead. dir is --traces (whose default is $RIALTO_TRACES).
func traceDirError(flags *pflag.FlagSet, name, dir string, err error) error {
	from := "--traces"
	switch {
	case flagSet(flags, "traces"):
	case dir != "":
		from = "RIALTO_TRACES"
	default:
		dir, from = report.DefaultTraceDir, "the default, "+report.DefaultTraceDir+" from the current directory"
	}
	abs, aerr := filepath.Abs(dir)
	if aerr != nil {
		abs = dir
	}
	const layout = "alibaba-gpu-v2023/openb_node_list_all_node.csv and the openb pod lists beside it (the csv/ folder of cluster-trace-gpu-v2023 in github.com/alibaba/clusterdata; docs/simulator.md)"
	if !errors.Is(err, sim.ErrNoTraces) {
		return fmt.Errorf("%w, in the trace directory %s (%s): pass --traces DIR or set RIALTO_TRACES, DIR holding %s; --pod-list names a pod list beside the node list", err, abs, from, layout)
	}
	what := "does not exist"
	if st, serr := os.Stat(dir); serr == nil && !st.IsDir() {
		what = "is not a directory"
	} else if serr != nil && !errors.Is(serr, fs.ErrNotExist) {
		what = "cannot be read (" + serr.Error() + ")"
	}
	return fmt.Errorf("experiment %s replays a trace, and its trace directory %s (%s) %s: pass --traces DIR or set RIALTO_TRACES, DIR holding %s", name, abs, from, what, layout)
}

// printScaleRates prints what only the caller can measure: the rates of
// the scale run per CPU second and per wall second.
func printScaleRates(e *env, res sim.Result, files report.Files) {
	calls := 0.0
	for _, row := range res.Rows {
		if row[0] == "place_calls" {
			fmt.Sscan(row[1], &calls)
		}
	}
	cpu, wall := files.CPU.Seconds(), files.Wall.Seconds()
	if cpu <= 0 || wall <= 0 {
		return
	}
	fmt.Fprintf(e.stdout, "took %s (%.1f CPU s): %.0f placement decisions/s and %.0f events/s per CPU second (%.0f and %.0f per wall second)\n",
		files.Wall.Round(time.Millisecond), cpu, calls/cpu, float64(res.Events)/cpu, calls/wall, float64(res.Events)/wall)
}

func runSimAll(ctx context.Context, e *env, o report.Options, doc string, output *output) error {
	bar := newProgress(e, len(sim.Experiments()), "sim")
	outs, table, err := report.All(ctx, o, func(name string) {
		if bar != nil {
			bar.step("sim: " + name)
			return
		}
		fmt.Fprintf(e.stderr, "running %s\n", name)
	})
	bar.done()
	if err != nil {
		return err
	}
	if doc != "" {
		if err := report.ReplaceTable(doc, table); err != nil {
			return err
		}
	}
	if output.structured() {
		all := make([]simRunOut, 0, len(outs))
		for _, x := range outs {
			if x.Skipped != "" {
				all = append(all, simRunOut{ID: x.Name, State: "skipped", Skipped: x.Skipped, Metrics: []simMetric{}})
				continue
			}
			all = append(all, simOut(x.Result, x.Files, o.Seed))
		}
		return output.print(e.stdout, all)
	}
	fmt.Fprint(e.stdout, table)
	dir := o.OutDir
	if dir == "" {
		dir = "."
	}
	fmt.Fprintf(e.stdout, "\nwrote %s/%s and each experiment's CSV, SVG and text", dir, report.TableFile)
	if doc != "" {
		fmt.Fprintf(e.stdout, "; updated the table in %s", doc)
	}
	fmt.Fprintln(e.stdout)
	return nil
}
