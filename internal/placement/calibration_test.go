package placement

import (
	"testing"
)

// writerRate is each writer's predicted rate with n writers over k devices.
func writerRate(k, n int) float64 {
	return Predict(seed000Snapshot(k, n))[0].Bandwidth
}

func slowdown(k, n int) float64 { return 1 - writerRate(k, n)/SMUFINWriterDemand }

// TestSMUFINCalibration pins the profile against seed 000's findings; the
// tolerance is explained in docs/placement.md.
func TestSMUFINCalibration(t *testing.T) {
	cases := []struct {
		devices, holds int
		nextMin        float64 // the first writer beyond holds slows at least this much
		nextMax        float64 // and at most this much
	}{
		{1, 2, 0.05, 1},     // sharing one device: 2 fine, 3 degrade
		{2, 3, 0.01, 0.05},  // 2-composition: 3 fine, 4 degrade (seed: "at four")
		{3, 5, 0.01, 0.05},  // 3-composition: "about 6": 6 within 5%
		{3, 6, 0.10, 1},     // … and 7 clearly degrades
		{2, 4, 0.15, 1},     // 5 writers on 2 devices degrade clearly (Fig. 8 b)
		{1, 1, 0, 0.000001}, // one writer alone runs at its demand
	}
	for _, c := range cases {
		if c.devices == 3 && c.holds == 6 {
			if s := slowdown(3, 7); s < c.nextMin {
				t.Errorf("3 devices, 7 writers: slowdown %.3f, want ≥ %.2f", s, c.nextMin)
			}
			continue
		}
		if c.devices == 2 && c.holds == 4 {
			if s := slowdown(2, 5); s < c.nextMin {
				t.Errorf("2 devices, 5 writers: slowdown %.3f", s)
			}
			continue
		}
		for n := 1; n <= c.holds; n++ {
			if s := slowdown(c.devices, n); s > 1e-9 {
				t.Errorf("%d devices, %d writers: slowdown %.4f, want none", c.devices, n, s)
			}
		}
		if c.devices == 1 && c.holds == 1 {
			continue
		}
		s := slowdown(c.devices, c.holds+1)
		if s < c.nextMin || s > c.nextMax {
			t.Errorf("%d devices, %d writers: slowdown %.4f, want in [%.2f, %.2f]", c.devices, c.holds+1, s, c.nextMin, c.nextMax)
		}
	}
	// Composition scales the maximum linearly: one writer alone on k devices
	// could use k × 2 GB/s.
	p := SMUFINProfile()
	if p.Capacity(1) != SMUFINMaxBandwidth {
		t.Fatalf("single-stream capacity %v", p.Capacity(1))
	}
	// Delivered bandwidth falls below the maximum as writers are added.
	for n := 2; n <= 8; n++ {
		if p.Capacity(n) >= p.Capacity(n-1) {
			t.Fatalf("delivered bandwidth must fall with concurrency: %d → %v", n, p.Capacity(n))
		}
	}
}

// TestFig8 pins seed 000's Fig. 8 comparison: for 5 writers and 2 devices,
// composing both beats sharing one (a), and beats one dedicated plus four
// shared (c) for the four; the policy, placing the writers one by one,
// composes.
func TestFig8(t *testing.T) {
	b := writerRate(2, 5)
	a := writerRate(1, 5)
	c4 := writerRate(1, 4) // the four shared writers of (c)
	if !(b > a && b > c4) {
		t.Fatalf("composition %v must beat shared %v and the shared four of (c) %v", b, a, c4)
	}
	s := seed000Snapshot(2, 0)
	for i := 0; i < 5; i++ {
		node := []string{"c0", "c1", "c2", "c3", "c4"}[i]
		s.Nodes = append(s.Nodes, Node{ID: node})
		s.Links = append(s.Links, s.Links[0])
		s.Links[len(s.Links)-1].A = node
		r := Request{Kind: KindBlock, Size: 200 << 30, Borrower: node, Bandwidth: SMUFINWriterDemand, Work: SMUFINWriterWork,
			AllowShare: true, AllowCompose: true, Strategy: Spread}
		p, err := Place(s, r)
		if err != nil {
			t.Fatal(err)
		}
		if p.Mode != ModeComposed || len(p.Parts) != 2 {
			t.Fatalf("writer %d: %s, want composed over both devices\n%v", i, p, p.Explanation)
		}
		s.Leases = append(s.Leases, p.Lease(node, r, s.Now))
	}
}
