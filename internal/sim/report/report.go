package report

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rialto-project/rialto/internal/sim"
)

// DefaultTraceDir is where the development setup keeps the traces, relative
// to the repository root.
const DefaultTraceDir = "../shared/data/traces"

// Options are sim.Options with a trace directory path.
type Options struct {
	sim.Options
	// TraceDir is the trace directory; "" uses $RIALTO_TRACES or
	// DefaultTraceDir. It is only opened by trace-driven experiments.
	TraceDir string
}

// Files names what Run wrote.
type Files struct {
	CSV, SVG, Summary string
}

// Run runs the experiment and writes NAME.csv, NAME.svg and NAME.txt into
// o.OutDir (created if needed; "" means the current directory).
func Run(ctx context.Context, name string, o Options) (sim.Result, Files, error) {
	if o.Traces == nil {
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
	res, err := sim.Run(ctx, name, o.Options)
	if err != nil {
		return res, Files{}, err
	}
	files, err := Write(res, o.OutDir)
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
