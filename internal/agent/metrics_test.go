package agent

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/dataplane/accel/gateway"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/metrics"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files under testdata/")

// TestMetricsPinned pins the metric families an agent serves at /metrics
// (its own, and those of the appliances and gateways its accelerator
// driver runs) in testdata/metrics.golden: name, type, labels, help.
// Dashboards and alerts depend on them, so a change must be deliberate
// (-rewrite) and show in review.
func TestMetricsPinned(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, err := New(testConfig("http://127.0.0.1:1", dir))
	if err != nil {
		t.Fatal(err)
	}
	// An opened block device, so that the usage collector has series.
	if _, err := a.drivers[api.KindBlock].(Opener).Open(ctx, DeviceConfig{Name: "disk0", Kind: api.KindBlock,
		Path: filepath.Join(dir, "disk0.img"), Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	echo, err := roles.New(ctx, roles.Spec{Name: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close(ctx)
	fams, err := metrics.Families(func(r prometheus.Registerer) {
		a.registerMetrics(r)
		app, err := appliance.New(appliance.Config{Slots: 1, SlotMemory: 4096, Metrics: r})
		if err != nil {
			t.Fatal(err)
		}
		app.Close()
		if _, err := gateway.New(gateway.Config{Metrics: r}, []gateway.Backend{gateway.Local(echo)}); err != nil {
			t.Fatal(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range fams {
		b.WriteString(f.String() + "\n")
	}
	path := filepath.Join("testdata", "metrics.golden")
	if *rewrite {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -rewrite to create it)", err)
	}
	if b.String() != string(want) {
		t.Errorf("%s differs (run with -rewrite to accept):\ngot\n%s\nwant\n%s", path, b.String(), want)
	}
}
