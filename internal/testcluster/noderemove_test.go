package testcluster

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestTLSNodeRemoval: removing a node (DELETE /v1/nodes/{id}) loses its
// leases, revokes every certificate the CA issued to it and forgets its
// credential; the other agents get the new revocation list with their next
// heartbeat and refuse the removed node's certificate at their API; a node
// that still heartbeats is refused unless forced, and its machine may join
// again as the same node, with a new certificate.
func TestTLSNodeRemoval(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 2})
	ctx := ctxT(t)
	l := createBlock(t, c.Client(), 4<<20, api.ModeShared)
	gone := c.NodeByID(l.NodeID)
	var other *Node
	for _, n := range c.Nodes {
		if n != gone {
			other = n
		}
	}
	cert := nodeCert(t, gone)
	cred := readIdentity(t, gone).Credential

	if _, err := c.Client().RemoveNode(ctx, gone.ID(), false); !api.IsCode(err, api.CodeConflict) || !strings.Contains(err.Error(), "stop the agent, and remove the node once it is down") {
		t.Fatalf("removing a ready node without force: %v", err)
	}
	if _, err := c.ClientWithToken("rat_not-a-token").RemoveNode(ctx, gone.ID(), true); !api.IsCode(err, api.CodeUnauthorized) {
		t.Fatalf("removing without a token: %v", err)
	}
	gone.Kill()
	c.Eventually("the stopped node down", func() bool {
		c.Advance(11 * time.Second)
		c.Sweep()
		return c.NodeState(gone.ID()) == api.NodeDown
	})
	r, err := c.Client().RemoveNode(ctx, gone.ID(), false)
	if err != nil {
		t.Fatal(err)
	}
	// (Its lease was lost already, when the sweep found it down.)
	if r.Node.State != api.NodeRemoved || r.Revoked < 1 || len(r.Lost) != 0 {
		t.Fatalf("removal %+v", r)
	}
	if !c.CA.Revoked(cert.Leaf.SerialNumber) {
		t.Fatal("the removed node's certificate is not revoked")
	}
	if got := c.Lease(l.ID); got.State != api.LeaseLost {
		t.Fatalf("its lease is %s", got.State)
	}
	// Its credential and certificate open nothing: a node call presenting
	// the certificate is answered 401 (its agent would join again), the
	// credential alone too.
	for _, hc := range []*http.Client{tlsClient(c, &cert), tlsClient(c, nil)} {
		if _, err := api.NewClient(c.URL, cred, hc).Heartbeat(ctx, gone.ID(), api.Heartbeat{Health: "ok"}); !api.IsCode(err, api.CodeUnauthorized) {
			t.Fatalf("heartbeat of the removed node: %v", err)
		}
	}
	c.Advance(11 * time.Second)
	c.Sweep()
	if s := c.NodeState(gone.ID()); s != api.NodeRemoved {
		t.Fatalf("a sweep moved the removed node to %s", s)
	}
	// The other agent learns the list and refuses the revoked certificate
	// at its API, while serving others.
	c.Eventually("the revocation list on the other agent", func() bool {
		b, err := os.ReadFile(filepath.Join(other.StateDir, pki.CRLFile))
		if err != nil {
			return false
		}
		roots, _ := pki.ReadCerts(c.CA.CertFile())
		crl := pki.NewCRL(roots)
		_, err = crl.Update(b)
		return err == nil && crl.Check(cert.Leaf) != nil
	})
	nodes, err := c.Client().Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	url := ""
	for _, n := range nodes {
		if n.ID == other.ID() {
			url = n.AgentURL
		}
	}
	ping := func(hc *http.Client) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/agent/v1/ping", nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := ping(tlsClient(c, nil)); err != nil {
		t.Fatalf("ping without a certificate: %v", err)
	}
	if err := ping(tlsClient(c, &cert)); err == nil {
		t.Fatal("the other agent took the removed node's revoked certificate")
	}

	// The machine joins again: the same node, with a new certificate
	// (the agent starts with the revoked one in its state dir).
	gone.Launch()
	gone.WaitReady()
	if s := c.NodeState(gone.ID()); s != api.NodeReady {
		t.Fatalf("rejoined node is %s", s)
	}
	if fresh := nodeCert(t, gone); fresh.Leaf.SerialNumber.Cmp(cert.Leaf.SerialNumber) == 0 || c.CA.Revoked(fresh.Leaf.SerialNumber) {
		t.Fatal("the rejoined node has no fresh certificate")
	}

	// Forced removal of a node that heartbeats: its lease is lost, its
	// agent joins again. (The clock moved 11 s above: the other node may
	// have been swept down until its next heartbeat.)
	c.Eventually("the other node ready", func() bool { return c.NodeState(other.ID()) == api.NodeReady })
	l2, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, Mode: api.ModeShared, Affinity: []string{other.Name}})
	if err != nil || l2.NodeID != other.ID() {
		t.Fatalf("lease on %s: %+v %v", other.Name, l2, err)
	}
	r, err = c.Client().RemoveNode(context.Background(), other.ID(), true)
	if err != nil || r.Node.State != api.NodeRemoved || len(r.Lost) != 1 || r.Lost[0] != l2.ID {
		t.Fatalf("forced removal: %+v %v", r, err)
	}
	c.Eventually("the forcibly removed node back", func() bool { return c.NodeState(other.ID()) == api.NodeReady })
}

// TestTLSRemovedNodeRejoinsInOneHeartbeat: an agent that still runs when
// its node is removed (--force: its credential forgotten, its certificate
// revoked) joins again as the same node, with a new certificate, in its
// next heartbeat round, also when that heartbeat opens a new connection
// to the control plane (here the control plane restarted in between; a
// heartbeat refused for the revoked certificate closes its connection
// too) presenting the revoked certificate: the heartbeat is answered
// 401, not refused in the TLS handshake, and the join presents no
// certificate. The agents' own heartbeats are an hour apart: the test
// runs the round.
func TestTLSRemovedNodeRejoinsInOneHeartbeat(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1, HeartbeatInterval: time.Hour})
	n := c.Nodes[0]
	id, old := n.ID(), nodeCert(t, n)
	ctx := ctxT(t)
	if _, err := c.Client().RemoveNode(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if !c.CA.Revoked(old.Leaf.SerialNumber) {
		t.Fatal("the removed node's certificate is not revoked")
	}
	c.RestartControlPlane()
	hctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := n.Agent().Heartbeat(hctx); err != nil {
		t.Fatalf("the removed node's next heartbeat round: %v", err)
	}
	if s := c.NodeState(id); s != api.NodeReady {
		t.Fatalf("after one heartbeat round the removed node is %s", s)
	}
	if n.ID() != id {
		t.Fatalf("the node joined again as %s, not %s", n.ID(), id)
	}
	if fresh := nodeCert(t, n); fresh.Leaf.SerialNumber.Cmp(old.Leaf.SerialNumber) == 0 || c.CA.Revoked(fresh.Leaf.SerialNumber) {
		t.Fatal("the node joined again without a fresh certificate")
	}
	// And heartbeats on with it.
	if err := n.Agent().Heartbeat(hctx); err != nil {
		t.Fatalf("the next heartbeat: %v", err)
	}
}
