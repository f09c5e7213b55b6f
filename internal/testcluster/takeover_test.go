package testcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/pki"
)

// makeDown moves the clock past the grace period, has every joined agent
// but node id's heartbeat, and sweeps: node id, silent, goes down (its
// leases lost), the others stay ready.
func makeDown(t *testing.T, c *Cluster, id string) {
	t.Helper()
	// A heartbeat the killed agent sent as it was cancelled may still be
	// handled by the control plane after the clock moved (the server
	// finishes a request it has read): it is on time then, and the node
	// stays ready for one more grace period. So once more, at most.
	for try := 0; ; try++ {
		// An agent whose join is refused while the node is live
		// (launchRefused's) tries again, and takes the node over as soon
		// as it is down: maybe before its state is read below, and then
		// it heartbeats. The sweep's node.down event says it went down.
		before := downEvents(t, c, id)
		c.Advance(c.opts.DownAfter + 1e9)
		for _, o := range c.Nodes {
			if a := o.Agent(); a != nil && a.NodeID() != "" && a.NodeID() != id {
				if err := a.Heartbeat(ctxT(t)); err != nil {
					t.Fatalf("heartbeat of %s: %v", o.Name, err)
				}
			}
		}
		c.Sweep()
		s := c.NodeState(id)
		if s == api.NodeDown || downEvents(t, c, id) > before {
			return
		}
		if try == 1 {
			t.Fatalf("node %s is %s after the grace period, want down", id, s)
		}
	}
}

// downEvents counts the node.down events of node id.
func downEvents(t *testing.T, c *Cluster, id string) int {
	t.Helper()
	n := 0
	for _, e := range allEvents(ctxT(t), t, c.Client()) {
		if e.Type == "node.down" && e.Subject == id {
			n++
		}
	}
	return n
}

// launchRefused launches n's agent, which cannot prove it is node id's
// (its state directory lost, or its credential replaced), and waits until
// its join was refused while the node is live: it is trying again (a
// second join), has not joined, and the node is still ready. Then the
// node goes down (makeDown) and the agent joins at once (WaitReady).
func launchRefused(t *testing.T, c *Cluster, n *Node, id string) {
	t.Helper()
	var joins atomic.Int32
	hook := func(context.Context) { joins.Add(1) }
	n.LaunchWith(func(a *agent.Agent) { a.Faults.BeforeJoin.Store(&hook) })
	c.Eventually("the agent's second join (its first refused)", func() bool { return joins.Load() >= 2 })
	select {
	case <-n.Agent().Ready():
		t.Fatalf("the agent without the node's credential joined while node %s was ready", id)
	default:
	}
	if s := c.NodeState(id); s != api.NodeReady {
		t.Fatalf("node %s is %s while the agent waits", id, s)
	}
	makeDown(t, c, id)
	n.WaitReady()
	if got := n.ID(); got != id {
		t.Fatalf("the agent joined as %s, not %s (the same machine)", got, id)
	}
}

// impostorJoin is a join over TLS, with the bootstrap token, of another
// machine (its own key, address and CSR) claiming machine ID mid.
func impostorJoin(t *testing.T, c *Cluster, mid string) (api.JoinResponse, error) {
	t.Helper()
	u, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(u.Host)
	csr, _, err := pki.NewCSR("", []string{host})
	if err != nil {
		t.Fatal(err)
	}
	req := api.JoinRequest{Name: "impostor", Address: host, AgentURL: "https://" + net.JoinHostPort(host, "1"), CSR: string(csr),
		Fingerprint: api.Fingerprint{MachineID: mid, Hostname: "impostor"},
		Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 64 << 20}}}
	return api.NewClient(c.URL, BootstrapToken, c.HTTPClient()).Join(ctxT(t), req)
}

