package report

import (
	"context"
	"encoding/xml"
	"os"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/sim"
)

func TestRunWritesFiles(t *testing.T) {
	dir := t.TempDir()
	res, files, err := Run(context.Background(), "udp-throughput", Options{Options: sim.Options{OutDir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	csv, err := os.ReadFile(files.CSV)
	if err != nil || !strings.HasPrefix(string(csv), "stack,payload_B") {
		t.Fatalf("csv %q err %v", csv, err)
	}
	svg, err := os.ReadFile(files.SVG)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ XMLName xml.Name }
	if err := xml.Unmarshal(svg, &doc); err != nil || doc.XMLName.Local != "svg" {
		t.Fatalf("svg does not parse: %v", err)
	}
	txt, _ := os.ReadFile(files.Summary)
	if !strings.Contains(string(txt), res.Metrics[0].Name) {
		t.Fatalf("summary %q", txt)
	}
}

func TestRunUnknown(t *testing.T) {
	if _, _, err := Run(context.Background(), "nope", Options{Options: sim.Options{OutDir: t.TempDir()}}); err == nil {
		t.Fatal("unknown experiment accepted")
	}
}
