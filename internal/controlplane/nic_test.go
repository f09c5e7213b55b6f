package controlplane

import (
	"net/http"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// joinNICs registers lenders n1..nN, each lending one interface "wan0" of
// rate bytes/s (as `rialto agent --nic` reports it).
func (e *env) joinNICs(n int, rate int64) map[string]string {
	e.t.Helper()
	ids := map[string]string{} // node ID → name
	for i := 1; i <= n; i++ {
		name := "n" + string(rune('0'+i))
		ids[e.joinSpecs(name, nil, api.DeviceSpec{Name: "wan0", Kind: api.KindNIC, Capacity: rate, Model: "lent-nic", Sharing: "partitionable"})] = name
	}
	return ids
}

// TestNICLeases: the control plane places nic leases by bandwidth — a
// share of one lender's rate, a bond over different lenders, a whole
// interface — prepares each part at its rate, refuses what exceeds every
// lender's remaining rate saying why, and frees the rate on release.
func TestNICLeases(t *testing.T) {
	e := newEnv(t)
	const link = 12_500_000 // 100 Mbit/s
	e.joinNICs(3, link)

	// A share: 40 Mbit/s of one lender's 100.
	plan, err := e.alice.Explain(e.ctx(), api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 5e6})
	if err != nil || plan.State != "feasible" {
		t.Fatalf("explain: %v %+v", err, plan)
	}
	text := strings.Join(plan.Explanation, "\n")
	for _, want := range []string{"request: nic 40 Mbit/s", "chose shared", "nic: 40 Mbit/s of", "lent interface dev-"} {
		if !strings.Contains(text, want) {
			t.Errorf("explanation lacks %q:\n%s", want, text)
		}
	}
	share, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 5e6})
	if err != nil {
		t.Fatal(err)
	}
	if share.Mode != api.ModeShared || share.Size != 5e6 || len(share.Parts) != 1 || share.Parts[0].Length != 5e6 || share.StripeUnit != 0 {
		t.Fatalf("share: %+v", share)
	}
	prep := e.prepares(share.ID)
	if len(prep) != 1 || prep[0].Kind != api.KindNIC || prep[0].Length != 5e6 {
		t.Fatalf("prepare of the share: %+v", prep)
	}

	// A bond of two: 160 Mbit/s as 80 on each of two different lenders.
	bond, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 20e6, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if bond.Mode != api.ModeComposed || len(bond.Parts) != 2 || bond.Parts[0].NodeID == bond.Parts[1].NodeID || bond.StripeUnit != 0 {
		t.Fatalf("bond: %+v", bond)
	}
	for _, p := range bond.Parts {
		if p.Length != 10e6 {
			t.Fatalf("bond part %+v: want 80 Mbit/s", p)
		}
	}
	if got := len(e.prepares(bond.ID)); got != 2 {
		t.Fatalf("bond prepared on %d lenders", got)
	}
	// The lenders left: the share's lender has 60 Mbit/s, the bond's two
	// 20 each (one of them may be the share's: then 0 there); whatever
	// the layout, 70 Mbit/s fits nowhere and the refusal names each
	// interface's free rate.
	_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 8.75e6})
	wantCode(t, err, http.StatusUnprocessableEntity, "free, needs 70 Mbit/s")
	// A bond wider than the lenders there are.
	_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 1e6, Count: 4})
	wantCode(t, err, http.StatusUnprocessableEntity, "a bond of 4 needs as many different lenders")

	// Released, the bond's rate is free again: 70 Mbit/s fits.
	if _, err := e.alice.ReleaseLease(e.ctx(), bond.ID); err != nil {
		t.Fatal(err)
	}
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 8.75e6})
	if err != nil {
		t.Fatal(err)
	}
	// A whole interface (no bandwidth): dedicated, an unused one, at its
	// full rate.
	whole, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindNIC})
	if err != nil {
		t.Fatal(err)
	}
	if whole.Mode != api.ModeDedicated || whole.Parts[0].Length != link || whole.Size != link || whole.NodeID == share.NodeID || whole.NodeID == l.NodeID {
		t.Fatalf("whole: %+v (share on %s, 70 Mbit/s on %s)", whole, share.NodeID, l.NodeID)
	}
	leases, err := e.alice.Leases(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 3 {
		t.Fatalf("%d leases", len(leases))
	}
}

// TestNICValidation: what a nic request may not say is refused with a
// clear error before placement.
func TestNICValidation(t *testing.T) {
	e := newEnv(t)
	e.joinNICs(2, 12_500_000)
	for _, c := range []struct {
		req  api.LeaseRequest
		want string
	}{
		{api.LeaseRequest{Kind: api.KindNIC, Size: 1 << 20}, "sized by bandwidth"},
		{api.LeaseRequest{Kind: api.KindNIC, Count: 2}, "needs a bandwidth"},
		{api.LeaseRequest{Kind: api.KindNIC, Count: 2, Whole: true, Bandwidth: 1e6}, "not whole or dedicated"},
		{api.LeaseRequest{Kind: api.KindNIC, Count: 2, Mode: api.ModeShared, Bandwidth: 1e6}, "not shared"},
		{api.LeaseRequest{Kind: api.KindNIC, Whole: true, Mode: api.ModeShared}, "dedicated, not shared"},
		{api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 1e6, StripeUnit: 4096}, "stripe_unit"},
		{api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 1e6, BandwidthCap: 1e6}, "block leases only"},
		{api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 1e18}, "more than any interface"},
		{api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 1e6, Role: "echo"}, "accel leases only"},
		{api.LeaseRequest{Kind: "wifi"}, "block, memory, accel or nic"},
	} {
		_, err := e.alice.CreateLease(e.ctx(), c.req)
		wantCode(t, err, http.StatusBadRequest, c.want)
	}
	// Dedicated means a whole interface of at least the bandwidth.
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindNIC, Mode: api.ModeDedicated, Bandwidth: 1e6})
	if err != nil {
		t.Fatal(err)
	}
	if l.Mode != api.ModeDedicated || l.Parts[0].Length != 12_500_000 {
		t.Fatalf("dedicated: %+v", l)
	}
}

// prepares returns the prepare requests the lenders got for lease id.
func (e *env) prepares(id string) []api.PrepareRequest {
	e.lender.mu.Lock()
	defer e.lender.mu.Unlock()
	var out []api.PrepareRequest
	for _, r := range e.lender.exports {
		if r.LeaseID == id {
			out = append(out, r)
		}
	}
	return out
}
