package controlplane

import (
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
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
