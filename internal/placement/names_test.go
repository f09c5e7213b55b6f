package placement

import (
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/fabric"
)

// named is s with names for its nodes and devices, sorting the other way
// round from their IDs (n00 is host99, its device n00-d1 disk8), so that
// a ranking on names instead of IDs would show.
func named(s *Snapshot) *Snapshot {
	c := *s
	c.Nodes = append([]Node(nil), s.Nodes...)
	c.Devices = append([]Device(nil), s.Devices...)
	for i := range c.Nodes {
		c.Nodes[i].Name = fmt.Sprintf("host%02d", 99-i)
	}
	for i := range c.Devices {
		var n, d int
		fmt.Sscanf(c.Devices[i].ID, "n%d-d%d", &n, &d)
		c.Devices[i].Name = fmt.Sprintf("disk%d", 9-d)
	}
	return &c
}

// rawID is a node or device ID of randomSnapshot's not inside
// parentheses: named explanations give IDs only after a name.
var rawID = regexp.MustCompile(`(^|[^(])\bn\d\d(-d\d)?\b`)

// TestNamesChangeOnlyText: with names for nodes and devices placement
// decides the same (parts, mode, impacts; the same constraint and
// rejected candidates, by ID), and its explanations name every node and
// device by name with the ID in parentheses after it.
func TestNamesChangeOnlyText(t *testing.T) {
	rounds := 30
	if testing.Short() {
		rounds = 10
	}
	for seed := int64(1); seed <= int64(rounds); seed++ {
		rng := rand.New(rand.NewSource(seed))
		s := randomSnapshot(rng)
		for i := 0; i < 20; i++ {
			r := randomRequest(rng, s)
			ns := named(s)
			p, err := Place(s, r)
			np, nerr := Place(ns, r)
			if p.String() != np.String() || !reflect.DeepEqual(p.Impacts, np.Impacts) || len(p.Explanation) != len(np.Explanation) {
				t.Fatalf("seed %d step %d: %v without names, %v with:\n%s\n\n%s", seed, i, p, np, strings.Join(p.Explanation, "\n"), strings.Join(np.Explanation, "\n"))
			}
			var ie, nie *InfeasibleError
			if errors.As(err, &ie) != errors.As(nerr, &nie) || (err == nil) != (nerr == nil) {
				t.Fatalf("seed %d step %d: %v without names, %v with", seed, i, err, nerr)
			}
			texts := np.Explanation
			if nie != nil {
				if ie.Constraint != nie.Constraint || len(ie.Rejections) != len(nie.Rejections) || ie.Omitted != nie.Omitted {
					t.Fatalf("seed %d step %d: %v without names, %v with", seed, i, err, nerr)
				}
				for k, rj := range nie.Rejections {
					if rj.Candidate != ie.Rejections[k].Candidate || rj.Constraint != ie.Rejections[k].Constraint {
						t.Fatalf("seed %d step %d: rejection %d: %+v without names, %+v with", seed, i, k, ie.Rejections[k], rj)
					}
					texts = append(texts, rj.Text()+": "+rj.Reason)
				}
				texts = append(texts, nerr.Error())
			}
			for _, line := range texts {
				if m := rawID.FindString(line); m != "" {
					t.Fatalf("seed %d step %d: %q names %q without its name", seed, i, line, m)
				}
			}
			if err == nil {
				s.Leases = append(s.Leases, p.Lease(fmt.Sprintf("L%d", i), r, s.Now))
			}
		}
	}
}

// TestNamesInExplanation: a named device reads "node/name (ID)" in a
// choice, a runner-up and a rejection, and a named node "node name (ID)";
// a name equal to the ID is not repeated (the ID alone, as with no name).
func TestNamesInExplanation(t *testing.T) {
	s := &Snapshot{
		Links: []fabric.Link{{ID: "a", A: "node-a", B: "sw"}, {ID: "b", A: "node-b", B: "sw"}, {ID: "c", A: "node-c", B: "sw"}},
		Nodes: []Node{{ID: "node-a", Name: "n1"}, {ID: "node-b", Name: "n2", Cordoned: true}, {ID: "node-c", Name: "node-c"}},
		Devices: []Device{
			{ID: "dev-1", Name: "disk0", Node: "node-a", Kind: KindBlock, Capacity: 1 << 30},
			{ID: "dev-2", Name: "disk0", Node: "node-b", Kind: KindBlock, Capacity: 1 << 30},
			{ID: "dev-3", Name: "dev-3", Node: "node-c", Kind: KindBlock, Capacity: 1 << 20},
		},
	}
	p, err := Place(s, Request{Kind: KindBlock, Size: 256 << 20, Borrower: "node-c", AllowShare: true})
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(p.Explanation, "\n")
	for _, want := range []string{"for node-c,", "chose shared n1/disk0 (dev-1): ", "runner-up dedicated n1/disk0 (dev-1): "} {
		if !strings.Contains(text, want) {
			t.Errorf("explanation lacks %q:\n%s", want, text)
		}
	}
	_, err = Place(s, Request{Kind: KindBlock, Size: 2 << 30, Borrower: "node-a", AllowShare: true})
	want := "placement: infeasible: capacity: no block device for node n1 (node-a) among 3 examined; " +
		"n1/disk0 (dev-1): 1GiB free, needs 2GiB; n2/disk0 (dev-2): node n2 (node-b) is cordoned; dev-3: 1MiB free, needs 2GiB"
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
}
