package testcluster

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
)

// TestExplanationsNameNodesAndDevices: placement's explanations (explain,
// lease show, an infeasible request's, a failed lease's reason) name
// nodes and devices as users know them, by name with the ID after:
// "n2/disk0 (dev-…)", "node n2 (node-…)".
func TestExplanationsNameNodesAndDevices(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: oneDisk, Configure: func(i int, cfg *agent.Config) { cfg.Name = fmt.Sprintf("n%d", i+1) }})
	ctx := ctxT(t)
	cl := c.Client()
	n1, n2 := c.Nodes[0].ID(), c.Nodes[1].ID()
	devs, err := cl.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dev := map[string]string{} // node ID → its disk0's ID
	for _, d := range devs {
		dev[d.NodeID] = d.ID
	}
	disk1, disk2 := "n1/disk0 ("+dev[n1]+")", "n2/disk0 ("+dev[n2]+")"

	// Kept off n1, placement chooses n2's disk and says so by name.
	req := api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20, AntiAffinity: []string{"n1"}}
	p, err := cl.Explain(ctx, req)
	if err != nil || p.State != "feasible" || len(p.Parts) != 1 || p.Parts[0].DeviceID != dev[n2] {
		t.Fatalf("explain: %v %+v", err, p)
	}
	text := strings.Join(p.Explanation, "\n")
	if !strings.Contains(text, "chose shared "+disk2+":") || !strings.Contains(text, "runner-up dedicated "+disk2+":") {
		t.Errorf("explanation does not name n2/disk0:\n%s", text)
	}
	l, err := cl.CreateLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if l, err = cl.Lease(ctx, l.ID); err != nil || l.Plan == nil || !strings.Contains(strings.Join(l.Plan.Explanation, "\n"), "chose shared "+disk2+":") {
		t.Fatalf("lease show's explanation does not name n2/disk0: %v %+v", err, l.Plan)
	}

	// Kept off both, the request is infeasible; each device's rejection
	// names it and its node.
	p, err = cl.Explain(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20, AntiAffinity: []string{"n1", "n2"}})
	if err != nil || p.State != "infeasible" {
		t.Fatalf("explain: %v %+v", err, p)
	}
	text = strings.Join(p.Explanation, "\n")
	for _, want := range []string{
		"  " + disk1 + ": affinity: node n1 (" + n1 + ") fails affinity",
		"  " + disk2 + ": affinity: node n2 (" + n2 + ") fails affinity",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("infeasible explanation lacks %q:\n%s", want, text)
		}
	}

	// Every lender refuses: the failed lease's reason names the skipped
	// nodes and their devices by name.
	for _, n := range c.Nodes {
		n.Faults().RefusePrepare.Store(true)
	}
	if _, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20}); err == nil {
		t.Fatal("created with every lender refusing")
	}
	ls, err := cl.AllLeases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var reason string
	for _, l := range ls {
		if l.State == api.LeaseFailed {
			reason = l.Reason
		}
	}
	plainly(t, "the failed lease's reason", reason, "node n1 ("+n1+")", "node n2 ("+n2+")", disk1, disk2)
	t.Logf("reason: %s", reason)
}
