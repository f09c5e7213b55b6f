package controlplane

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

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
	t.Parallel()
	e := newEnv(t)
	const link = 12_500_000 // 100 Mbit/s
	e.joinNICs(3, link)

	// A share: 40 Mbit/s of one lender's 100.
	plan, err := e.alice.Explain(e.ctx(), api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 5e6})
	if err != nil || plan.State != "feasible" {
		t.Fatalf("explain: %v %+v", err, plan)
	}
	text := strings.Join(plan.Explanation, "\n")
	// Its rate is a link rate as the CLI prints it (resource.FormatLinkRate),
	// the rate it wants and the one predicted too.
	for _, want := range []string{"request: nic 40Mbit/s", "wants 40Mbit/s without slowdown", "predicted 40Mbit/s", "chose shared", "nic: 40Mbit/s of", "lent interface n", "/wan0 (dev-"} {
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
	wantCode(t, err, http.StatusUnprocessableEntity, "free, needs 70Mbit/s")
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
	t.Parallel()
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
		{api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 1e18}, "bandwidth 8Ebit/s is more than any interface carries (at most 9.01Pbit/s)"},
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

// TestNICBondLosesPart: a bond whose lender goes down past the grace
// period loses that lender's part and goes on with the others: the lease
// stays active, the part is marked lost, an event says so, the part's
// rate is freed, the survivors are not told to tear down and keep their
// parts in their heartbeat answers, the down lender is told to tear down
// when it comes back; losing every lender ends the lease as lost.
func TestNICBondLosesPart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const link = 12_500_000
	type lender struct {
		id string
		cl *api.Client
	}
	var ls []lender
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("n%d", i)
		jr, err := e.boot.Join(e.ctx(), api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1",
			Fingerprint: api.Fingerprint{MachineID: "mid-" + name, Hostname: name},
			Devices:     []api.DeviceSpec{{Name: "wan0", Kind: api.KindNIC, Capacity: link, Model: "lent-nic", Sharing: "partitionable"}}})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, lender{jr.NodeID, e.boot.WithToken(jr.Credential)})
	}
	bond, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 3e6, Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	partOn := func(l api.Lease, node string) (int, api.Part) {
		for i, p := range l.Parts {
			if p.NodeID == node {
				return i, p
			}
		}
		t.Fatalf("lease %s has no part on %s", l.ID, node)
		return -1, api.Part{}
	}
	beat := func(l lender, leases ...string) api.HeartbeatResponse {
		t.Helper()
		r, err := l.cl.Heartbeat(e.ctx(), l.id, api.Heartbeat{Health: "ok", Leases: leases})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// n3 goes silent past the grace period; n1 and n2 heartbeat.
	e.clock.Advance(11 * time.Second)
	beat(ls[0], bond.ID)
	beat(ls[1], bond.ID)
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	got, err := e.alice.Lease(e.ctx(), bond.ID)
	if err != nil {
		t.Fatal(err)
	}
	i, lost := partOn(got, ls[2].id)
	if got.State != api.LeaseActive || !lost.Lost() || lost.URI == "" {
		t.Fatalf("after n3's loss: %+v", got)
	}
	for _, p := range got.Parts {
		if p.NodeID != ls[2].id && p.Lost() {
			t.Fatalf("a surviving part is lost: %+v", got.Parts)
		}
	}
	if torn := e.lender.tornDown(); len(torn) != 0 {
		t.Fatalf("the survivors were told to tear down: %v", torn)
	}
	evs, err := e.alice.Events(e.ctx(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(ev api.Event) bool {
		return ev.Type == "lease.part.lost" && ev.Subject == bond.ID && strings.Contains(ev.Message, fmt.Sprintf("part(s) %d lost", i)) &&
			strings.Contains(ev.Message, "goes on with 2 of 3")
	}) {
		t.Fatalf("no lease.part.lost event: %+v", evs)
	}
	devs, _ := e.admin.Devices(e.ctx())
	for _, d := range devs {
		if d.ID == lost.DeviceID && d.Allocated != 0 {
			t.Fatalf("the lost part's rate is still held: %+v", d)
		}
	}
	// The survivors keep their parts; n3, back, is told to tear down.
	r := beat(ls[0], bond.ID)
	_, p0 := partOn(got, ls[0].id)
	if len(r.Teardown) != 0 || len(r.Leases) != 1 || !slices.Equal(r.Leases[0].Parts, []api.PartRef{{DeviceID: p0.DeviceID, Offset: p0.Offset, Length: p0.Length}}) {
		t.Fatalf("a survivor's answer: %+v", r)
	}
	if r := beat(ls[2], bond.ID); !slices.Equal(r.Teardown, []string{bond.ID}) || len(r.Leases) != 0 {
		t.Fatalf("the lost lender's answer: %+v", r)
	}
	// Losing the other two: one more degrades it, the last ends it.
	e.clock.Advance(11 * time.Second)
	beat(ls[0], bond.ID)
	beat(ls[2])
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.alice.Lease(e.ctx(), bond.ID); got.State != api.LeaseActive {
		t.Fatalf("with one lender left: %+v", got)
	}
	e.clock.Advance(11 * time.Second)
	beat(ls[1])
	beat(ls[2])
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.alice.Lease(e.ctx(), bond.ID); got.State != api.LeaseLost || !strings.Contains(got.Reason, "2 other part(s) were lost before") {
		t.Fatalf("with every lender lost: %+v", got)
	}
}

// TestNICBondLostFirstPartNotShownAsItsNode: once a bond lost the lender
// of its first part, the lease (show and list) names the node and device
// of the first part it still holds, not the lost one's.
func TestNICBondLostFirstPartNotShownAsItsNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var ids []string
	var cls []*api.Client
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("n%d", i)
		jr, err := e.boot.Join(e.ctx(), api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1",
			Fingerprint: api.Fingerprint{MachineID: "mid-" + name, Hostname: name},
			Devices:     []api.DeviceSpec{{Name: "wan0", Kind: api.KindNIC, Capacity: 12_500_000, Model: "lent-nic", Sharing: "partitionable"}}})
		if err != nil {
			t.Fatal(err)
		}
		ids, cls = append(ids, jr.NodeID), append(cls, e.boot.WithToken(jr.Credential))
	}
	bond, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 2e6, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	first, second := bond.Parts[0], bond.Parts[1]
	if bond.NodeID != first.NodeID {
		t.Fatalf("a new bond on %s, its first part on %s", bond.NodeID, first.NodeID)
	}
	// The first part's lender goes silent past the grace period.
	e.clock.Advance(11 * time.Second)
	for i, id := range ids {
		if id == second.NodeID {
			if _, err := cls[i].Heartbeat(e.ctx(), id, api.Heartbeat{Health: "ok", Leases: []string{bond.ID}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	got, err := e.alice.Lease(e.ctx(), bond.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.LeaseActive || !got.Parts[0].Lost() || got.Count != 1 {
		t.Fatalf("after the first lender's loss: %+v", got)
	}
	if got.NodeID != second.NodeID || got.DeviceID != second.DeviceID {
		t.Errorf("lease show: node %s device %s, want the surviving part's %s %s", got.NodeID, got.DeviceID, second.NodeID, second.DeviceID)
	}
	list, err := e.alice.Leases(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].NodeID != second.NodeID || list[0].DeviceID != second.DeviceID {
		t.Errorf("leases: %+v, want it on the surviving part's %s %s", list, second.NodeID, second.DeviceID)
	}
}

// TestQuotaBandwidthNIC: the bandwidth quota counts every kind together in
// bytes/s, and its refusal says so in bytes/s; a nic request's own rate is
// a link rate everywhere else (its size, explain), so the refusal gives it
// as one too, with the bytes/s the quota counts it as. A block request's
// refusal stays in bytes/s alone.
func TestQuotaBandwidthNIC(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) {
		c.Quotas = Quotas{Tenants: map[string]Quota{"bob": {Bandwidth: 100e6}}}
	})
	e.joinSpecs("n1", nil,
		api.DeviceSpec{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"},
		api.DeviceSpec{Name: "wan0", Kind: api.KindNIC, Capacity: 125e6, Model: "lent-nic", Sharing: "partitionable"})
	if _, err := e.bob.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Bandwidth: 50e6}); err != nil {
		t.Fatal(err)
	}
	nic := api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 62.5e6} // 500Mbit/s
	const want = "tenant bob would use 112.5MB/s of 100MB/s with this nic lease's 500Mbit/s (62.5MB/s)"
	_, err := e.bob.CreateLease(e.ctx(), nic)
	wantQuota(t, err, want)
	plan, err := e.bob.Explain(e.ctx(), nic)
	if text := strings.Join(plan.Explanation, "\n"); err != nil || plan.State != "infeasible" || !strings.Contains(text, want) {
		t.Fatalf("explain over quota: %v %s\n%s", err, plan.State, text)
	}
	_, err = e.bob.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Bandwidth: 62.5e6})
	wantQuota(t, err, "tenant bob would use 112.5MB/s of 100MB/s")
	if strings.Contains(err.Error(), "bit/s") || strings.Contains(err.Error(), "with this") {
		t.Errorf("a block request's refusal: %v", err)
	}
}