// tlsWrite writes data at 0 through a TLS cluster's lease URI, and
// tlsRead reads it back.
func tlsWrite(ctx context.Context, t *testing.T, c *Cluster, uri string, data []byte) {
	t.Helper()
	nc, err := nbd.DialURI(ctx, uri, nbd.WithTLS(dataTLS(t, c)))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer nc.Close()
	if _, err := nc.WriteAtContext(ctx, data, 0, true); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func tlsRead(ctx context.Context, t *testing.T, c *Cluster, uri string, n int) ([]byte, error) {
	nc, err := nbd.DialURI(ctx, uri, nbd.WithTLS(dataTLS(t, c)))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	buf := make([]byte, n)
	_, err = nc.ReadAtContext(ctx, buf, 0)
	return buf, err
}

// TestTLSImpostorJoinRefused: whoever holds the bootstrap token and a
// lender's machine ID (GET /v1/nodes shows it to admins only) joins with
// it while the lender is live. It is refused (409): the lender's agent
// goes on heartbeating with its credential, its lease stays active and
// served, and no certificate for the node was issued. Once the lender is
// down, the same join takes the node over: the same node ID, its lease
// recorded lost (the newcomer serves no tenant's bytes), the
// certificates issued to the node before revoked. The lender's agent,
// restarted with its state, then holds a credential and certificate the
// node no longer has: its joins are refused while the newcomer's node is
// ready, and it takes the node back once that is down.
func TestTLSImpostorJoinRefused(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 2, Tenants: []string{"alice"}})
	ctx := ctxT(t)
	alice := c.ClientWithToken(TenantToken("alice"))
	l := createBlock(t, alice, 4<<20, api.ModeShared)
	lender := c.NodeByID(l.NodeID)
	id := lender.ID()
	pat := bytes.Repeat([]byte("alice's bytes "), 64)
	tlsWrite(ctx, t, c, l.URI, pat)

	// A tenant does not see the machine ID; an admin does.
	seen, err := alice.Node(ctx, id)
	if err != nil || seen.Fingerprint.MachineID != "" {
		t.Fatalf("alice's view of the lender: %v %+v", err, seen.Fingerprint)
	}
	admin, err := c.Client().Node(ctx, id)
	if err != nil || admin.Fingerprint.MachineID == "" {
		t.Fatalf("the admin's view of the lender: %v %+v", err, admin.Fingerprint)
	}
	mid := admin.Fingerprint.MachineID
	cert := nodeCert(t, lender)
	cred := readIdentity(t, lender).Credential

	_, err = impostorJoin(t, c, mid)
	if !api.IsCode(err, api.CodeConflict) || !strings.Contains(err.Error(), "which is ready") || !strings.Contains(err.Error(), "rialto node remove") {
		t.Fatalf("a join with a live lender's machine ID: %v", err)
	}
	for range 3 {
		if err := lender.Agent().Heartbeat(ctx); err != nil {
			t.Fatalf("the lender's heartbeat after the refused join: %v", err)
		}
	}
	if got := readIdentity(t, lender).Credential; got != cred || lender.ID() != id {
		t.Fatal("the lender joined again after the refused join")
	}
	if n, _ := c.Client().Node(ctx, id); n.Name != lender.Name || n.State != api.NodeReady {
		t.Fatalf("the lender after the refused join: %+v", n)
	}
	if got := c.Lease(l.ID); got.State != api.LeaseActive || !lender.Serves(l.ID) {
		t.Fatalf("the lease after the refused join: %s, served %v", got.State, lender.Serves(l.ID))
	}
	if b, err := tlsRead(ctx, t, c, l.URI, len(pat)); err != nil || !bytes.Equal(b, pat) {
		t.Fatalf("alice's bytes after the refused join: %v", err)
	}
	if c.CA.Revoked(cert.Leaf.SerialNumber) {
		t.Fatal("the refused join revoked the lender's certificate")
	}

	// Down: the same join takes the node over.
	lender.Kill()
	makeDown(t, c, id)
	jr, err := impostorJoin(t, c, mid)
	if err != nil {
		t.Fatalf("a join with a down lender's machine ID: %v", err)
	}
	if jr.NodeID != id || jr.Certificate == "" {
		t.Fatalf("the takeover's answer: node %s, certificate %v", jr.NodeID, jr.Certificate != "")
	}
	if got := c.Lease(l.ID); got.State != api.LeaseLost {
		t.Fatalf("the lease after the takeover: %s", got.State)
	}
	if !c.CA.Revoked(cert.Leaf.SerialNumber) {
		t.Fatal("the lender's certificate still valid after another join took its node over")
	}

	// The lender's agent, restarted with its (now replaced) credential
	// and its revoked certificate, waits for the newcomer's node to be
	// down, then takes it back.
	launchRefused(t, c, lender, id)
	if got := readIdentity(t, lender).Credential; got == cred {
		t.Fatal("the lender kept its replaced credential")
	}
}

// TestTLSRestartWithStateRejoinsAtOnce: an agent restarted with its state
// directory proves it is its node's: with the credential in its
// identity.json, and, without that, with its node certificate (mutual
// TLS). Either way it rejoins at once, while the node is still ready, as
// the same node with its lease kept and served.
func TestTLSRestartWithStateRejoinsAtOnce(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1})
	ctx := ctxT(t)
	l := createBlock(t, c.Client(), 4<<20, api.ModeShared)
	n := c.Nodes[0]
	id := n.ID()
	pat := bytes.Repeat([]byte("kept "), 512)
	tlsWrite(ctx, t, c, l.URI, pat)
	check := func(what string) {
		t.Helper()
		if got := n.ID(); got != id {
			t.Fatalf("%s: rejoined as %s, not %s", what, got, id)
		}
		if got := c.Lease(l.ID); got.State != api.LeaseActive {
			t.Fatalf("%s: lease %s (%q)", what, got.State, got.Reason)
		}
		c.Eventually(what+": the lease served again", func() bool { return n.Serves(l.ID) })
		if b, err := tlsRead(ctx, t, c, c.Lease(l.ID).URI, len(pat)); err != nil || !bytes.Equal(b, pat) {
			t.Fatalf("%s: the lease's bytes: %v", what, err)
		}
	}
	n.Restart()
	check("a restart")

	// Without the credential (its certificate, still valid, proves it).
	n.Kill()
	editIdentity(t, n.StateDir, func(idf map[string]any) { delete(idf, "credential") })
	n.Restart()
	check("a restart without the credential, with the certificate")
	if s := c.NodeState(id); s != api.NodeReady {
		t.Fatalf("node %s", s)
	}
}

// editIdentity rewrites the identity.json of the agent state directory
// dir (its agent stopped) with edit applied to its fields.
func editIdentity(t *testing.T, dir string, edit func(idf map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, "identity.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var idf map[string]any
	if err := json.Unmarshal(b, &idf); err != nil {
		t.Fatal(err)
	}
	edit(idf)
	if b, err = json.Marshal(idf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
