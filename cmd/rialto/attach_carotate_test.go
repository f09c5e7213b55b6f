package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestAttachFollowsCARotation: a running `rialto attach` of a block
// lease, given its own copy of the cluster's ca-cert.pem (--cacert),
// which the rotation leaves as it was, keeps serving the lease across the
// rotation docs/operations.md describes: `rialto ca rotate`, the control
// plane's restart (its API certificate now from the new CA), and the
// lender's certificate renewed from the new CA (its agent restarted: the
// attachment's connections to it drop, and it must redial the lender,
// asking the restarted control plane where the part is). Attach takes
// the rotated CA certificates from the control plane (GET
// /v1/ca-certificates) over the connection it verified with the old CA,
// lists them in its state file, and verifies the restarted control plane
// and the renewed lender with them: reads and writes through its local
// NBD export go on. Before, attach read --cacert once at its start, and
// its redials failed ("certificate signed by unknown authority").
func TestAttachFollowsCARotation(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{TLS: true, Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	nc, state := attachWithCACopy(ctx, t, c, l.ID)
	before := bytes.Repeat([]byte("written before the CA rotation "), 1024)
	if _, err := nc.WriteAtContext(ctx, before, 8192, true); err != nil {
		t.Fatal(err)
	}

	newCA := rotateUnderAttach(t, c, state)
	// The control plane restarts with an API certificate of the new CA,
	// then the lender with a node certificate of the new CA.
	restartUnderNewCA(ctx, t, c, newCA)

	// The attachment redials the lender, and goes on.
	readWriteAfter(ctx, t, nc, before, 8192)
}

// TestAttachMemoryFollowsCARotation: TestAttachFollowsCARotation's
// rotation under an attachment of a memory lease, which then moves to a
// lender whose certificate the new CA issued (restarted after the
// control plane): the attachment's session follows the lease there,
// asking the restarted control plane where it went and verifying the new
// donor with the rotated CA certificates, and reads and writes through
// the attachment go on. Before, the session's follows dialled with the
// CA certificates of attach's start, and failed ("certificate signed by
// unknown authority").
func TestAttachMemoryFollowsCARotation(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{TLS: true, Nodes: 2, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
		{Name: "mem0", Kind: api.KindMemory, Size: 16 << 20},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	src, dst := c.Nodes[0], c.Nodes[1]
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 4 << 20, Affinity: []string{src.Name}})
	if err != nil {
		t.Fatal(err)
	}
	if l.NodeID != src.ID() {
		t.Fatalf("the lease is on %s, want %s", l.NodeID, src.ID())
	}
	nc, state := attachWithCACopy(ctx, t, c, l.ID)
	before := bytes.Repeat([]byte("in memory before the CA rotation "), 1024)
	if _, err := nc.WriteAtContext(ctx, before, 8192, true); err != nil {
		t.Fatal(err)
	}

	newCA := rotateUnderAttach(t, c, state)
	c.RestartControlPlane()
	dst.Restart()
	c.Heartbeat()
	if iss := agentIssuer(ctx, t, c, dst.ID()); !iss.Equal(newCA) {
		t.Fatalf("the restarted destination's certificate is issued by %q, want the new CA", iss.Subject.CommonName)
	}
	cl := c.Client()
	if _, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{ToNode: dst.Name}); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 90*time.Second, "the move to end", func() bool {
		ms, err := cl.Moves(ctx, l.ID)
		return err == nil && len(ms) == 1 && ms[0].Done()
	})
	if ms, _ := cl.Moves(ctx, l.ID); ms[0].State != api.MoveDone {
		t.Fatalf("the move: %+v", ms[0])
	}

	// The attachment's session follows the lease to the renewed lender.
	readWriteAfter(ctx, t, nc, before, 8192)
	if got := c.Lease(l.ID); got.NodeID != dst.ID() {
		t.Fatalf("the lease is on %s, want %s", got.NodeID, dst.ID())
	}
}

// attachWithCACopy runs `rialto attach` of lease id in process, given a
// copy of the cluster's ca-cert.pem (as on a borrower's host, which a
// rotation leaves as it was), and returns an NBD client of its export and
// its state file, which lists the CA certificates of the copy.
func attachWithCACopy(ctx context.Context, t *testing.T, c *testcluster.Cluster, id string) (*nbd.Client, string) {
	nc, state, _ := attachWithCACopyLog(ctx, t, c, id)
	return nc, state
}

