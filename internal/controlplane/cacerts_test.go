package controlplane

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestCACertificatesRoute: GET /v1/ca-certificates answers the CA
// certificates the control plane trusts and their hash, leaves them out
// when the caller's ca_hash is theirs, wants a token, and after a `rialto
// ca rotate` of the directory (another process), once the running
// control plane followed it, answers the rotated bundle to a caller
// holding the old one, over the connection it verified with the old CA.
func TestCACertificatesRoute(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cp := newCASQLite(ctx, t, Config{})
	url := serveTLS(t, cp.srv, cp.ca)
	hc, err := api.HTTPClient(cp.ca.CertFile(), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := api.NewClient(url, adminTok, hc)

	got, err := c.CACertificates(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	old := cp.ca.CertHash()
	if got.CAHash != old || got.CACertificate != string(cp.ca.CertPEM()) {
		t.Fatalf("the CA certificates: hash %q, %d bytes; want %q and ca-cert.pem", got.CAHash, len(got.CACertificate), old)
	}
	if got, err := c.CACertificates(ctx, old); err != nil || got.CAHash != old || got.CACertificate != "" {
		t.Fatalf("with the hash of those held: %+v, %v; want the hash alone", got, err)
	}
	if _, err := c.WithToken("").CACertificates(ctx, ""); !api.IsCode(err, api.CodeUnauthorized) {
		t.Fatalf("without a token: %v, want unauthorized", err)
	}

	rotated, err := pki.Load(cp.ca.Dir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	oldCA := rotated.Certificate()
	if err := rotated.Rotate(); err != nil {
		t.Fatal(err)
	}
	if err := cp.srv.Sweep(ctx); err != nil { // follows the rotation
		t.Fatal(err)
	}
	got, err = c.CACertificates(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ParseCerts([]byte(got.CACertificate))
	if err != nil {
		t.Fatalf("the rotated CA certificates: %v", err)
	}
	if got.CAHash == old || got.CAHash != cp.ca.CertHash() || pki.CertsHash(certs) != got.CAHash || len(certs) != 2 ||
		!slices.ContainsFunc(certs, rotated.Certificate().Equal) || !slices.ContainsFunc(certs, oldCA.Equal) {
		t.Fatalf("after the rotation: hash %q of %d certificates, want the new CA's and the old one's (%q)", got.CAHash, len(certs), cp.ca.CertHash())
	}
	// The running control plane keeps signing with its own (old) key, but
	// hands out the directory's bundle, as a restarted one would
	// (pki.SortCerts): a caller holding that has it already.
	file, err := os.ReadFile(rotated.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	if got.CACertificate != string(file) || got.CAHash != rotated.CertHash() {
		t.Fatalf("after the rotation: the bundle handed out is not the directory's %s", rotated.CertFile())
	}
	if again, err := c.CACertificates(ctx, rotated.CertHash()); err != nil || again.CACertificate != "" {
		t.Fatalf("with the hash of the directory's bundle: %+v, %v; want the hash alone", again, err)
	}
}
