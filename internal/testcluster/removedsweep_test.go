package testcluster

import (
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestSweepLosesLeaseOnRemovedNode: a lease that holds a part on a node
// the store has removed — one that took the part in a race with the
// removal, after `node remove` had looked for the node's leases (here the
// store's removal alone stands for that interleaving) — is lost by the
// next sweep, its reason naming the removal, and its other lender tears
// its part down. The sweep looked no further at a removed node: the lease
// stayed active for good on a lender the control plane no longer knew.
func TestSweepLosesLeaseOnRemovedNode(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2})
	ctx := ctxT(t)
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20, Mode: api.ModeComposed, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Parts) != 2 || l.Parts[0].NodeID == l.Parts[1].NodeID {
		t.Fatalf("lease parts %+v", l.Parts)
	}
	gone := c.NodeByID(l.Parts[0].NodeID)
	other := c.NodeByID(l.Parts[1].NodeID)
	gone.Kill()
	if _, _, err := c.st.RemoveNode(ctx, gone.ID(), nil, api.Event{At: c.Clock.Now(), Type: "node.removed", Subject: gone.ID(), State: string(api.NodeRemoved)}); err != nil {
		t.Fatal(err)
	}
	c.Sweep()
	got := c.Lease(l.ID)
	if got.State != api.LeaseLost || !strings.Contains(got.Reason, "was removed") {
		t.Fatalf("a lease with a part on a removed node after a sweep: %s (%s)", got.State, got.Reason)
	}
	c.Eventually("the other lender to let go of its part", func() bool { return !other.Serves(l.ID) })
}
