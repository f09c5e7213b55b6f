package costplan

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata golden files")

// TestTable1 reproduces seed 002's Table 1 from the paper's inputs. The
// paper prints cloud totals truncated to 0.1 M (5.09 M is printed 5.0 M).
func TestTable1(t *testing.T) {
	res, err := Compute(PaperInputs())
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		units int
		total float64 // as printed in the paper
		prec  float64 // the printed precision
	}{
		{400, 4e6, 0.01e6},
		{244, 4.88e6, 0.01e6},
		{244, 3.17e6, 0.01e6},
		{400, 5.0e6, 0.1e6},
		{1464, 15.7e6, 0.1e6},
		{400, 4.2e6, 0.1e6},
		{1171, 10.6e6, 0.1e6},
	}
	if len(res.Rows) != len(want) {
		t.Fatalf("%d rows", len(res.Rows))
	}
	for i, w := range want {
		r := res.Rows[i]
		if r.Units != w.units {
			t.Errorf("%s %s: %d units, paper %d", r.Site, r.Element, r.Units, w.units)
		}
		if r.Total < w.total || r.Total >= w.total+w.prec {
			t.Errorf("%s %s: total %.0f, paper prints %.2f M", r.Site, r.Element, r.Total, w.total/1e6)
		}
	}
	// The cost ratios the paper quotes: about 3× on AWS, 2.5× on Azure.
	if q := res.Rows[4].Total / res.Rows[3].Total; q < 3 || q > 3.2 {
		t.Errorf("AWS ratio %.2f", q)
	}
	if q := res.Rows[6].Total / res.Rows[5].Total; q < 2.4 || q > 2.6 {
		t.Errorf("Azure ratio %.2f", q)
	}
	var buf bytes.Buffer
	if err := Format(&buf, res); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "table1.txt")
	if *rewrite {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g, buf.Bytes()) {
		t.Errorf("format differs from %s (run with -rewrite):\n%s", golden, buf.String())
	}
}

func TestDisaggregatedAndCapacity(t *testing.T) {
	in := PaperInputs()
	in.Rounding = RoundUp
	in.Load = 40e6          // queries/s at peak
	in.SlotThroughput = 5e6 // per slot, measured
	in.SlotsPerAccel = 4
	in.Options = []Option{
		{Site: "on-prem", Name: "PCIe", Element: "CPU + small FPGA", Kind: CoLocated, UnitCost: 13_000},
		{Site: "on-prem", Name: "Rialto", Element: "CPU", Kind: Disaggregated, UnitCost: 10_000, ApplianceCost: 8_000, AccelsPerAppl: 1},
	}
	res, err := Compute(in)
	if err != nil {
		t.Fatal(err)
	}
	co, dis := res.Rows[0], res.Rows[1]
	if co.Units != 244 || co.Accels != 244 || co.Utilisation > 0.01 {
		t.Errorf("co-located %+v", co)
	}
	// 40 M q/s over 20 M q/s per appliance: 2 appliances.
	if dis.Units != 244 || dis.Accels != 2 || dis.Total != 244*10_000+2*8_000 {
		t.Errorf("disaggregated %+v", dis)
	}
	// A load beyond what one accelerator per server sustains sizes the fleet.
	in.Load, in.SlotThroughput, in.SlotsPerAccel = 1e9, 1e6, 1
	res, _ = Compute(in)
	if res.Rows[0].Units != 1000 || res.Rows[0].Note == "" {
		t.Errorf("capacity-bound %+v", res.Rows[0])
	}
}

func TestValidate(t *testing.T) {
	for _, in := range []Inputs{
		{},
		{Servers: 1, ServerVCPUs: 1, FunctionShare: 1},
		{Servers: 1, ServerVCPUs: 1, FunctionShare: 0.2, ResidualShare: 0.3},
		{Servers: 1, ServerVCPUs: 1, Load: 5},
		{Servers: 1, ServerVCPUs: 1, Options: []Option{{Kind: CPUOnly}}},
		{Servers: 1, ServerVCPUs: 1, Options: []Option{{Kind: Disaggregated, UnitCost: 1}}},
		{Servers: 1, ServerVCPUs: 1, Options: []Option{{Kind: "quantum", UnitCost: 1}}},
	} {
		if _, err := Compute(in); !errors.Is(err, ErrInputs) {
			t.Errorf("%+v: %v", in, err)
		}
	}
}

func TestParseInputs(t *testing.T) {
	golden := filepath.Join("testdata", "paper.json")
	if *rewrite {
		b, _ := json.MarshalIndent(PaperInputs(), "", "  ")
		if err := os.WriteFile(golden, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(golden)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in, err := ParseInputs(f)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, PaperInputs()) {
		t.Fatalf("parsed %+v", in)
	}
	for _, bad := range []string{`{"servers": 1, "bogus": 2}`, `{`, `{"servers": 0}`} {
		if _, err := ParseInputs(strings.NewReader(bad)); !errors.Is(err, ErrInputs) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
