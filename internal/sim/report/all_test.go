package report_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/lab"
	"github.com/rialto-project/rialto/internal/sim"
	"github.com/rialto-project/rialto/internal/sim/report"
)

// TestAll runs every experiment (a small scale run, no traces) and writes
// the table, which ReplaceTable then puts into a document between its
// markers, leaving the rest of the document alone.
func TestAll(t *testing.T) {
	dir := t.TempDir()
	o := report.Options{Options: sim.Options{OutDir: dir, ScaleSpec: sim.ScaleSpec{Nodes: 80, Leases: 500, Concurrency: 40, RemoteShare: 0.8}},
		TraceDir: filepath.Join(dir, "no-traces")}
	var ran []string
	outs, table, err := report.All(context.Background(), o, func(name string) { ran = append(ran, name) })
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != len(sim.Experiments()) || len(ran) != len(outs) {
		t.Fatalf("%d outcomes, %d experiments, %d reported", len(outs), len(sim.Experiments()), len(ran))
	}
	for _, o := range outs {
		if o.Name == "gpu-openb" {
			if o.Skipped == "" {
				t.Error("gpu-openb ran without traces")
			}
			continue
		}
		if _, err := os.Stat(o.Files.CSV); err != nil || o.Files.CPU <= 0 && o.Files.Wall <= 0 {
			t.Errorf("%s: files %+v: %v", o.Name, o.Files, err)
		}
	}
	written, err := os.ReadFile(filepath.Join(dir, report.TableFile))
	if err != nil || string(written) != table {
		t.Fatalf("table file: %v", err)
	}
	for _, want := range []string{"fits,", "predictions (", "hits,", "| fit |", "| prediction |", "| pending |", "Not run: gpu-openb"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	doc := filepath.Join(dir, "doc.md")
	before, after := "# Title\n\nintro\n\n", "\n\n## Next\n"
	if err := os.WriteFile(doc, []byte(before+report.BeginMarker+"\nstale\n"+report.EndMarker+after), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := report.ReplaceTable(doc, table); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(doc)
	if want := before + report.BeginMarker + "\n" + table + report.EndMarker + after; string(got) != want {
		t.Errorf("document:\n%s", got)
	}
	if err := os.WriteFile(doc, []byte("no markers"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := report.ReplaceTable(doc, table); err == nil {
		t.Error("a document without markers accepted")
	}
}

// TestRunReal runs an experiment with its real counterpart (the hop relay,
// on loopback): the metrics carry the real figures and the verdict compares
// them.
func TestRunReal(t *testing.T) {
	res, _, err := report.Run(context.Background(), "hop-relay", report.Options{Options: sim.Options{OutDir: t.TempDir()}, Real: lab.Counterpart})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range res.Metrics {
		if m.Real == nil || !strings.Contains(m.Verdict(), "real ") {
			t.Errorf("%s: %+v, verdict %q", m.Name, m.Real, m.Verdict())
		}
	}
	// An experiment without a counterpart runs as without one.
	if _, _, err := report.Run(context.Background(), "udp-throughput", report.Options{Options: sim.Options{OutDir: t.TempDir()}, Real: lab.Counterpart}); err != nil {
		t.Fatal(err)
	}
}
