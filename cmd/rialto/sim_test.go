package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/sim/report"
)

func TestSimList(t *testing.T) {
	out, errs, code := runCLI(t, "", "sim", "list")
	if code != 0 || !strings.Contains(out, "EXPERIMENT") || !strings.Contains(out, "smufin-sharing") {
		t.Fatalf("sim list: %d %s\n%s", code, errs, out)
	}
	// Papers are named by authors and title, never by a short form.
	if !strings.Contains(out, "Fig. 8 of "+callPaper) || strings.Contains(out, "NVMe-oF genomics paper (Call et al.)") {
		t.Errorf("sim list does not cite the paper by authors and title:\n%s", out)
	}
	out, _, code = runCLI(t, "", "sim", "list", "-o", "json")
	var xs []simExperiment
	if code != 0 || json.Unmarshal([]byte(out), &xs) != nil || len(xs) < 5 {
		t.Fatalf("sim list -o json: %d\n%s", code, out)
	}
	papers := map[string]string{}
	for _, x := range xs {
		if x.ID == "" || x.State == "" || x.Description == "" {
			t.Errorf("experiment %+v", x)
		}
		papers[x.ID] = x.Paper
	}
	if papers["smufin-fig8"] != callPaper || papers["gpu-openb"] != "" {
		t.Errorf("papers %v", papers)
	}
}

// callPaper is how product text cites the NVMe-oF genomics paper.
const callPaper = `Call et al., "Disaggregating Non-Volatile Memory for Throughput-Oriented Genomics Workloads"`

