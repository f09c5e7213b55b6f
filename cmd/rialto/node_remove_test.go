package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestNodeRemoveByNameSkipsRemoved: names are not unique. Once a node is
// removed, other machines join under its name; `rialto node remove NAME`
// removes the one of that name that is not removed, never the removed
// one (whichever sorts first), and a name two live nodes have is
// ambiguous: nothing is removed and the IDs are listed.
func TestNodeRemoveByNameSkipsRemoved(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx := context.Background()
	rt := t.TempDir()
	old := c.Nodes[0].ID()
	c.Nodes[0].Kill()
	if _, err := c.Client().RemoveNode(ctx, old, true); err != nil {
		t.Fatal(err)
	}
	join := func(mid string) string { return c.JoinAgentless("node1", mid, 1<<20) }

	// Several times: a new node's ID sorts either side of the removed one's.
	for i := range 4 {
		id := join(fmt.Sprintf("another-machine-%d", i))
		out, errs, code := runIn(t, c, rt, "node", "remove", "node1", "--force")
		if code != 0 || !strings.Contains(out, "node node1 ("+id+") removed") {
			t.Fatalf("node remove node1 with %s live and %s removed: exit %d: %s%s", id, old, code, out, errs)
		}
	}
	a, b := join("machine-a"), join("machine-b")
	_, errs, code := runIn(t, c, rt, "node", "remove", "node1", "--force")
	if code == 0 || !strings.Contains(errs, "ambiguous") || !strings.Contains(errs, a) || !strings.Contains(errs, b) {
		t.Fatalf("node remove of a name two live nodes have: exit %d: %s", code, errs)
	}
	for _, id := range []string{a, b} {
		if n, _ := c.Client().Node(ctx, id); n.State != api.NodeReady {
			t.Fatalf("node %s is %s after the refused removal", id, n.State)
		}
	}
}

// TestNodeRemoveLiveNamesForce: removing a node whose agent heartbeats is
// refused (the node stays ready), and the refusal names the flag that
// forces it: the control plane's message says "force the removal", which
// a CLI user must translate.
func TestNodeRemoveLiveNamesForce(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	id := c.Nodes[0].ID()
	_, errs, code := runIn(t, c, t.TempDir(), "node", "remove", id)
	if code != 1 || !strings.Contains(errs, "rialto node remove --force "+id) {
		t.Fatalf("node remove of a ready node: exit %d: %s", code, errs)
	}
	if n, err := c.Client().Node(context.Background(), id); err != nil || n.State != api.NodeReady {
		t.Fatalf("node %s after the refused removal: %v %v", id, n.State, err)
	}
}
