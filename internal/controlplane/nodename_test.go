package controlplane

import (
	"errors"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// TestNodeNameAfterRemoval: names are not unique. Another machine joins
// under a removed node's name: a reference by that name (cordon, drain,
// a move's destination) means the live node, not the removed one; two
// nodes not removed under one name make the name ambiguous (409, the IDs
// listed), and IDs still work.
func TestNodeNameAfterRemoval(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	old, _ := e.join("n1", 1<<30)
	if _, err := e.admin.RemoveNode(e.ctx(), old.NodeID, true); err != nil {
		t.Fatal(err)
	}
	// The node ID sorts either side of the removed one's: try both.
	var fresh api.JoinResponse
	for i := range 2 {
		req := joinRequest("n1", "", 1<<30)
		req.Fingerprint.MachineID = "another-machine-" + string(rune('a'+i))
		var err error
		if fresh, err = e.boot.Join(e.ctx(), req); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			n, err := e.admin.CordonNode(e.ctx(), "n1")
			if err != nil || n.ID != fresh.NodeID || n.State != api.NodeReady {
				t.Fatalf("cordon n1 with a removed n1 and a live one: %v %+v (live %s, removed %s)", err, n, fresh.NodeID, old.NodeID)
			}
		}
	}
	_, err := e.admin.CordonNode(e.ctx(), "n1")
	if !api.IsCode(err, api.CodeConflict) || !strings.Contains(err.Error(), "ambiguous") || !strings.Contains(err.Error(), fresh.NodeID) {
		t.Fatalf("cordon of a name two live nodes have: %v", err)
	}
	if n, err := e.admin.CordonNode(e.ctx(), fresh.NodeID); err != nil || n.ID != fresh.NodeID {
		t.Fatalf("cordon by ID: %v %+v", err, n)
	}
}

// TestNodeTermsNames: an affinity term that is a node name means the node
// of that name that is not removed, whichever order the nodes come in; a
// name two live nodes have is ambiguous as affinity (ErrConflict) and
// means both as anti-affinity; IDs, labels and unknown terms pass through.
func TestNodeTermsNames(t *testing.T) {
	t.Parallel()
	removed := api.Node{ID: "node-a", Name: "n1", State: api.NodeRemoved}
	live := api.Node{ID: "node-b", Name: "n1", State: api.NodeReady}
	down := api.Node{ID: "node-c", Name: "n2", State: api.NodeDown}
	for _, nodes := range [][]api.Node{{removed, live, down}, {down, live, removed}} {
		inv := store.Inventory{Nodes: nodes}
		for _, anti := range []bool{false, true} {
			got, err := nodeTerms(inv, []string{"n1", "n2", "node-a", "rack=r1", "nothing"}, nil, anti)
			if err != nil || strings.Join(got, " ") != "node-b node-c node-a rack=r1 nothing" {
				t.Fatalf("anti %v, nodes %v: %v %v", anti, nodes, got, err)
			}
		}
	}
	other := api.Node{ID: "node-d", Name: "n1", State: api.NodeSuspect}
	inv := store.Inventory{Nodes: []api.Node{removed, live, other}}
	if _, err := nodeTerms(inv, []string{"n1"}, nil, false); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "node-b") || !strings.Contains(err.Error(), "node-d") {
		t.Fatalf("affinity to a name two live nodes have: %v", err)
	}
	if got, err := nodeTerms(inv, []string{"n1"}, nil, true); err != nil || strings.Join(got, " ") != "node-b node-d" {
		t.Fatalf("anti-affinity to a name two live nodes have: %v %v", got, err)
	}
}
