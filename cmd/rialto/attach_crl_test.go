package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/pki"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestAttachTakesRevocationList: a running `rialto attach` of a block
// lease, given its own copy of the cluster's ca-cert.pem (--cacert) and
// no ca-crl.pem beside it, ends its open connections to its lender once
// the cluster CA revoked the lender's certificate, with no one copying
// the list to it: it takes the list from the control plane at a --watch
// (GET /v1/ca-certificates, crl_number), ends the connections to the
// lender whose certificate it names (a log line naming the lender's
// address, the serial number and "revoked"), records the list's number
// in its state file, and the read through its export that finds them
// ended redials, fails the handshake against the list, and fails, the
// part given up at once (a log line saying so), while the lender keeps
// running and serving with the revoked certificate. Before, the list was
// checked at handshakes only: the connections open at the revocation
// went on serving until they broke.
//
// The certificate is revoked in the CA directory by another process (as
// docs/operations.md allows; the control plane takes it at its next
// sweep), not by `rialto node remove`: a removal loses the node's leases,
// and attach would detach at the very watch at which it takes the list.
// The lender's heartbeats are paused, as a lender the control plane no
// longer hears would be: a heartbeat with the revoked certificate is
// refused, and the agent would join again with a new one.
func TestAttachTakesRevocationList(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{TLS: true, Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	nc, state, logs := attachWithCACopyLog(ctx, t, c, l.ID)
	if _, err := os.Stat(filepath.Join(filepath.Dir(state), pki.CRLFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a revocation list lies in the attachment's runtime directory: %v", err)
	}
	before := bytes.Repeat([]byte("written before the revocation "), 1024)
	if _, err := nc.WriteAtContext(ctx, before, 8192, true); err != nil {
		t.Fatal(err)
	}
	uris, err := borrower.BlockURIs(c.Lease(l.ID))
	if err != nil || len(uris) != 1 {
		t.Fatalf("the lease's URIs: %q, %v", uris, err)
	}
	u, err := url.Parse(uris[0])
	if err != nil {
		t.Fatal(err)
	}
	lender := c.Nodes[0]
	leaf := agentLeaf(ctx, t, c, lender.ID())

	lender.PauseHeartbeats(true)
	num := revokeInCADir(t, c, leaf)
	testcluster.Eventually(t, 30*time.Second, "attach records the control plane's revocation list in its state file", func() bool {
		return attachStateOf(t, state).CRLNumber >= num
	})
	if _, err := os.Stat(filepath.Join(filepath.Dir(state), pki.CRLFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a revocation list lies in the attachment's runtime directory: %v", err)
	}
	// The list is taken, and the connections it revokes ended, before
	// its number is recorded.
	ended := logs.Lines("ending a TLS connection: its peer's certificate is revoked")
	if len(ended) == 0 {
		t.Fatalf("attach took the list revoking its lender, but ended no connection to it:\n%s", logs.String())
	}
	for _, line := range ended {
		if !strings.Contains(line, "peer="+u.Host) || !strings.Contains(line, "serial="+leaf.SerialNumber.Text(16)) {
			t.Fatalf("the line ending a connection does not name the lender (%s) and its serial number (%s): %s", u.Host, leaf.SerialNumber.Text(16), line)
		}
	}
	if got := c.Lease(l.ID).State; got != api.LeaseActive {
		t.Fatalf("the lease is %s, want active", got)
	}
	if !lender.Serves(l.ID) {
		t.Fatal("the lender no longer serves the lease")
	}

	got := make([]byte, len(before))
	_, err = nc.ReadAt(got, 8192)
	if err == nil {
		t.Fatalf("a read through the attachment was answered by the revoked lender (bytes intact: %v)", bytes.Equal(got, before))
	}
	if !strings.Contains(logs.String(), "the part's lender presents a revoked certificate: not reconnecting") ||
		!strings.Contains(logs.String(), pki.ErrRevoked.Error()) {
		t.Fatalf("the read failed (%v), but attach's log does not say the redial found the lender's certificate revoked:\n%s", err, logs.String())
	}
	if !lender.Serves(l.ID) {
		t.Fatal("the lender no longer serves the lease")
	}
}

// agentLeaf is the certificate node id's agent presents (its node
// certificate, which its data planes serve too).
func agentLeaf(ctx context.Context, t *testing.T, c *testcluster.Cluster, id string) *x509.Certificate {
	t.Helper()
	node, err := c.Client().Node(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(node.AgentURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", u.Host, c.CA.ClientConfig(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// TestAttachMemoryEndsRevokedDonor: TestAttachTakesRevocationList for a
// memory lease. Once a --watch takes the control plane's list naming the
// donor's certificate, every connection of attach's session to the donor
// is ended, each with a log line naming the donor's address and the
// serial number; the read through the export that finds the session
// lost asks the control plane where the lease is, finds it at the same
// donor, redials it once, fails the handshake against the list and
// fails, with a log line saying so, while the donor keeps serving. Before,
// the session's connections open at the revocation went on serving.
func TestAttachMemoryEndsRevokedDonor(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{TLS: true, Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "mem0", Kind: api.KindMemory, Size: 16 << 20},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	nc, state, logs := attachWithCACopyLog(ctx, t, c, l.ID)
	before := bytes.Repeat([]byte("in memory before the revocation "), 1024)
	if _, err := nc.WriteAtContext(ctx, before, 8192, true); err != nil {
		t.Fatal(err)
	}
	uris, err := borrower.MemoryURIs(c.Lease(l.ID))
	if err != nil || len(uris) != 1 || !uris[0].TLS {
		t.Fatalf("the lease's URIs: %+v, %v", uris, err)
	}
	donor := c.Nodes[0]
	leaf := agentLeaf(ctx, t, c, donor.ID())

	donor.PauseHeartbeats(true)
	num := revokeInCADir(t, c, leaf)
	testcluster.Eventually(t, 30*time.Second, "attach records the control plane's revocation list in its state file", func() bool {
		return attachStateOf(t, state).CRLNumber >= num
	})
	ended := logs.Lines("ending a TLS connection: its peer's certificate is revoked")
	// The session's control, sync, bulk (2) and queue connections.
	if len(ended) != 5 {
		t.Fatalf("attach took the list revoking its donor, and ended %d connections to it, want 5:\n%s", len(ended), logs.String())
	}
	for _, line := range ended {
		if !strings.Contains(line, "peer="+uris[0].Address) || !strings.Contains(line, "serial="+leaf.SerialNumber.Text(16)) {
			t.Fatalf("the line ending a connection does not name the donor (%s) and its serial number (%s): %s", uris[0].Address, leaf.SerialNumber.Text(16), line)
		}
	}
	if got := c.Lease(l.ID).State; got != api.LeaseActive {
		t.Fatalf("the lease is %s, want active", got)
	}

	got := make([]byte, len(before))
	if _, err := nc.ReadAt(got, 8192); err == nil {
		t.Fatalf("a read through the attachment was answered by the revoked donor (bytes intact: %v)", bytes.Equal(got, before))
	}
	if !strings.Contains(logs.String(), "the region's donor presents a revoked certificate: not opening a session there again") ||
		!strings.Contains(logs.String(), pki.ErrRevoked.Error()) {
		t.Fatalf("the read failed, but attach's log does not say the redial found the donor's certificate revoked:\n%s", logs.String())
	}
	if !donor.Serves(l.ID) {
		t.Fatal("the donor no longer serves the lease")
	}
}

// revokeInCADir revokes leaf in the cluster's CA directory, as another
// process may (docs/operations.md), has the control plane take the list
// at a sweep, and returns the list's number.
func revokeInCADir(t *testing.T, c *testcluster.Cluster, leaf *x509.Certificate) int64 {
	t.Helper()
	revoker, err := pki.Load(c.CA.Dir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := revoker.Revoke(leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	c.Sweep() // the control plane takes the directory's list
	num := c.CA.CRLNumber().Int64()
	if !c.CA.Revoked(leaf.SerialNumber) || num == 0 {
		t.Fatalf("the control plane did not take the revocation (list %d)", num)
	}
	return num
}
