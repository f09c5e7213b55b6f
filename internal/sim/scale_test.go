package sim

import (
	"context"
	"testing"
)

// TestScaleRemoteShare runs a small data centre whose leases mostly borrow
// remote devices and compose: the shares asked for must show in the
// placements (the complaint was a "scale" run placing 98.5% of its
// leases on the borrower's own node), and the run must be deterministic.
func TestScaleRemoteShare(t *testing.T) {
	sp := ScaleSpec{Nodes: 80, RackSize: 40, DevicesPerNode: 2, Leases: 600, Concurrency: 60, Bytes: 2e9,
		RemoteShare: 0.8, ComposeShare: 0.25, ComposeFactor: 1.5, Seed: 1}
	r, err := RunScale(sp, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r)
	if r.Placed+r.Rejected != sp.Leases || r.Placed < sp.Leases*9/10 {
		t.Fatalf("placed %d rejected %d", r.Placed, r.Rejected)
	}
	// Every lease asked to borrow off-node is remote; of the others, some
	// compose across nodes too. So the remote share is at least the share
	// asked for (less what was refused).
	if got := r.RemoteShare(); got < 0.75 {
		t.Errorf("remote share %.3f, asked %.2f", got, sp.RemoteShare)
	}
	if got := r.ComposedShare(); got < 0.2 || got > 0.4 {
		t.Errorf("composed share %.3f, asked %.2f", got, sp.ComposeShare)
	}
	if r.P50Slowdown < 1-1e-9 || r.P99Slowdown < r.P50Slowdown || r.MaxSlowdown < r.P99Slowdown || r.MeanSlowdown > 3 {
		t.Errorf("slowdowns %+v", r)
	}
	if r2, err := RunScale(sp, nil); err != nil || r2 != r {
		t.Fatalf("not deterministic: %+v vs %+v (%v)", r, r2, err)
	}
	// With no share asked, placement keeps leases on their own node.
	sp.RemoteShare, sp.ComposeShare = 0, 0
	local, err := RunScale(sp, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := local.RemoteShare(); got > 0.1 {
		t.Errorf("remote share %.3f with none asked", got)
	}
}

// TestScaleExperiment runs the scale experiment through Run (what `rialto
// sim run scale` calls) at a small size, and stops on a cancelled context.
func TestScaleExperiment(t *testing.T) {
	o := Options{ScaleSpec: ScaleSpec{Nodes: 80, Leases: 1000, Concurrency: 60, RemoteShare: 0.9, ComposeShare: 0.1}}
	r, err := Run(context.Background(), "scale", o)
	if err != nil {
		t.Fatal(err)
	}
	if m := metric(t, r, "leases on another node's devices"); m < 0.85 {
		t.Errorf("remote share %v", m)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, "scale", Options{ScaleSpec: ScaleSpec{Nodes: 80, Leases: 200000, Concurrency: 60}}); err == nil {
		t.Error("a cancelled scale run returned no error")
	}
}
