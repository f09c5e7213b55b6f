package placement

import (
	"testing"

	"github.com/rialto-project/rialto/internal/fabric"
)

func TestSmoke(t *testing.T) {
	s := &Snapshot{Profiles: map[string]Profile{Seed000Model: Seed000Profile()}}
	for _, n := range []string{"n1", "n2", "n3"} {
		s.Nodes = append(s.Nodes, Node{ID: n})
		s.Links = append(s.Links, fabric.Link{ID: "l-" + n, A: n, B: "sw", Kind: fabric.Ethernet, Bandwidth: 12.5e9})
	}
	s.Devices = []Device{{ID: "d1", Node: "n2", Kind: KindBlock, Model: Seed000Model, Capacity: 1 << 40}, {ID: "d2", Node: "n2", Kind: KindBlock, Model: Seed000Model, Capacity: 1 << 40}}
	x := NewIndex(s)
	for i := 0; i < 5; i++ {
		r := Request{Kind: KindBlock, Size: 100 << 30, Borrower: "n1", Bandwidth: Seed000WriterDemand, Work: Seed000WriterWork, AllowShare: true, AllowCompose: true, Strategy: Spread}
		p, err := x.Place(r)
		if err != nil {
			t.Fatal(err)
		}
		t.Log(p.String())
		for _, e := range p.Explanation {
			t.Log("  ", e)
		}
		if err := x.Add(p.Lease(string(rune('a'+i)), r, 0)); err != nil {
			t.Fatal(err)
		}
	}
}
