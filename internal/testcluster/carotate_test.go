package testcluster

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestRunningAgentFollowsCARotation: after `rialto ca rotate`, a running
// agent whose --cacert file holds the old CA alone takes the rotated CA
// certificates from a heartbeat's answer (verified with the old CA), so
// that it still trusts the control plane once that restarts with an API
// certificate of the new CA: the node stays ready and its lease served,
// without the agent being restarted. Restarted with the same old file
// later, it verifies with the certificates it kept. Before, the agent
// read --cacert only at start and refused the restarted control plane
// ("certificate signed by unknown authority"), and its node went down.
func TestRunningAgentFollowsCARotation(t *testing.T) {
	t.Parallel()
	// The agent's own copy of ca-cert.pem, as on a lender's host: the
	// rotation below does not touch it.
	caCopy := filepath.Join(t.TempDir(), "carotate-ca-cert.pem")
	c := Start(t, Options{TLS: true, Nodes: 1, Configure: func(_ int, cfg *agent.Config) {
		b, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(caCopy, b, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg.CAFile = caCopy
	}})
	ctx := ctxT(t)
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	n := c.Nodes[0]
	oldCA := c.CA.Certificate()
	// `rialto ca rotate`, another process: the running control plane
	// follows it at its next sweep (the list the new key signed).
	newCA := c.RotateCA()
	c.Heartbeat() // the answer brings the rotated certificates

	kept := filepath.Join(n.StateDir, "ca-cert.pem")
	certs, err := pki.ReadCerts(kept)
	if err != nil {
		t.Fatalf("the CA certificates the agent keeps: %v", err)
	}
	if !slices.ContainsFunc(certs, newCA.Equal) || !slices.ContainsFunc(certs, oldCA.Equal) {
		t.Fatalf("the agent keeps %d CA certificates, want the new CA's and the old one's", len(certs))
	}
	keptSt, err := os.Stat(kept)
	if err != nil || keptSt.Mode().Perm() != 0o644 {
		t.Fatalf("%s: %v, mode %v, want 0644", kept, err, keptSt.Mode().Perm())
	}
	// What the agent keeps is the rotated directory's ca-cert.pem, byte
	// for byte (`cmp STATE/ca-cert.pem DIR/ca-cert.pem`, docs/operations.md),
	// though the running control plane still signs with the old CA.
	keptPEM, err := os.ReadFile(kept)
	if err != nil {
		t.Fatal(err)
	}
	if dirPEM, err := os.ReadFile(c.CA.CertFile()); err != nil || !bytes.Equal(keptPEM, dirPEM) {
		t.Fatalf("the agent keeps other bytes than the directory's %s (%v)", c.CA.CertFile(), err)
	}

	// The control plane restarts on the rotated directory: its API
	// certificate now comes from the new CA.
	c.RestartControlPlane()
	if got := c.IssuerOf(t, c.URL); !got.Equal(newCA) {
		t.Fatalf("the restarted control plane's API certificate is issued by %q, want the new CA", got.Subject.CommonName)
	}
	c.Heartbeat() // fails the test if the agent refuses it
	// The restarted control plane's bundle is the one the agent has: its
	// answer brings none, and the agent keeps its file as it was.
	if st, err := os.Stat(kept); err != nil || !st.ModTime().Equal(keptSt.ModTime()) {
		t.Fatalf("the agent took the restarted control plane's CA certificates again (%s rewritten: %v)", kept, err)
	}
	if st := c.NodeState(n.ID()); st != api.NodeReady {
		t.Fatalf("the node after the control plane's restart: %s, want ready", st)
	}
	if got := c.Lease(l.ID); got.State != api.LeaseActive || !n.Serves(l.ID) {
		t.Fatalf("the lease after the control plane's restart: %s (served: %v), want active and served", got.State, n.Serves(l.ID))
	}

	// The control plane calls the agent with a client certificate of the
	// new CA now (a lease's prepare): the agent's API takes it.
	l2, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatalf("a lease after the control plane's restart: %v", err)
	}
	if got := c.Lease(l2.ID); got.State != api.LeaseActive || !n.Serves(l2.ID) {
		t.Fatalf("a lease made after the control plane's restart: %s (served: %v), want active and served", got.State, n.Serves(l2.ID))
	}

	// Restarted, still given the old file, the agent verifies with the
	// certificates it kept, and joins.
	n.Restart()
	c.Heartbeat()
	if got := c.Lease(l.ID); got.State != api.LeaseActive || !n.Serves(l.ID) {
		t.Fatalf("the lease after the agent's restart: %s (served: %v), want active and served", got.State, n.Serves(l.ID))
	}
}

