package placement

import (
	"errors"
	"fmt"
	"testing"

	"github.com/rialto-project/rialto/internal/fabric"
)

// TestComposedPartsHoldWholeStripes: a composed plan's parts are multiples
// of the stripe unit, so the striped volume (whole stripes only) holds the
// requested size; 256 MiB over 3 parts is 85.3 MiB each, rounded up to 86.
func TestComposedPartsHoldWholeStripes(t *testing.T) {
	for _, su := range []int64{0, 64 << 10, 1 << 20} {
		s := seed000Snapshot(3, 0)
		s.Nodes = append(s.Nodes, Node{ID: "c0"})
		s.Links = append(s.Links, s.Links[0])
		s.Links[len(s.Links)-1].A = "c0"
		r := Request{Kind: KindBlock, Size: 256 << 20, Borrower: "c0", Mode: ModeComposed, Width: 3, StripeUnit: su}
		p, err := Place(s, r)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Parts) != 3 {
			t.Fatalf("stripe unit %d: %d parts", su, len(p.Parts))
		}
		unit := max(su, 1)
		minPart := p.Parts[0].Length
		for _, part := range p.Parts {
			if part.Length%unit != 0 {
				t.Errorf("stripe unit %d: part of %d bytes is not a whole number of stripe units", su, part.Length)
			}
			minPart = min(minPart, part.Length)
		}
		if vol := int64(len(p.Parts)) * (minPart / unit * unit); vol < r.Size {
			t.Errorf("stripe unit %d: volume of %d bytes, lease of %d", su, vol, r.Size)
		}
	}
	if _, err := Place(seed000Snapshot(3, 0), Request{Kind: KindBlock, Size: 1 << 20, Mode: ModeComposed, StripeUnit: -1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative stripe unit: %v, want ErrInvalid", err)
	}
}

// TestComposedPartsOnDistinctLenders: a composed block lease puts its parts
// on as many different lenders as it has parts whenever that many lenders
// have room, even where one lender's two devices come first in candidate
// order; with a single lender, its devices are composed.
func TestComposedPartsOnDistinctLenders(t *testing.T) {
	snap := func(nodes ...string) *Snapshot {
		s := &Snapshot{Nodes: []Node{{ID: "b"}}, Links: []fabric.Link{{A: "b", B: "sw", Bandwidth: 12.5e9}}}
		for _, n := range nodes {
			s.Nodes = append(s.Nodes, Node{ID: n})
			s.Links = append(s.Links, fabric.Link{A: n, B: "sw", Bandwidth: 12.5e9})
			for d := range 2 {
				s.Devices = append(s.Devices, Device{ID: fmt.Sprintf("%s-d%d", n, d), Node: n, Kind: KindBlock, Capacity: 1 << 30})
			}
		}
		return s
	}
	for _, tc := range []struct {
		nodes   []string
		width   int
		lenders int
	}{
		{[]string{"n1", "n2", "n3"}, 3, 3},
		{[]string{"n1", "n2", "n3"}, 2, 2},
		{[]string{"n1", "n2"}, 3, 2}, // only two lenders: one holds two parts
		{[]string{"n1"}, 2, 1},
	} {
		r := Request{Kind: KindBlock, Size: 768 << 20, Borrower: "b", Mode: ModeComposed, Width: tc.width, StripeUnit: 1 << 20}
		p, err := Place(snap(tc.nodes...), r)
		if err != nil {
			t.Fatalf("%d lenders, width %d: %v", len(tc.nodes), tc.width, err)
		}
		seen := map[string]bool{}
		for _, part := range p.Parts {
			seen[part.NodeID] = true
		}
		if len(p.Parts) != tc.width || len(seen) != tc.lenders {
			t.Errorf("%d lenders, width %d: %s on %d lenders, want %d", len(tc.nodes), tc.width, p, len(seen), tc.lenders)
		}
	}
}
