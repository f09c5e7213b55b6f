package testcluster

import (
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestAffinityNodeNameNotAmbiguous: names are not unique. Another machine
// joins, with the bootstrap token, under a live lender's name: a lease
// whose affinity names that name is refused (409, the nodes' IDs listed)
// rather than placed on whichever of the two came first (the newcomer
// would have been handed a tenant's bytes meant for the lender); the ID
// still pins the lender; an anti-affinity term of that name keeps both
// out. Once the newcomer is removed, the name means the lender again.
func TestAffinityNodeNameNotAmbiguous(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Tenants: []string{"alice"}})
	ctx := ctxT(t)
	lender, other := c.Nodes[0], c.Nodes[1]
	newcomer := c.JoinAgentless(lender.Name, "another-machine", 64<<20)
	alice := c.ClientWithToken(TenantToken("alice"))
	create := func(aff, anti []string) (api.Lease, error) {
		return alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, Mode: api.ModeShared, Affinity: aff, AntiAffinity: anti})
	}

	_, err := create([]string{lender.Name}, nil)
	if !api.IsCode(err, api.CodeConflict) || !strings.Contains(err.Error(), "ambiguous") ||
		!strings.Contains(err.Error(), lender.ID()) || !strings.Contains(err.Error(), newcomer) {
		t.Fatalf("a lease with affinity to a name two live nodes have: %v", err)
	}
	if l, err := create([]string{lender.ID()}, nil); err != nil || l.NodeID != lender.ID() {
		t.Fatalf("a lease with affinity to the lender's ID: %v %+v", err, l)
	}
	for range 3 {
		if l, err := create(nil, []string{lender.Name}); err != nil || l.NodeID != other.ID() {
			t.Fatalf("a lease with anti-affinity to a name two nodes have: %v, placed on %s (want %s)", err, l.NodeID, other.ID())
		}
	}

	if _, err := c.Client().RemoveNode(ctx, newcomer, true); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if l, err := create([]string{lender.Name}, nil); err != nil || l.NodeID != lender.ID() {
			t.Fatalf("a lease with affinity to the name of a live and a removed node: %v %+v", err, l)
		}
	}
}
