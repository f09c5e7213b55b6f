package stripe

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestRevokedLenderEnded: a volume whose parts are dialled over TLS with
// the configuration and the Tracker of a revocation list ends its
// connections (both of the part's pool) to a lender as soon as the list
// takes a revocation of the lender's certificate, the lender still
// serving; the request that finds them ended redials, fails the
// handshake against the list, and the part is given up at once, with a
// log line saying the lender's certificate is revoked, rather than
// redialled for the whole RedialTimeout. A part on a lender not revoked
// goes on serving.
func TestRevokedLenderEnded(t *testing.T) {
	t.Parallel()
	ca, err := pki.Open(filepath.Join(t.TempDir(), "ca"), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	revoked, kept := tlsLender(t, ca, "lender-revoked"), tlsLender(t, ca, "lender-kept")
	crl := pki.NewCRL([]*x509.Certificate{ca.Certificate()})
	if _, err := crl.Update(ca.CRLPEM()); err != nil {
		t.Fatal(err)
	}
	log, logs := logtest.Logger(nil)
	// Long enough that a part redialled for the whole RedialTimeout
	// stands apart from one given up at once, short enough that the
	// test fails soon when it is redialled.
	const redial = 20 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	vol, err := Dial(ctx, AttachConfig{URIs: []string{revoked.uri, kept.uri}, StripeUnit: 64 << 10,
		TLS: func() *tls.Config {
			return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), VerifyConnection: crl.VerifyPeer}
		},
		Track: crl.Tracker(log), RequestTimeout: 2 * redial, RedialTimeout: redial, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	data := bytes.Repeat([]byte("stripe!!"), 128<<10/8) // one stripe unit on each part
	if _, err := vol.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}

	if err := ca.Revoke(revoked.cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if took, err := crl.Update(ca.CRLPEM()); err != nil || !took {
		t.Fatalf("Update: %v, %v", took, err)
	}
	if n := strings.Count(logs.String(), "ending a TLS connection: its peer's certificate is revoked"); n != DefaultConnsPerPart {
		t.Fatalf("%d connections ended, want the %d to the revoked lender:\n%s", n, DefaultConnsPerPart, logs.String())
	}
	start := time.Now()
	_, err = vol.ReadAt(make([]byte, 64<<10), 0)
	if err == nil {
		t.Fatal("a read of the part on the revoked lender succeeded")
	}
	if took := time.Since(start); took >= redial {
		t.Fatalf("the part was redialled for %v (the whole RedialTimeout) before its read failed: %v", took, err)
	}
	if !strings.Contains(logs.String(), "the part's lender presents a revoked certificate: not reconnecting") {
		t.Fatalf("the read failed (%v), but the log does not say the lender's certificate is revoked:\n%s", err, logs.String())
	}
	got := make([]byte, 64<<10)
	if _, err := vol.ReadAt(got, 64<<10); err != nil || !bytes.Equal(got, data[64<<10:]) {
		t.Fatalf("the part on the lender not revoked: %v", err)
	}
}

// tlsLenderT is a lender serving one export over TLS (nbds://) with a
// certificate for 127.0.0.1: its URI and its certificate.
type tlsLenderT struct {
	uri  string
	cert *x509.Certificate
}

// tlsLender serves one export over TLS with a certificate ca issues for
// cn, until the test ends.
func tlsLender(t *testing.T, ca *pki.CA, cn string) tlsLenderT {
	t.Helper()
	iss, err := ca.Issue(pki.Request{CommonName: cn, Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	var b [8]byte
	rand.Read(b[:])
	name := "cred-" + hex.EncodeToString(b[:])
	srv := &nbd.Server{TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{c}}}
	if err := srv.AddExport(nbd.Export{Name: name, Backend: nbd.NewMemBackend(1 << 20)}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ctx, ln)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return tlsLenderT{uri: nbd.URI{Network: "tcp", Address: ln.Addr().String(), Export: name, TLS: true}.String(), cert: iss.Cert}
}
