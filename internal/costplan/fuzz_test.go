package costplan

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"strings"
	"testing"
)

// FuzzParseInputs reads arbitrary cost-plan inputs (a file the user
// writes, as testdata/paper.json): no panics; a refusal wraps ErrInputs
// (ParseInputs's, or Compute's of numbers too large to plan with); a plan
// computed has non-negative unit and accelerator counts and finite,
// non-negative totals, which Format prints.
func FuzzParseInputs(f *testing.F) {
	paper, err := os.ReadFile("testdata/paper.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(paper)
	f.Add([]byte(`{"servers":10,"server_vcpus":8,"function_share":0.5,"residual_share":0.1,"load":100,"slot_throughput":7,"slots_per_accel":2,` +
		`"options":[{"site":"s","name":"d","element":"e","kind":"disaggregated","unit_cost":1,"appliance_cost":5,"accels_per_appliance":4}]}`))
	f.Add([]byte(`{"servers":1,"server_vcpus":1,"function_share":0,"residual_share":0,"options":[{"kind":"cpu-only","hourly":1,"vcpus":-4}]}`))
	f.Add([]byte(`{"servers":9223372036854775807,"server_vcpus":2,"function_share":0.1,"residual_share":0,"options":[]}`))
	f.Add([]byte(`{"servers":1,"server_vcpus":1,"function_share":0.5,"residual_share":0,"load":1e308,"slot_throughput":1e-308,` +
		`"options":[{"kind":"co-located","unit_cost":1,"accels_per_unit":-3}]}`))
	f.Add([]byte(`{"servers":1,"extra":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := ParseInputs(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, ErrInputs) {
				t.Fatalf("refusal does not wrap ErrInputs: %v", err)
			}
			return
		}
		res, err := Compute(in)
		if err != nil {
			if !errors.Is(err, ErrInputs) {
				t.Fatalf("Compute's refusal does not wrap ErrInputs: %v", err)
			}
			return
		}
		finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) && x >= 0 }
		if !finite(res.CPUDemand) {
			t.Fatalf("CPU demand %g", res.CPUDemand)
		}
		for _, r := range res.Rows {
			if r.Units < 0 || r.Accels < 0 || !finite(r.Total) || !finite(r.Utilisation) {
				t.Fatalf("option %+v priced as %d units, %d accelerators, total %g, utilisation %g", r.Option, r.Units, r.Accels, r.Total, r.Utilisation)
			}
		}
		if err := Format(io.Discard, res); err != nil && !strings.Contains(err.Error(), "costplan") {
			t.Fatalf("format: %v", err)
		}
	})
}
