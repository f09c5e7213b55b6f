package testcluster

import (
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
)

// TestDrainEventsNameNoOtherTenantsLease: a drain that leaves a tenant's
// lease in place tells that tenant (lease.drain.left) and the operator
// (GET /v1/nodes/{id}/drain); the node's events, which every tenant reads,
// name no lease: another tenant's lease IDs do not leak (the API answers
// 404 for them, and placement's explanations hide them). The incomplete
// drain's node event listed the IDs of the leases left.
func TestDrainEventsNameNoOtherTenantsLease(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Tenants: []string{"alice", "bob"},
		Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20}}})
	ctx := ctxT(t)
	alice, bob := c.ClientWithToken(TenantToken("alice")), c.ClientWithToken(TenantToken("bob"))
	l, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	target := c.Nodes[0]
	// No other lender: the lease cannot move, and is left at the deadline.
	if _, err := c.Client().DrainNode(ctx, target.ID(), api.DrainRequest{DeadlineSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	var d api.Drain
	Eventually(t, 30*time.Second, "the lease to be found unmovable for now", func() bool {
		d, err = c.Client().NodeDrain(ctx, target.ID())
		return err == nil && len(d.Leases) == 1 && strings.Contains(d.Leases[0].Reason, "cannot move yet")
	})
	c.Advance(2 * time.Minute)
	Eventually(t, 30*time.Second, "the drain's end", func() bool {
		d, err = c.Client().NodeDrain(ctx, target.ID())
		return err == nil && d.State != api.DrainRunning
	})
	if d.State != api.DrainIncomplete || len(d.Leases) != 1 || d.Leases[0].LeaseID != l.ID {
		t.Fatalf("drain: %+v", d)
	}
	// Alice is told about her lease; bob sees the node's events (the
	// drain's end is recorded before its events are appended).
	Eventually(t, 30*time.Second, "alice told that her lease stays on the drained node", func() bool {
		for _, e := range allEvents(ctx, t, alice) {
			if e.Type == "lease.drain.left" && e.Subject == l.ID {
				return true
			}
		}
		return false
	})
	var evs []api.Event
	Eventually(t, 30*time.Second, "bob's view of the node's incomplete drain", func() bool {
		evs = allEvents(ctx, t, bob)
		for _, e := range evs {
			if e.Type == "node.drain.incomplete" {
				return true
			}
		}
		return false
	})
	// ... and nothing of alice's lease.
	for _, e := range evs {
		if strings.Contains(e.Subject+" "+e.Message, l.ID) {
			t.Errorf("bob's event %d (%s) names alice's lease: %q", e.ID, e.Type, e.Message)
		}
	}
}
