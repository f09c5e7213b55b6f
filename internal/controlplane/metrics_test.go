package controlplane

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/internal/metrics"
)

// TestMetricsPinned pins the control plane's metric families (name, type,
// labels, help) in testdata/metrics.golden: dashboards and alerts depend
// on them, so a change must be deliberate (-rewrite) and show in review.
func TestMetricsPinned(t *testing.T) {
	t.Parallel()
	fams, err := metrics.Families(func(r prometheus.Registerer) {
		newServerMetrics(r)
		new(movers).init(r)
		newForwardedCalls(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range fams {
		b.WriteString(f.String() + "\n")
	}
	checkGoldenFile(t, filepath.Join("testdata", "metrics.golden"), b.String())
	// The operations guide's metrics table lists exactly the families a
	// control plane and an agent register (the agent's are pinned in its
	// own golden file, by its TestMetricsPinned).
	registered := map[string]string{}
	for _, f := range fams {
		registered[f.Name] = "the control plane"
	}
	agent, err := os.ReadFile(filepath.Join("..", "agent", "testdata", "metrics.golden"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(agent), "\n") {
		if n, _, ok := strings.Cut(line, " "); ok {
			registered[n] = "an agent"
		}
	}
	documented := documentedMetrics(t, filepath.Join("..", "..", "docs", "operations.md"))
	for n, who := range registered {
		if !documented[n] {
			t.Errorf("%s registers %s, which is not in the metrics table of docs/operations.md (Monitoring)", who, n)
		}
	}
	for n := range documented {
		if registered[n] == "" {
			t.Errorf("docs/operations.md's metrics table lists %s, which neither the control plane nor an agent registers", n)
		}
	}
}

// documentedMetrics returns the metric names in the first column of the
// metrics table of the operations guide at path: the rows of the table
// whose header is "| metric | type | labels | what |", each name in
// backquotes (a row may name several).
func documentedMetrics(t testing.TB, path string) map[string]bool {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	in := false
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "| metric | type | labels | what |") {
			in = true
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.HasPrefix(cells[1], "---") {
			continue
		}
		for _, m := range metricName.FindAllStringSubmatch(cells[1], -1) {
			out[m[1]] = true
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no metrics table (| metric | type | labels | what |)", path)
	}
	return out
}

var metricName = regexp.MustCompile("`(rialto_[a-z0-9_]+)`")

func checkGoldenFile(t *testing.T, path, got string) {
	t.Helper()
	if *rewrite {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -rewrite to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run with -rewrite to accept):\ngot\n%s\nwant\n%s", path, got, want)
	}
}
