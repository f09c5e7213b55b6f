package sim

import "testing"

func TestScaleSmall(t *testing.T) {
	sp := ScaleSpec{Nodes: 80, RackSize: 40, DevicesPerNode: 2, Leases: 600, Concurrency: 120, Bytes: 2e9, Seed: 1}
	r := RunScale(sp, nil)
	if r.Placed+r.Rejected != sp.Leases || r.Placed < sp.Leases*9/10 {
		t.Fatalf("placed %d rejected %d", r.Placed, r.Rejected)
	}
	if r.MeanSlowdown < 1-1e-9 || r.MeanSlowdown > 3 {
		t.Fatalf("mean slowdown %v", r.MeanSlowdown)
	}
	t.Logf("%+v", r)
	if r2 := RunScale(sp, nil); r2 != r {
		t.Fatalf("not deterministic: %+v vs %+v", r, r2)
	}
}
