package controlplane

import (
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestJoinTakesOverLiveNodeOnlyWithCredential: a join (the bootstrap
// token) with a live node's machine ID but without the node's credential
// — another machine claiming it, or its agent after losing its state — is
// refused with 409 and changes nothing: the node's agent goes on
// heartbeating with its credential, and its lease stays active. A wrong
// credential is refused the same way. The node's own agent, restarted
// with its credential, rejoins at once as the same node, its lease kept.
// Once the node is not live (down), a join without the credential takes
// it over, and every lease with a part there is recorded lost (answered
// in lost_leases), whatever the join says of its exports.
func TestJoinTakesOverLiveNodeOnlyWithCredential(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j, node := e.join("n1", 1<<30)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil || l.State != api.LeaseActive || l.NodeID != j.NodeID {
		t.Fatalf("lease: %v %+v", err, l)
	}
	beat := func(c *api.Client) error {
		_, err := c.Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok", Leases: []string{l.ID}})
		return err
	}

	impostor := joinRequest("n1", "", 1<<30)
	impostor.Name, impostor.Address = "evil", "127.0.0.9"
	for _, cred := range []string{"", "rnc_not-the-credential"} {
		impostor.Credential = cred
		_, err := e.boot.Join(e.ctx(), impostor)
		if !api.IsCode(err, api.CodeConflict) {
			t.Fatalf("a join with the live node's machine ID and credential %q: %v", cred, err)
		}
		for _, want := range []string{"machine mid-n1 is node " + j.NodeID + " (n1), which is ready",
			"without " + j.NodeID + "'s credential", "once " + j.NodeID + " is down (10s without a heartbeat)",
			"`rialto node remove --force " + j.NodeID + "`"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("refusal %q does not say %q", err, want)
			}
		}
		if err := beat(node); err != nil {
			t.Fatalf("the node's agent after a refused join: %v", err)
		}
	}
	if n, err := e.admin.Node(e.ctx(), j.NodeID); err != nil || n.Name != "n1" || n.Address != "127.0.0.1" || n.State != api.NodeReady {
		t.Fatalf("the node after refused joins: %v %+v", err, n)
	}
	// Suspect is live too.
	e.clock.Advance(4 * time.Second)
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	impostor.Credential = ""
	if _, err := e.boot.Join(e.ctx(), impostor); !api.IsCode(err, api.CodeConflict) || !strings.Contains(err.Error(), "which is suspect") {
		t.Fatalf("a join without the credential of a suspect node: %v", err)
	}
	if err := beat(node); err != nil {
		t.Fatal(err)
	}

	// Its agent restarted with its state: the same node at once, a new
	// credential, the lease kept.
	j2, node2 := e.rejoin("n1", j.Credential, 1<<30)
	if j2.NodeID != j.NodeID || len(j2.LostLeases) != 0 {
		t.Fatalf("rejoin with the credential: %+v", j2)
	}
	if err := beat(node); !api.IsCode(err, api.CodeUnauthorized) {
		t.Fatalf("the old credential after a rejoin: %v", err)
	}
	if err := beat(node2); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.admin.Lease(e.ctx(), l.ID); got.State != api.LeaseActive {
		t.Fatalf("lease after a rejoin with the credential: %s (%s)", got.State, got.Reason)
	}

	// Not live: down (as the sweep leaves it, here with its lease still
	// active, as a lease reserved in a race with the sweep would be).
	if err := e.srv.st.SetNodeState(e.ctx(), j.NodeID, api.NodeReady, api.NodeDown, api.Event{At: e.clock.Now(), Type: "node.down", Subject: j.NodeID}); err != nil {
		t.Fatal(err)
	}
	e.srv.live.forget(j.NodeID)
	j3, err := e.boot.Join(e.ctx(), impostor)
	if err != nil {
		t.Fatalf("a join without the credential of a down node: %v", err)
	}
	if j3.NodeID != j.NodeID || len(j3.LostLeases) != 1 || j3.LostLeases[0] != l.ID {
		t.Fatalf("takeover of the down node: %+v", j3)
	}
	if got, _ := e.admin.Lease(e.ctx(), l.ID); got.State != api.LeaseLost || !strings.Contains(got.Reason, "taken over") {
		t.Fatalf("lease after the takeover: %s (%q), want lost", got.State, got.Reason)
	}
	if err := beat(node2); !api.IsCode(err, api.CodeUnauthorized) {
		t.Fatalf("the node's credential after the takeover: %v", err)
	}
	// And the node's agent, with the credential it held, is now the one
	// refused while the newcomer's node is live.
	if _, err := e.boot.Join(e.ctx(), joinRequest("n1", j2.Credential, 1<<30)); !api.IsCode(err, api.CodeConflict) {
		t.Fatalf("a join with the credential the takeover replaced: %v", err)
	}
}

// TestNodesShowMachineIDToAdminsOnly: GET /v1/nodes, /v1/nodes/{id} and
// /v1/topology show a node's machine ID (what a join claims a node by)
// and its host's block devices and NICs to an admin token only; tenants
// and agents (a node credential; the peers of its join answer) get the
// node without them.
func TestNodesShowMachineIDToAdminsOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	req := joinRequest("n1", "", 1<<30)
	req.Fingerprint.BlockDevices, req.Fingerprint.NICs = []string{"sda"}, []string{"eth0"}
	j1, err := e.boot.Join(e.ctx(), req)
	if err != nil {
		t.Fatal(err)
	}
	j2, node := e.join("n2", 1<<30)
	for _, p := range j2.ControlPlaneNodes {
		if p.Fingerprint.MachineID != "" {
			t.Fatalf("a join answer's peer has a machine ID: %+v", p)
		}
	}
	full := func(f api.Fingerprint) bool {
		return f.MachineID == "mid-n1" && len(f.BlockDevices) == 1 && len(f.NICs) == 1
	}
	hidden := func(f api.Fingerprint) bool {
		return f.MachineID == "" && f.BlockDevices == nil && f.NICs == nil && f.Hostname == "n1" && f.Cores == 2
	}
	for _, tc := range []struct {
		name string
		c    *api.Client
		want func(api.Fingerprint) bool
	}{{"admin", e.admin, full}, {"tenant", e.alice, hidden}, {"node", node, hidden}} {
		ns, err := tc.c.Nodes(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		n, err := tc.c.Node(e.ctx(), j1.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		topo, err := tc.c.Topology(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		fps := []api.Fingerprint{n.Fingerprint}
		for _, list := range [][]api.Node{ns, topo.Nodes} {
			for _, x := range list {
				if x.ID == j1.NodeID {
					fps = append(fps, x.Fingerprint)
				}
			}
		}
		if len(fps) != 3 {
			t.Fatalf("%s: node n1 not listed", tc.name)
		}
		for _, f := range fps {
			if !tc.want(f) {
				t.Fatalf("%s sees fingerprint %+v", tc.name, f)
			}
		}
	}
	// The raw answer has no machine_id key for a tenant.
	if code, body := e.raw(aliceTok, "GET", "/v1/nodes", ""); code != 200 || strings.Contains(body, "machine_id") || strings.Contains(body, "mid-n1") {
		t.Fatalf("tenant's GET /v1/nodes: %d %s", code, body)
	}
}
