package controlplane

import (
	"context"
	"crypto/x509"
	"math/big"
	"net/http"
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
	c := adminClientTLS(t, cp)

	got, err := c.CACertificates(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	old := cp.ca.CertHash()
	if got.CAHash != old || got.CACertificate != string(cp.ca.CertPEM()) {
		t.Fatalf("the CA certificates: hash %q, %d bytes; want %q and ca-cert.pem", got.CAHash, len(got.CACertificate), old)
	}
	if got, err := c.CACertificates(ctx, old, 0); err != nil || got.CAHash != old || got.CACertificate != "" {
		t.Fatalf("with the hash of those held: %+v, %v; want the hash alone", got, err)
	}
	if _, err := c.WithToken("").CACertificates(ctx, "", 0); !api.IsCode(err, api.CodeUnauthorized) {
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
	got, err = c.CACertificates(ctx, old, 0)
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
	if again, err := c.CACertificates(ctx, rotated.CertHash(), 0); err != nil || again.CACertificate != "" {
		t.Fatalf("with the hash of the directory's bundle: %+v, %v; want the hash alone", again, err)
	}
}

// TestCACertificatesRouteCRL: GET /v1/ca-certificates with crl_number
// carries the CA's revocation list when its number is higher than the
// caller's, and not otherwise (nor without crl_number, as before it was
// asked for); once a node is removed with --force, the list it carries to
// a caller holding the one before names the node's certificate, signed
// by the CA. A crl_number that is not a number of a list is 400.
func TestCACertificatesRouteCRL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cp := newCASQLite(ctx, t, Config{})
	c := adminClientTLS(t, cp)
	j, leaf := joinN1Cert(ctx, t, cp.srv)

	before := cp.ca.CRLNumber().Int64()
	if got, err := c.CACertificates(ctx, cp.ca.CertHash(), before); err != nil || got.CRL != "" {
		t.Fatalf("holding the current list: %+v, %v; want no list", got, err)
	}
	if _, err := cp.srv.removeNode(ctx, j.NodeID, true); err != nil {
		t.Fatal(err)
	}
	num := cp.ca.CRLNumber().Int64()
	if num <= before {
		t.Fatalf("the list's number is %d after the removal, %d before", num, before)
	}
	got, err := c.CACertificates(ctx, cp.ca.CertHash(), before)
	if err != nil {
		t.Fatal(err)
	}
	crl, err := pki.ParseCRL([]byte(got.CRL), []*x509.Certificate{cp.ca.Certificate()})
	if err != nil {
		t.Fatalf("the list handed out: %v", err)
	}
	if crl.Number.Int64() != num || !slices.ContainsFunc(crl.RevokedCertificateEntries, func(e x509.RevocationListEntry) bool {
		return e.SerialNumber.Cmp(leaf.SerialNumber) == 0
	}) {
		t.Fatalf("the list handed out (number %v) does not name the removed node's certificate %s (current number %d)", crl.Number, leaf.SerialNumber.Text(16), num)
	}
	if got.CACertificate != "" {
		t.Fatal("the CA certificates were handed out to a caller holding them")
	}
	for _, held := range []int64{num, num + 1} {
		if got, err := c.CACertificates(ctx, cp.ca.CertHash(), held); err != nil || got.CRL != "" {
			t.Fatalf("holding list %d (current %d): %+v, %v; want no list", held, num, got, err)
		}
	}
	var out api.CACertificates
	if err := c.Do(ctx, http.MethodGet, "/v1/ca-certificates?ca_hash="+cp.ca.CertHash(), nil, &out); err != nil || out.CRL != "" {
		t.Fatalf("without crl_number: %+v, %v; want no list", out, err)
	}
	for _, bad := range []string{"-1", "x", big.NewInt(0).Lsh(big.NewInt(1), 70).String()} {
		err := c.Do(ctx, http.MethodGet, "/v1/ca-certificates?crl_number="+bad, nil, &out)
		if !api.IsCode(err, api.CodeInvalid) {
			t.Fatalf("crl_number=%s: %v, want invalid", bad, err)
		}
	}
}

// adminClientTLS serves cp over TLS until the test ends and returns an
// admin client of it that verifies it with the CA's certificates.
func adminClientTLS(t *testing.T, cp caSQLite) *api.Client {
	t.Helper()
	hc, err := api.HTTPClient(cp.ca.CertFile(), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return api.NewClient(serveTLS(t, cp.srv, cp.ca), adminTok, hc)
}