// TestSimRun runs the quickest experiment and checks its files and its
// figures, each tagged: the one-device threshold of the NVMe-oF genomics
// paper (3 instances) is a fit, the 2-device threshold (4) a prediction that
// hits, the 3-device one (paper: 6) a prediction that misses.
func TestSimRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	out, errs, code := runCLI(t, "", "sim", "run", "smufin-sharing", "--out", dir, "--seed", "7")
	if code != 0 {
		t.Fatalf("sim run: %d %s", code, errs)
	}
	for _, want := range []string{"[fit]         degradation threshold, 1 device", "[prediction]  degradation threshold, 2 devices", "4.000 instances", "hit", "miss (-17%), explained", "holds while α", "smufin-sharing.svg",
		"figure: Fig. 6(b) of " + callPaper} {
		if !strings.Contains(out, want) {
			t.Errorf("sim run output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(strings.ToLower(out), "seed 00") || strings.Contains(out, "(NVMe-oF genomics)") {
		t.Errorf("output names a paper by number or without its title:\n%s", out)
	}
	csv, err := os.ReadFile(filepath.Join(dir, "smufin-sharing.csv"))
	if err != nil || !strings.HasPrefix(string(csv), "devices,instances,") || strings.Count(string(csv), "\n") < 4 {
		t.Errorf("CSV: %v\n%s", err, csv)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "smufin-sharing.svg"))
	if err != nil || !strings.HasPrefix(string(svg), "<svg") || !strings.HasSuffix(strings.TrimSpace(string(svg)), "</svg>") {
		t.Errorf("SVG: %v", err)
	}

	// The same seed gives the same table; -o json carries id and state.
	dir2 := filepath.Join(t.TempDir(), "out")
	out, _, code = runCLI(t, "", "sim", "run", "smufin-sharing", "--out", dir2, "--seed", "7", "-o", "json")
	var res simRunOut
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("sim run -o json: %d\n%s", code, out)
	}
	if res.ID != "smufin-sharing" || res.State != "miss" || len(res.Metrics) != 4 || res.CSV != filepath.Join(dir2, "smufin-sharing.csv") {
		t.Errorf("sim run JSON: %+v", res)
	}
	kinds := map[string]string{}
	for _, m := range res.Metrics {
		kinds[m.Name] = m.Kind
	}
	if kinds["degradation threshold, 1 device"] != "fit" || kinds["degradation threshold, 2 devices"] != "prediction" {
		t.Errorf("kinds %v", kinds)
	}
	if csv2, _ := os.ReadFile(res.CSV); string(csv2) != string(csv) {
		t.Error("same seed, different CSV")
	}

	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"sim", "run", "nope", "--out", dir}, 1, "unknown experiment \"nope\""},
		{[]string{"sim", "run"}, 2, "wrong number of arguments"},
		{[]string{"sim", "run", "hop-latency", "--scale", "-1"}, 2, "--scale"},
		// A trace directory that is not there, or lacks the files, is
		// named, with where it came from and what it must hold: the
		// first said "trace directory not set", the second named only the
		// file.
		{[]string{"sim", "run", "gpu-openb", "--out", dir, "--traces", filepath.Join(dir, "none")}, 1,
			"its trace directory " + filepath.Join(dir, "none") + " (--traces) does not exist: pass --traces DIR or set RIALTO_TRACES, DIR holding alibaba-gpu-v2023/openb_node_list_all_node.csv"},
		{[]string{"sim", "run", "gpu-openb", "--out", dir}, 1,
			"its trace directory " + filepath.Join(filepath.Dir(wd), "shared", "data", "traces") + " (the default, ../shared/data/traces from the current directory) does not exist"},
		{[]string{"sim", "run", "gpu-openb", "--out", dir, "--traces", dir}, 1,
			"open alibaba-gpu-v2023/openb_node_list_all_node.csv: no such file or directory, in the trace directory " + dir + " (--traces): pass --traces DIR"},
		{[]string{"sim"}, 2, "needs a verb (list, run)"},
		{[]string{"sim", "run", "scale", "--remote-share", "2"}, 2, "--remote-share"},
		{[]string{"sim", "run", "udp-throughput", "--doc", filepath.Join(dir, "x.md")}, 2, "--doc goes with"},
	} {
		if len(tc.args) == 5 && tc.args[2] == "gpu-openb" && os.Getenv("RIALTO_TRACES") != "" {
			continue // the default trace directory is not the one looked in
		}
		_, errs, code := runCLI(t, "", tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}

// TestSimRunScale runs the scale experiment from the CLI at a small size:
// its leases mostly borrow remote devices, and the rates only the caller can
// measure are printed.
func TestSimRunScale(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	out, errs, code := runCLI(t, "", "sim", "run", "scale", "--out", dir, "--nodes", "200", "--leases", "4000", "--concurrency", "150", "-o", "json")
	if code != 0 {
		t.Fatalf("sim run scale: %d %s", code, errs)
	}
	var res simRunOut
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got := map[string]float64{}
	for _, m := range res.Metrics {
		got[m.Name] = m.Value
	}
	if got["leases on another node's devices"] < 0.75 || got["leases composed"] < 0.2 || res.CPUSeconds <= 0 || res.Events == 0 {
		t.Errorf("scale: %+v", res)
	}
	out, errs, code = runCLI(t, "", "sim", "run", "scale", "--out", dir, "--nodes", "100", "--leases", "1000", "--concurrency", "50")
	if code != 0 || !strings.Contains(out, "placement decisions/s") || !strings.Contains(out, "events/s per CPU second") {
		t.Errorf("sim run scale: %d %s\n%s", code, errs, out)
	}
}

// TestSimRunAll runs every experiment (a small scale run, no sensitivity)
// and puts the table into a document between its markers.
func TestSimRunAll(t *testing.T) {
	dir := t.TempDir()
	doc := filepath.Join(dir, "doc.md")
	if err := os.WriteFile(doc, []byte("# Doc\n\n"+report.BeginMarker+"\nold\n"+report.EndMarker+"\n\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errs, code := runCLI(t, "", "sim", "run", "all", "--out", filepath.Join(dir, "out"), "--sensitivity=false", "--traces", filepath.Join(dir, "none"),
		"--nodes", "100", "--leases", "1000", "--concurrency", "50", "--doc", doc)
	if code != 0 {
		t.Fatalf("sim run all: %d %s", code, errs)
	}
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	d := string(b)
	for _, want := range []string{"| experiment | paper | figure | paper value | Rialto value | fit or prediction | real counterpart | verdict | holds while |",
		"| smufin-sharing |", "| erbium-pareto |", "| scale |", "| pending |", "Not run: gpu-openb (no trace directory).", "after\n"} {
		if !strings.Contains(d, want) {
			t.Errorf("document lacks %q:\n%s", want, d)
		}
	}
	if strings.Contains(d, "\nold\n") || !strings.Contains(out, "results.md") {
		t.Errorf("document not replaced or output short:\n%s\n%s", d, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "out", "erbium-pareto.svg")); err != nil {
		t.Error(err)
	}
}