// TestRunningAgentMovesToARenewedLender: after `rialto ca rotate` and the
// control plane's restart, a lender restarted (its node certificate now
// from the new CA) takes a block lease's part and a memory lease moved
// from a lender that kept running since before the rotation: the running
// one dials the newcomer's transfer export (nbds://) and move endpoint
// (rialto-mems://) with the CA certificates it verifies with now, and the
// bytes arrive intact. Before, its drivers kept the client configuration
// built at its start (the old CA alone) and refused the destination's
// certificate ("certificate signed by unknown authority") until it was
// restarted too.
func TestRunningAgentMovesToARenewedLender(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 2, Devices: moveDevices()})
	ctx := ctxT(t)
	cl := c.Client()
	src, dst := c.Nodes[0], c.Nodes[1]
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, Affinity: []string{src.Name}})
	if err != nil {
		t.Fatal(err)
	}
	ml, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 4 << 20, Affinity: []string{src.Name}})
	if err != nil {
		t.Fatal(err)
	}
	if l.NodeID != src.ID() || ml.NodeID != src.ID() {
		t.Fatalf("leases on %s and %s, want %s", l.NodeID, ml.NodeID, src.ID())
	}
	want := bytes.Repeat([]byte("moved after the CA rotation "), 2048)
	nc, err := nbd.DialURI(ctx, l.URI, nbd.WithTLS(dataTLS(t, c)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.WriteAtContext(ctx, want, 8192, true); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	newCA := c.RotateCA()
	c.Heartbeat() // both agents take the rotated certificates
	c.RestartControlPlane()
	c.Heartbeat()

	// The destination restarts: its node certificate now comes from the
	// new CA. The source keeps running.
	dst.Restart()
	if iss := nodeCert(t, dst).Leaf; iss.CheckSignatureFrom(newCA) != nil {
		t.Fatalf("the restarted destination's certificate is issued by %q, want the new CA", iss.Issuer.CommonName)
	}
	c.Heartbeat()
	cl = c.Client()      // trusting the restarted control plane
	cfg := dataTLS(t, c) // the rotated file: either CA

	if _, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{}); err != nil {
		t.Fatal(err)
	}
	if ms := waitMoves(t, c, l.ID, 1); ms[0].State != api.MoveDone {
		t.Fatalf("the block move: %+v", ms[0])
	}
	got := c.Lease(l.ID)
	if got.NodeID != dst.ID() {
		t.Fatalf("the moved block lease is on %s, want %s", got.NodeID, dst.ID())
	}
	nc, err = nbd.DialURI(ctx, got.URI, nbd.WithTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p := make([]byte, len(want))
	if _, err := nc.ReadAt(p, 8192); err != nil || !bytes.Equal(p, want) {
		t.Fatalf("the moved block lease: %v (bytes intact: %v)", err, bytes.Equal(p, want))
	}

	w := attachWriter(ctx, t, cl, ml, 4<<20, cfg)
	if _, err := cl.MoveLease(ctx, ml.ID, api.MoveRequest{}); err != nil {
		t.Fatal(err)
	}
	ms := waitMoves(t, c, ml.ID, 1)
	w.finish(t)
	if ms[0].State != api.MoveDone {
		t.Fatalf("the memory move: %+v", ms[0])
	}
	if mg := c.Lease(ml.ID); mg.NodeID != dst.ID() {
		t.Fatalf("the moved memory lease is on %s, want %s", mg.NodeID, dst.ID())
	}
}
