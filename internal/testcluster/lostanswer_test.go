package testcluster

import (
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
)

// joinedEvents counts the node.joined events of node id.
func joinedEvents(t *testing.T, c *Cluster, id string) int {
	t.Helper()
	evs, err := c.Client().Events(ctxT(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Type == "node.joined" && e.Subject == id {
			n++
		}
	}
	return n
}

// TestRestartAfterLostJoinAnswerRejoinsAtOnce: an agent whose rejoin was
// answered (the control plane replaced the node's credential) but which
// never wrote the answer to identity.json (it crashed in between, or the
// answer was lost on the way and the agent gave the call up) holds the
// credential the join presented, no longer the node's current one.
// Without a cluster CA no certificate proves it either. That credential
// still proves it is the node's agent: restarted, it rejoins at once as
// the same node, its lease kept and served, instead of being refused
// until the node is down and then losing its leases.
func TestRestartAfterLostJoinAnswerRejoinsAtOnce(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1})
	l := createBlock(t, c.Client(), 4<<20, api.ModeShared)
	n := c.Nodes[0]
	id := n.ID()
	before := readIdentity(t, n).Credential
	joins := joinedEvents(t, c, id)

	// Restarted, its join answered and the answer held: then it crashes.
	n.Kill()
	hold := make(chan struct{})
	n.LaunchWith(func(a *agent.Agent) { a.Faults.HoldJoinAnswer.Store(&hold) })
	c.Eventually("the restarted agent's join answered", func() bool { return joinedEvents(t, c, id) > joins })
	n.Kill()
	close(hold)
	if got := readIdentity(t, n).Credential; got != before {
		t.Fatal("the agent wrote the held answer")
	}

	n.Launch()
	n.WaitReady()
	if got := n.ID(); got != id {
		t.Fatalf("rejoined as %s, not %s", got, id)
	}
	if got := c.Lease(l.ID); got.State != api.LeaseActive {
		t.Fatalf("the lease after the rejoin: %s (%q)", got.State, got.Reason)
	}
	c.Eventually("the lease served again", func() bool { return n.Serves(l.ID) })
	if s := c.NodeState(id); s != api.NodeReady {
		t.Fatalf("node %s", s)
	}
	if got := readIdentity(t, n).Credential; got == before || got == "" {
		t.Fatal("the agent did not keep its new credential")
	}
}
