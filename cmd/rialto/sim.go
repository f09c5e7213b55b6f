package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/rialto-project/rialto/internal/sim"
	"github.com/rialto-project/rialto/internal/sim/report"
)

func init() {
	register(&command{Name: "sim list", Summary: "List the simulator's named experiments.", Run: runSimList})
	register(&command{Name: "sim run", Args: "EXPERIMENT", Summary: "Run a simulator experiment: write its CSV and SVG and print the headline.", Run: runSimRun})
}

type simExperiment struct {
	ID          string `json:"id"`
	State       string `json:"state"`
	Description string `json:"description"`
}

func runSimList(_ context.Context, e *env, args []string) error {
	fs := newFlags(e, "sim list", "")
	output := fs.String("o", "table", "output format: table or json")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *output != "table" && *output != "json" {
		return fmt.Errorf("unknown output format %q (use table or json)", *output)
	}
	exps := sim.Experiments()
	if *output == "json" {
		out := make([]simExperiment, 0, len(exps))
		for _, x := range exps {
			out = append(out, simExperiment{ID: x.Name, State: "available", Description: x.Description})
		}
		return printJSON(e.stdout, out)
	}
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "EXPERIMENT\tDESCRIPTION")
	for _, x := range exps {
		fmt.Fprintf(tw, "%s\t%s\n", x.Name, x.Description)
	}
	return tw.Flush()
}

type simMetric struct {
	Name      string  `json:"name"`
	Value     float64 `json:"value"`
	Unit      string  `json:"unit,omitempty"`
	Paper     float64 `json:"paper,omitempty"`
	Tolerance float64 `json:"tolerance,omitempty"`
	Within    bool    `json:"within"`
}

type simRunOut struct {
	ID          string      `json:"id"`
	State       string      `json:"state"` // ok, or out-of-tolerance when a headline misses the seed's figure
	Description string      `json:"description"`
	Seed        uint64      `json:"seed"`
	Events      uint64      `json:"events"`
	Metrics     []simMetric `json:"metrics"`
	Notes       []string    `json:"notes,omitempty"`
	CSV         string      `json:"csv"`
	SVG         string      `json:"svg"`
	Summary     string      `json:"summary"`
}

func runSimRun(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "sim run", "EXPERIMENT")
	outDir := fs.String("out", "sim-out", "directory for EXPERIMENT.csv, .svg and .txt")
	seed := fs.Uint64("seed", 0, "random seed (the same seed gives the same result)")
	scale := fs.Float64("scale", 1, "size multiplier of the run (headline ratios do not depend on it)")
	traces := fs.String("traces", e.getenv("RIALTO_TRACES"), "trace directory for trace-driven experiments (env RIALTO_TRACES; default "+report.DefaultTraceDir+")")
	podList := fs.String("pod-list", "", "openb pod list to replay (default openb_pod_list_default.csv)")
	sample := fs.Int("sample", 0, "replay every Nth node and pod of a trace (quick runs)")
	output := fs.String("o", "table", "output format: table or json")
	pos, err := parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	if *output != "table" && *output != "json" {
		return fmt.Errorf("unknown output format %q (use table or json)", *output)
	}
	if *scale <= 0 {
		return fmt.Errorf("--scale must be positive")
	}
	res, files, err := report.Run(ctx, pos[0], report.Options{
		Options:  sim.Options{Seed: *seed, OutDir: *outDir, Scale: *scale, PodList: *podList, Sample: *sample},
		TraceDir: *traces,
	})
	if errors.Is(err, sim.ErrUnknownExperiment) {
		names := make([]string, 0)
		for _, x := range sim.Experiments() {
			names = append(names, x.Name)
		}
		return fmt.Errorf("unknown experiment %q (rialto sim list: %s)", pos[0], strings.Join(names, ", "))
	}
	if errors.Is(err, sim.ErrNoTraces) {
		return fmt.Errorf("%w: pass --traces DIR or set RIALTO_TRACES", err)
	}
	if err != nil {
		return err
	}
	out := simRunOut{ID: res.Name, State: "ok", Description: res.Description, Seed: *seed, Events: res.Events,
		Notes: res.Notes, CSV: files.CSV, SVG: files.SVG, Summary: files.Summary, Metrics: []simMetric{}}
	for _, m := range res.Metrics {
		out.Metrics = append(out.Metrics, simMetric{Name: m.Name, Value: m.Value, Unit: m.Unit, Paper: m.Paper, Tolerance: m.Tolerance, Within: m.Within()})
		if !m.Within() {
			out.State = "out-of-tolerance"
		}
	}
	if *output == "json" {
		return printJSON(e.stdout, out)
	}
	fmt.Fprint(e.stdout, res.Summary())
	fmt.Fprintln(e.stdout)
	if res.Events > 0 {
		fmt.Fprintf(e.stdout, "%d events; ", res.Events)
	}
	fmt.Fprintf(e.stdout, "wrote %s, %s and %s\n", files.CSV, files.SVG, files.Summary)
	return nil
}