// attachWithCACopyLog is attachWithCACopy, and returns attach's log too.
func attachWithCACopyLog(ctx context.Context, t *testing.T, c *testcluster.Cluster, id string) (*nbd.Client, string, *logtest.Buffer) {
	t.Helper()
	caCopy := filepath.Join(t.TempDir(), "attachca-ca-cert.pem")
	if err := os.WriteFile(caCopy, c.CA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	uri, _, errb := attachedErr(t, c, runtime, id, "--cacert", caCopy, "--watch", "50ms", "--timeout", "10s", "--log-level", "info")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("attach's log:\n%s", errb.String())
		}
	})
	state := filepath.Join(runtime, "rialto", id+".json")
	if st := attachStateOf(t, state); !slices.Equal(st.CACertificates, []string{fingerprint(c.CA.Certificate())}) {
		t.Fatalf("the state file lists CA certificates %q, want --cacert's", st.CACertificates)
	}
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc, state, errb
}

// rotateUnderAttach runs `rialto ca rotate` (the running control plane
// follows it, and hands the rotated certificates out) and waits until the
// attachment whose state file is state lists the new CA's certificate:
// it took them at a watch. It returns the new CA's certificate.
func rotateUnderAttach(t *testing.T, c *testcluster.Cluster, state string) *x509.Certificate {
	t.Helper()
	newCA := c.RotateCA()
	c.Heartbeat() // the agents take them too
	testcluster.Eventually(t, 30*time.Second, "attach lists the rotated CA certificates in its state file", func() bool {
		return slices.Contains(attachStateOf(t, state).CACertificates, fingerprint(newCA))
	})
	return newCA
}

// readWriteAfter checks, through the attachment's export nc, that the
// bytes written at off before the rotation are there, and that a write
// after it is read back.
func readWriteAfter(ctx context.Context, t *testing.T, nc *nbd.Client, before []byte, off int64) {
	t.Helper()
	got := make([]byte, len(before))
	if _, err := nc.ReadAt(got, off); err != nil || !bytes.Equal(got, before) {
		t.Fatalf("read through the attachment after the rotation: %v (bytes intact: %v)", err, bytes.Equal(got, before))
	}
	after := bytes.Repeat([]byte("written after the CA rotation "), 1024)
	if _, err := nc.WriteAtContext(ctx, after, 1<<20, true); err != nil {
		t.Fatalf("write through the attachment after the rotation: %v", err)
	}
	got = make([]byte, len(after))
	if _, err := nc.ReadAt(got, 1<<20); err != nil || !bytes.Equal(got, after) {
		t.Fatalf("read back through the attachment after the rotation: %v (bytes intact: %v)", err, bytes.Equal(got, after))
	}
}

// attachStateOf reads an attach state file.
func attachStateOf(t *testing.T, file string) attachState {
	t.Helper()
	st, err := readAttachState(file)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// fingerprint is c's SHA-256 fingerprint, hex, as `rialto ca show`
// prints it.
func fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// agentIssuer is the CA certificate (of c.CA) that issued the
// certificate node id's agent API presents: its node certificate.
func agentIssuer(ctx context.Context, t *testing.T, c *testcluster.Cluster, id string) *x509.Certificate {
	t.Helper()
	node, err := c.Client().Node(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return c.IssuerOf(t, node.AgentURL)
}

// restartUnderNewCA restarts the control plane, which then presents an
// API certificate of the new CA, and then the lender c.Nodes[0], which
// then holds a node certificate of newCA.
func restartUnderNewCA(ctx context.Context, t *testing.T, c *testcluster.Cluster, newCA *x509.Certificate) {
	t.Helper()
	c.RestartControlPlane()
	n := c.Nodes[0]
	n.Restart()
	c.Heartbeat()
	if iss := agentIssuer(ctx, t, c, n.ID()); !iss.Equal(newCA) {
		t.Fatalf("the restarted lender's certificate is issued by %q, want the new CA", iss.Subject.CommonName)
	}
}
