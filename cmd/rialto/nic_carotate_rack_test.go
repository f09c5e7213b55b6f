package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/pki"
	"github.com/rialto-project/rialto/internal/rack"
)

// TestNICAttachFollowsCARotation: a running `rialto attach` of a nic
// lease, given its own copy of the cluster's ca-cert.pem (--cacert, which
// the rotation leaves as it was), keeps its interface across the rotation
// docs/operations.md describes: `rialto ca rotate`, the control plane's
// restart (its API certificate now from the new CA), and the lender's
// restart (its node certificate, which its tunnel presents, renewed from
// the new CA; the tunnel drops, and attach must redial it). Attach takes
// the rotated CA certificates from the control plane at a --watch, lists
// them in its state file, and redials the lender with them: the lent NIC
// carries traffic again. Before, the tunnels were dialled with the CA
// certificates of attach's start, and every redial failed ("certificate
// was not accepted (signed by an unknown authority)").
func TestNICAttachFollowsCARotation(t *testing.T) {
	n := newNICRack(t, rack.Config{Agents: 1, Borrowers: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b := n.r.Borrower(0)
	server := n.r.Outside().Server.String()
	if n.ping(b, server) {
		t.Fatal("the outside answers the borrower before any attach: the test proves nothing")
	}
	l := n.create(ctx, "--kind", "nic", "--bandwidth", "24Mbit/s")
	checkNICTLS(t, l)
	uris, err := borrower.NICURIs(l)
	if err != nil {
		t.Fatal(err)
	}
	oldCerts, err := pki.ReadCerts(n.r.CACert())
	if err != nil {
		t.Fatal(err)
	}
	caCopy := filepath.Join(t.TempDir(), "nicca-ca-cert.pem")
	b0, err := os.ReadFile(n.r.CACert())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caCopy, b0, 0o644); err != nil {
		t.Fatal(err)
	}
	a := n.attach(ctx, b, l.ID, "rnic0", "--cacert", caCopy, "--watch", "100ms", "--log-level", "info")
	if !n.ping(b, server) {
		t.Fatalf("no ping through the lent NIC: %s", a.log())
	}
	state := filepath.Join(n.xdg, "rialto", l.ID+".json")
	if got := attachStateOf(t, state).CACertificates; !slices.Equal(got, fingerprints(oldCerts)) {
		t.Fatalf("the state file lists CA certificates %q, want --cacert's", got)
	}

	// `rialto ca rotate`: the running control plane follows it and hands
	// the rotated certificates out; attach takes them at a watch.
	if _, err := n.cli(ctx, "ca", "rotate", "--tls-dir", filepath.Dir(n.r.CACert())); err != nil {
		t.Fatal(err)
	}
	rotated, err := pki.ReadCerts(n.r.CACert())
	if err != nil {
		t.Fatal(err)
	}
	newCA := rotated[0]
	if slices.ContainsFunc(oldCerts, newCA.Equal) {
		t.Fatal("ca rotate left the CA as it was")
	}
	poll(t, "attach to list the rotated CA certificates in its state file", 60*time.Second, func() bool {
		return slices.Contains(attachStateOf(t, state).CACertificates, fingerprint(newCA))
	})

	// The control plane restarts with an API certificate of the new CA,
	// then the lender with a node certificate of the new CA.
	if err := n.r.StopControlPlane(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.r.StartControlPlane(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.r.RestartAgent(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// The rack calls the lender ready once its join is recorded; the
	// certificate of the new CA that the join answered with is in use
	// a moment later (until then the old one, still valid, is).
	var iss *x509.Certificate
	poll(t, "the restarted lender's tunnel to present a certificate of the new CA", 30*time.Second, func() bool {
		iss = tunnelIssuer(t, uris[0].Address, rotated)
		return iss.Equal(newCA)
	})

	// The attachment redials the lender, and the lent NIC carries
	// traffic again.
	poll(t, "a ping through the lent NIC after the lender's renewal", 60*time.Second, func() bool {
		select {
		case <-a.done:
			t.Fatalf("attach ended: %s", a.log())
		default:
		}
		return n.ping(b, server)
	})
	n.detach(ctx, a, l.ID)
}

// tunnelIssuer is the CA certificate among cas that issued the
// certificate the nic tunnel at addr presents (its lender's node
// certificate).
func tunnelIssuer(t *testing.T, addr string, cas []*x509.Certificate) *x509.Certificate {
	t.Helper()
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatalf("TLS to the lender's tunnel %s: %v", addr, err)
	}
	defer conn.Close()
	chains := conn.ConnectionState().VerifiedChains
	return chains[0][len(chains[0])-1]
}
