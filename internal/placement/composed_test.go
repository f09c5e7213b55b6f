package placement

import (
	"errors"
	"testing"
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
