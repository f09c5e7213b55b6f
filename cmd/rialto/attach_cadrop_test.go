package main

import (
	"bytes"
	"context"
	"encoding/pem"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/pki"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestAttachEndsConnectionsToADroppedCA: a running `rialto attach` of a
// block lease, given its own copy of the cluster's ca-cert.pem
// (--cacert), follows a rotation (it trusts the old CA and the new one)
// and then the `rialto ca drop-old` that ends it (the restarted control
// plane hands out the new CA's certificate alone): its open connections
// to a lender still presenting a certificate of the dropped CA end as
// soon as it takes that bundle, with a log line naming the lender's
// address, the serial number and "no longer trusted: its CA was
// dropped", and a read through its export is no longer answered by that
// lender (the redials fail against the new CA), while the lender keeps
// running and serving the lease with its old certificate. Before, those
// connections went on serving: the chain was checked at handshakes only.
//
// The lender's heartbeats are paused before the drop: a heartbeat
// presenting the old CA's certificate is refused at the handshake, and
// the agent would be restarted by its operator to join again (as in
// docs/operations.md): here it keeps the old certificate, as a lender
// that missed its renewal does.
func TestAttachEndsConnectionsToADroppedCA(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{TLS: true, Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	nc, state, logs := attachWithCACopyLog(ctx, t, c, l.ID)
	before := bytes.Repeat([]byte("written before the CA was dropped "), 1024)
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
	oldCA := c.CA.Certificate()

	newCA := rotateUnderAttach(t, c, state)
	// The attachment goes on across the rotation: its lender's
	// certificate chains to a CA it still trusts.
	got := make([]byte, len(before))
	if _, err := nc.ReadAt(got, 8192); err != nil || !bytes.Equal(got, before) {
		t.Fatalf("read through the attachment after the rotation: %v (bytes intact: %v)", err, bytes.Equal(got, before))
	}

	lender.PauseHeartbeats(true)
	if err := c.CA.DropOld(); err != nil {
		t.Fatal(err)
	}
	c.RestartControlPlane() // trusts the new CA alone, and hands it out
	testcluster.Eventually(t, 30*time.Second, "attach lists the new CA's certificate alone in its state file", func() bool {
		return slices.Equal(attachStateOf(t, state).CACertificates, []string{fingerprint(newCA)})
	})
	// The bundle is taken, and the connections it no longer trusts
	// ended, before the state file lists it.
	ended := logs.Lines("ending a TLS connection: its peer's certificate is no longer trusted: its CA was dropped")
	if len(ended) == 0 {
		t.Fatalf("attach took the bundle without its lender's CA, but ended no connection to it:\n%s", logs.String())
	}
	for _, line := range ended {
		if !strings.Contains(line, "peer="+u.Host) || !strings.Contains(line, "serial="+leaf.SerialNumber.Text(16)) ||
			!strings.Contains(line, oldCA.Subject.CommonName) {
			t.Fatalf("the line ending a connection does not name the lender (%s), its serial number (%s) and the dropped CA (%s): %s",
				u.Host, leaf.SerialNumber.Text(16), oldCA.Subject.CommonName, line)
		}
	}
	if got := c.Lease(l.ID); got.State != api.LeaseActive {
		t.Fatalf("the lease is %s, want active", got.State)
	}
	if !lender.Serves(l.ID) {
		t.Fatal("the lender no longer serves the lease")
	}

	_, err = nc.ReadAt(got, 8192)
	if err == nil {
		t.Fatalf("a read through the attachment was answered by the lender whose CA was dropped (bytes intact: %v)", bytes.Equal(got, before))
	}
	if !strings.Contains(logs.String(), "certificate signed by unknown authority") {
		t.Fatalf("the read failed (%v), but attach's log does not say its redials found the lender's certificate untrusted:\n%s", err, logs.String())
	}
	if !lender.Serves(l.ID) {
		t.Fatal("the lender no longer serves the lease")
	}
}

// TestAttachCACertFileWinsOverStaleControlPlane: a running `rialto
// attach` whose --cacert file an operator replaced with the bundle of a
// `rialto ca drop-old` (the new CA alone) keeps verifying with it while
// the control plane, not yet restarted, still hands out the bundle with
// the dropped CA: the file replaced that very answer, and wins over it
// (as docs/operations.md says a replaced file does), until the control
// plane answers another. Before, the same watch that took the file asked
// the control plane and took its old bundle back: the dropped CA was
// trusted again, and a lender still presenting its certificate redialled
// and served, until the control plane's restart (a walkthrough saw its
// connection ended twice, 5 s apart).
func TestAttachCACertFileWinsOverStaleControlPlane(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{TLS: true, Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	caCopy := filepath.Join(t.TempDir(), "attachca-ca-cert.pem")
	if err := os.WriteFile(caCopy, c.CA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	attachedErr(t, c, runtime, l.ID, "--cacert", caCopy, "--watch", "50ms", "--timeout", "10s", "--log-level", "info")
	state := filepath.Join(runtime, "rialto", l.ID+".json")
	newCA := rotateUnderAttach(t, c, state)
	if got := attachStateOf(t, state).CACertificates; len(got) != 2 {
		t.Fatalf("after the rotation attach lists %q, want the new CA and the old", got)
	}

	// Step 3: the control plane restarted, issuing from the new CA (its
	// certificate verifies with the new CA alone) and handing out both.
	c.RestartControlPlane()
	// Step 4: the operator hands out drop-old's file; the control plane,
	// not restarted since, still hands out both.
	if err := os.WriteFile(caCopy, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: newCA.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 30*time.Second, "attach lists the new CA's certificate alone, from its --cacert file", func() bool {
		return slices.Equal(attachStateOf(t, state).CACertificates, []string{fingerprint(newCA)})
	})
	// A later watch, which asked the control plane (it took the list
	// a revocation made since), keeps the file's.
	revoker, err := pki.Load(c.CA.Dir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := revoker.Revoke(big.NewInt(424242)); err != nil {
		t.Fatal(err)
	}
	c.Sweep()
	num := c.CA.CRLNumber().Int64()
	testcluster.Eventually(t, 30*time.Second, "attach takes the control plane's newer revocation list", func() bool {
		return attachStateOf(t, state).CRLNumber >= num
	})
	if got := attachStateOf(t, state).CACertificates; !slices.Equal(got, []string{fingerprint(newCA)}) {
		t.Fatalf("attach lists %q after asking the control plane again, want the --cacert file's new CA alone", got)
	}
}
