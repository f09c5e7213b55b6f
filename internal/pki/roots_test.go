package pki

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRootsFollowARotation: a client's Roots, loaded from a copy of
// ca-cert.pem, verifies the servers of the certificates in use at each
// handshake: after Use of the rotated bundle, a server certificate of the
// new CA too, and after Use of another CA's bundle, only that CA's. A
// bundle holding a certificate that is not a CA's (a server's, which
// would make whoever holds its key any server) is refused and changes
// nothing. The revocation list beside the file, signed by the rotated
// key, is taken once the rotated bundle is in use. Reload takes the file
// again only when it holds other certificates than it did: an operator's
// new file wins over the bundle in use, a file touched does not.
func TestRootsFollowARotation(t *testing.T) {
	t.Parallel()
	caDir := t.TempDir()
	ca, err := Open(caDir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The client's own copy of ca-cert.pem, as on a borrower's host.
	clientDir := t.TempDir()
	file := filepath.Join(clientDir, "roots-ca-cert.pem")
	if err := os.WriteFile(file, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := LoadRoots(file)
	if err != nil {
		t.Fatal(err)
	}
	// A server presenting a certificate its CA signs now, kept (not
	// renewed from the new CA after a rotation, as ServerConfig's).
	server := func(ca *CA) *tls.Config {
		t.Helper()
		iss, err := ca.Issue(Request{CommonName: "roots-server", Hosts: []string{"127.0.0.1"}, Usage: ServerAuth, Lifetime: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		c, err := iss.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		return &tls.Config{Certificates: []tls.Certificate{c}}
	}
	dial := func(srv *tls.Config) error {
		t.Helper()
		_, cerr := handshake(t, srv, r.ClientTLS())
		return cerr
	}
	oldSrv := server(ca)
	if err := dial(oldSrv); err != nil {
		t.Fatalf("a server of the file's CA: %v", err)
	}
	start := r.Hash()

	// A bundle with a server certificate beside the CA's is refused.
	leaf, err := ca.Issue(Request{CommonName: "roots-node", Hosts: []string{"127.0.0.1"}, Usage: ServerAuth})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := ParseCerts(append(append([]byte{}, leaf.CertPEM...), ca.CertPEM()...))
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := r.Use(bad); err == nil || changed || !strings.Contains(err.Error(), "not a CA certificate") {
		t.Fatalf("Use of a bundle with a server certificate: changed %v, %v; want refused", changed, err)
	}
	if r.Hash() != start {
		t.Fatal("a refused bundle changed the certificates in use")
	}

	// `rialto ca rotate`: a server of the new CA is refused until the
	// rotated bundle is in use; the list the new key signed too.
	if err := ca.Rotate(); err != nil {
		t.Fatal(err)
	}
	newSrv := server(ca)
	if err := dial(newSrv); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("a server of the rotated CA before Use: %v, want unknown authority", err)
	}
	crl, err := os.ReadFile(filepath.Join(caDir, CRLFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(clientDir, CRLFile), crl, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := dial(oldSrv); err == nil || !strings.Contains(err.Error(), "not signed by a trusted CA") {
		t.Fatalf("with a list of the rotated key beside the file, before Use: %v, want the list refused", err)
	}
	rotated, err := ParseCerts(ca.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := r.Use(rotated); err != nil || !changed {
		t.Fatalf("Use of the rotated bundle: changed %v, %v", changed, err)
	}
	if r.Hash() != ca.CertHash() {
		t.Fatal("the rotated bundle is not in use")
	}
	for name, srv := range map[string]*tls.Config{"old": oldSrv, "new": newSrv} {
		if err := dial(srv); err != nil {
			t.Fatalf("a server of the %s CA with the rotated bundle: %v", name, err)
		}
	}
	if changed, err := r.Use(rotated); err != nil || changed {
		t.Fatalf("Use of the bundle in use: changed %v, %v", changed, err)
	}

	// The file, touched but the same: the rotated bundle stays.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(file, later, later); err != nil {
		t.Fatal(err)
	}
	if changed, err := r.Reload(); err != nil || changed || r.Hash() != ca.CertHash() {
		t.Fatalf("Reload of the file touched: changed %v, %v; the rotated bundle in use: %v", changed, err, r.Hash() == ca.CertHash())
	}
	// An operator's new file wins.
	other, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, other.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(clientDir, CRLFile)) // the other CA's directory has its own
	if changed, err := r.Reload(); err != nil || !changed || r.Hash() != other.CertHash() {
		t.Fatalf("Reload of a new file: changed %v, %v; its certificates in use: %v", changed, err, r.Hash() == other.CertHash())
	}
	if err := dial(server(other)); err != nil {
		t.Fatalf("a server of the new file's CA: %v", err)
	}
	if err := dial(newSrv); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("a server of the rotated CA once the new file is in use: %v, want unknown authority", err)
	}
	if changed, err := r.Reload(); err != nil || changed {
		t.Fatalf("Reload of the file unchanged: changed %v, %v", changed, err)
	}
}
