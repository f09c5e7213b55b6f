package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimList(t *testing.T) {
	out, errs, code := runCLI(t, "", "sim", "list")
	if code != 0 || !strings.Contains(out, "EXPERIMENT") || !strings.Contains(out, "smufin-sharing") {
		t.Fatalf("sim list: %d %s\n%s", code, errs, out)
	}
	out, _, code = runCLI(t, "", "sim", "list", "-o", "json")
	var xs []simExperiment
	if code != 0 || json.Unmarshal([]byte(out), &xs) != nil || len(xs) < 5 {
		t.Fatalf("sim list -o json: %d\n%s", code, out)
	}
	for _, x := range xs {
		if x.ID == "" || x.State == "" || x.Description == "" {
			t.Errorf("experiment %+v", x)
		}
	}
}

// TestSimRun runs the quickest experiment and checks its files and its
// headline against seed 000's degradation thresholds (3, 4, 6 instances).
func TestSimRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	out, errs, code := runCLI(t, "", "sim", "run", "smufin-sharing", "--out", dir, "--seed", "7")
	if code != 0 {
		t.Fatalf("sim run: %d %s", code, errs)
	}
	for _, want := range []string{"degradation threshold, 1 device(s)", "3.000 instances", "6.000 instances", "ok", "smufin-sharing.svg"} {
		if !strings.Contains(out, want) {
			t.Errorf("sim run output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "OUT OF TOLERANCE") {
		t.Errorf("headline out of tolerance:\n%s", out)
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
	if res.ID != "smufin-sharing" || res.State != "ok" || len(res.Metrics) != 3 || res.CSV != filepath.Join(dir2, "smufin-sharing.csv") {
		t.Errorf("sim run JSON: %+v", res)
	}
	if csv2, _ := os.ReadFile(res.CSV); string(csv2) != string(csv) {
		t.Error("same seed, different CSV")
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"sim", "run", "nope", "--out", dir}, 1, "unknown experiment \"nope\""},
		{[]string{"sim", "run"}, 2, "wrong number of arguments"},
		{[]string{"sim", "run", "hop-latency", "--scale", "-1"}, 1, "--scale"},
		{[]string{"sim", "run", "gpu-openb", "--out", dir, "--traces", filepath.Join(dir, "none")}, 1, "--traces"},
		{[]string{"sim"}, 2, "sim run EXPERIMENT"},
	} {
		_, errs, code := runCLI(t, "", tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}
