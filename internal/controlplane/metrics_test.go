package controlplane

import (
	"os"
	"path/filepath"
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
	})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range fams {
		b.WriteString(f.String() + "\n")
	}
	checkGoldenFile(t, filepath.Join("testdata", "metrics.golden"), b.String())
}

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
