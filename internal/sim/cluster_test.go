package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
	"github.com/rialto-project/rialto/internal/placement"
)

// TestClusterPathMatchesFullTree checks that starting a degree-1 borrower's
// path from its neighbour's tree gives exactly the path of the borrower's
// own shortest-path tree, ties included.
func TestClusterPathMatchesFullTree(t *testing.T) {
	s := scaleSnapshot(ScaleSpec{Nodes: 60, RackSize: 8, DevicesPerNode: 1})
	// Uneven latencies and a second uplink on one server (degree 2) and a
	// device attached to a switch, so both code paths and latency ties are
	// exercised.
	for i := range s.Links {
		s.Links[i].Latency = time.Duration(1+i%3) * time.Microsecond
	}
	s.Links = append(s.Links, fabric.Link{ID: "n00003-b", A: "n00003", B: "tor0001", Kind: fabric.Ethernet, Bandwidth: 1e9})
	s.Devices = append(s.Devices, placement.Device{ID: "sw-dev", Node: "n00000", Attach: "tor0002", Kind: placement.KindBlock, Capacity: 1 << 40, Bandwidth: 1e9})
	c := NewCluster(s)
	for _, n := range s.Nodes {
		for _, d := range s.Devices {
			got := c.Path(n.ID, d.ID)
			at := d.Attach
			if at == "" {
				at = d.Node
			}
			var want []string
			if n.ID != at {
				links, _, ok := c.Graph.Path(n.ID, at, fabric.ByHops)
				if !ok {
					t.Fatalf("%s -> %s unreachable", n.ID, at)
				}
				for _, li := range links {
					want = append(want, c.Links[li].Name)
				}
			}
			want = append(want, d.ID)
			var names []string
			for _, r := range got {
				names = append(names, r.Name)
			}
			if fmt.Sprint(names) != fmt.Sprint(want) {
				t.Fatalf("Path(%s, %s) = %v, want %v", n.ID, d.ID, names, want)
			}
		}
	}
	if len(c.trees) > 10 {
		t.Errorf("%d trees for 8 racks; want one per switch plus the two-link server", len(c.trees))
	}
}
