package report

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/internal/sim"
)

// DefaultTraceDir is where the development setup keeps the traces, relative
// to the repository root.
const DefaultTraceDir = "../shared/data/traces"

// Real measures the real counterparts of an experiment's figures (package
// lab, wired in by the caller) and fills their Metric.Real; it returns
// ErrNoReal for an experiment without one.
type Real func(ctx context.Context, res *sim.Result) error

// ErrNoReal is what a Real function returns for an experiment that has no
// real counterpart.
var ErrNoReal = errors.New("report: no real counterpart")

// Options are sim.Options with a trace directory path.
type Options struct {
	sim.Options
	// TraceDir is the trace directory; "" uses $RIALTO_TRACES or
	// DefaultTraceDir. It is only opened by trace-driven experiments.
	TraceDir string
	// Real, when set, measures the real counterparts (see Real).
	Real Real
}

// Files names what Run wrote, and how long the run took: Wall is elapsed
// time, CPU the process's user and system time over the same span (on a
// shared machine the second is the simulator's own cost).
type Files struct {
	CSV, SVG, Summary string
	Wall, CPU         time.Duration
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (o *Options) traces() {
	if o.Traces != nil {
		return
	}
	dir := o.TraceDir
	if dir == "" {
		dir = os.Getenv("RIALTO_TRACES")
	}
	if dir == "" {
		dir = DefaultTraceDir
	}
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		o.Traces = os.DirFS(dir)
	}
}

// Run runs the experiment (and, with o.Real, its real counterparts) and
// writes NAME.csv, NAME.svg and NAME.txt into o.OutDir (created if needed;
// "" means the current directory).
func Run(ctx context.Context, name string, o Options) (sim.Result, Files, error) {
	o.traces()
	t0, c0 := time.Now(), cpuTime()
	res, err := sim.Run(ctx, name, o.Options)
	wall, cpu := time.Since(t0), cpuTime()-c0
	if err != nil {
		return res, Files{}, err
	}
	if o.Real != nil {
		if err := o.Real(ctx, &res); err != nil && !errors.Is(err, ErrNoReal) {
			return res, Files{}, fmt.Errorf("report: %s: real counterpart: %w", name, err)
		}
	}
	files, err := Write(res, o.OutDir)
	files.Wall, files.CPU = wall, cpu
	return res, files, err
}

// Write writes a result's CSV, SVG and summary into dir.
func Write(res sim.Result, dir string) (Files, error) {
	if dir == "" {
		dir = "."
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Files{}, fmt.Errorf("report: %w", err)
	}
	f := Files{
		CSV:     filepath.Join(dir, res.Name+".csv"),
		SVG:     filepath.Join(dir, res.Name+".svg"),
		Summary: filepath.Join(dir, res.Name+".txt"),
	}
	for path, data := range map[string][]byte{f.CSV: res.CSV(), f.SVG: res.Plot.SVG(), f.Summary: []byte(res.Summary())} {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return Files{}, fmt.Errorf("report: %w", err)
		}
	}
	return f, nil
}

// Outcome is one experiment of All: its result and files, or why it could
// not run (a trace-driven experiment without traces).
type Outcome struct {
	Name    string
	Result  sim.Result
	Files   Files
	Skipped string
}

// TableFile is the name of the fit/prediction table All writes.
const TableFile = "results.md"

// All runs every experiment (skipping trace-driven ones when no traces are
// found) and writes their files and the fit/prediction table (TableFile)
// into o.OutDir. progress, when set, is called before each experiment.
func All(ctx context.Context, o Options, progress func(name string)) ([]Outcome, string, error) {
	o.traces()
	var out []Outcome
	var rows []sim.Row
	for _, e := range sim.Experiments() {
		if progress != nil {
			progress(e.Name)
		}
		res, files, err := Run(ctx, e.Name, o)
		if errors.Is(err, sim.ErrNoTraces) {
			out = append(out, Outcome{Name: e.Name, Skipped: "no trace directory"})
			continue
		}
		if err != nil {
			return out, "", err
		}
		out = append(out, Outcome{Name: e.Name, Result: res, Files: files})
		rows = append(rows, sim.TableRows(res)...)
	}
	table := Table(rows, out)
	dir := o.OutDir
	if dir == "" {
		dir = "."
	}
	if err := os.WriteFile(filepath.Join(dir, TableFile), []byte(table), 0o644); err != nil {
		return out, "", fmt.Errorf("report: %w", err)
	}
	return out, table, nil
}

// Table is the markdown that docs/simulator.md carries between its
// generated-table markers: a tally, the table, and the experiments skipped.
func Table(rows []sim.Row, out []Outcome) string {
	var b strings.Builder
	c := sim.Counts(rows)
	fmt.Fprintf(&b, "%d figures: %d fits, %d predictions (%d compared with a paper figure: %d hits, %d misses), %d pending; %d compared with a real counterpart%s.\n\n",
		len(rows), c["fit"], c["prediction"], c["hit"]+c["miss"], c["hit"], c["miss"], c["pending"], c["real"], void(c["real-void"]))
	b.WriteString(sim.Markdown(rows))
	for _, o := range out {
		if o.Skipped != "" {
			fmt.Fprintf(&b, "\nNot run: %s (%s).\n", o.Name, o.Skipped)
		}
	}
	return b.String()
}

func void(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d more measured but not compared: see their verdicts)", n)
}

// Markers delimit the generated table in docs/simulator.md.
const (
	BeginMarker = "<!-- BEGIN generated by `rialto sim run all` -->"
	EndMarker   = "<!-- END generated by `rialto sim run all` -->"
)

// ReplaceTable rewrites the part of the file at path between BeginMarker
// and EndMarker with table.
func ReplaceTable(path, table string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	i := bytes.Index(doc, []byte(BeginMarker))
	j := bytes.Index(doc, []byte(EndMarker))
	if i < 0 || j < i {
		return fmt.Errorf("report: %s has no %q … %q section", path, BeginMarker, EndMarker)
	}
	var b bytes.Buffer
	b.Write(doc[:i+len(BeginMarker)])
	b.WriteString("\n")
	b.WriteString(table)
	b.Write(doc[j:])
	return os.WriteFile(path, b.Bytes(), 0o644)
}
