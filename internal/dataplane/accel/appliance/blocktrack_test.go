package appliance

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd/nbdtest"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestBlockTrackEndsRevokedLender: a slot's LOAD from an nbds:// block
// part, waiting on its lender, fails at once when a revocation list
// Config.BlockTrack registers the connection with takes a list revoking
// the lender's certificate. Before, the connection, verified at its
// handshake, lived on: the LOAD waited for the lender for the block
// request timeout (30 s).
func TestBlockTrackEndsRevokedLender(t *testing.T) {
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.Issue(pki.Request{CommonName: "node-lender", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	be := &stallBackend{MemBackend: nbd.NewMemBackend(1 << 20), entered: make(chan struct{}), release: make(chan struct{})}
	srv := &nbd.Server{TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}}
	if err := srv.AddExport(nbd.Export{Name: "rlc_revoked", Backend: be}); err != nil {
		t.Fatal(err)
	}
	ln := nbdtest.Listen(t)
	nbdtest.Serve(t, srv, ln)
	t.Cleanup(func() { close(be.release) })
	uri := nbd.URI{Network: "tcp", Address: ln.Addr().String(), Export: "rlc_revoked", TLS: true}.String()

	crl := pki.NewCRL([]*x509.Certificate{ca.Certificate()})
	if _, err := crl.Update(ca.CRLPEM()); err != nil {
		t.Fatal(err)
	}
	a := start(t, Config{Slots: 1, SlotMemory: 1 << 20,
		BlockTLS: func() *tls.Config {
			return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), VerifyConnection: crl.VerifyPeer}
		},
		BlockTrack: crl.Tracker(nil)})
	c := leaseSlot(t, a, 0, "sha256")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Load(ctx, 0, 1<<20, accel.BlockRange{Parts: []string{uri}}) }()
	select {
	case <-be.entered:
	case err := <-errc:
		t.Fatalf("load ended before reaching the lender: %v", err)
	}
	if err := ca.Revoke(iss.Cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if took, err := crl.Update(ca.CRLPEM()); err != nil || !took {
		t.Fatalf("Update: %v, %v", took, err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, accel.ErrBlockIO) {
			t.Fatalf("the load from the revoked lender: %v, want %v", err, accel.ErrBlockIO)
		}
		t.Logf("the load says: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the load from the revoked lender still waits 10 s after the list revoking it was taken")
	}
}
