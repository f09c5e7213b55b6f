package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCostTable1 checks that `rialto cost` reproduces Table 1 of the ERBIUM paper:
// servers and costs of each deployment, as the paper prints them.
func TestCostTable1(t *testing.T) {
	out, errs, code := runCLI(t, "", "cost")
	if code != 0 {
		t.Fatalf("plan: exit %d: %s", code, errs)
	}
	for _, row := range [][]string{
		{"on-prem", "Original engine", "CPU ", "400", "10 k", "4 M"},
		{"on-prem", "With ERBIUM", "CPU + Alveo U200", "244", "20 k", "4.88 M"},
		{"on-prem", "With ERBIUM", "CPU + Alveo U55c", "244", "13 k", "3.17 M"},
		{"aws", "Original engine", "c5.12xlarge", "400", "5.09 M/year"},
		{"aws", "With ERBIUM", "f1.2xlarge", "1464", "15.73 M/year"},
		{"azure", "Original engine", "F48s v2", "400", "4.23 M/year"},
		{"azure", "With ERBIUM", "NP10s", "1171", "10.68 M/year"},
	} {
		found := false
		for _, line := range strings.Split(out, "\n") {
			ok := true
			for _, cell := range row {
				ok = ok && strings.Contains(line, cell)
			}
			found = found || ok
		}
		if !found {
			t.Errorf("no line with %q:\n%s", row, out)
		}
	}
	if !strings.Contains(out, "11712 vCPUs") {
		t.Errorf("CPU demand missing:\n%s", out)
	}

	out, _, code = runCLI(t, "", "cost", "-o", "json")
	var res planOutput
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("plan -o json: %d\n%s", code, out)
	}
	if res.ID == "" || res.State != "ok" || len(res.Deployments) != 7 {
		t.Fatalf("plan JSON: %+v", res)
	}
	units := []int{400, 244, 244, 400, 1464, 400, 1171}
	for i, d := range res.Deployments {
		if d.ID == "" || d.State == "" || d.Units != units[i] {
			t.Errorf("deployment %d: %+v", i, d)
		}
	}
	if d := res.Deployments[4]; !d.PerYear || d.TotalUSD < 15.7e6 || d.TotalUSD >= 15.8e6 {
		t.Errorf("AWS f1 deployment: %+v", d)
	}
}

func TestCostInputsFile(t *testing.T) {
	tmpl, _, code := runCLI(t, "", "cost", "--print-inputs")
	if code != 0 {
		t.Fatal("plan --print-inputs failed")
	}
	// Halve today's fleet: every deployment halves.
	var in map[string]any
	if err := json.Unmarshal([]byte(tmpl), &in); err != nil {
		t.Fatal(err)
	}
	in["servers"] = 200
	b, _ := json.Marshal(in)
	path := filepath.Join(t.TempDir(), "in.json")
	os.WriteFile(path, b, 0o600)
	out, errs, code := runCLI(t, "", "cost", "--inputs", path, "-o", "json")
	var res planOutput
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("plan --inputs: %d %s\n%s", code, errs, out)
	}
	if res.Deployments[0].Units != 200 || res.Deployments[1].Units != 122 {
		t.Errorf("halved fleet: %+v", res.Deployments[:2])
	}

	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"servers": 1, "frobs": 2}`), 0o600)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"cost", "--inputs", bad}, 1, "bad.json"},
		{[]string{"cost", "--inputs", filepath.Join(t.TempDir(), "none.json")}, 1, "no such file"},
		{[]string{"cost", "-o", "xml"}, 2, "want table, json, yaml or template"},
		{[]string{"cost", "extra"}, 2, "wrong number of arguments"},
	} {
		_, errs, code := runCLI(t, "", tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}
