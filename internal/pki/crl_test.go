package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNotAfter: the expiry of a serial the index lists is the one it
// records, expired already too (still in the file); of one it does not
// list, the latest expiry of the CA certificates trusted, a rotation's
// new one included.
func TestNotAfter(t *testing.T) {
	clk := newClock()
	ca := openCA(t, t.TempDir(), clk)
	iss, err := ca.Issue(Request{CommonName: "node-a", Hosts: []string{"127.0.0.1"}, Usage: ClientAuth, Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Hour) // it has expired
	if err := ca.Rotate(); err != nil {
		t.Fatal(err)
	}
	unknown := big.NewInt(0x5eed)
	got, err := ca.NotAfter([]*big.Int{iss.Cert.SerialNumber, unknown})
	if err != nil {
		t.Fatal(err)
	}
	if !got[0].Equal(iss.Cert.NotAfter) {
		t.Errorf("the expiry of an issued certificate: %v, want %v", got[0], iss.Cert.NotAfter)
	}
	if bound := ca.Certificate().NotAfter; !got[1].Equal(bound) || !bound.After(iss.Cert.NotAfter) {
		t.Errorf("the expiry of an unknown serial: %v, want the new CA certificate's %v", got[1], bound)
	}
}

// TestRevokeIssuedTo: every unexpired certificate issued to a holder is
// revoked at once (a removed node's current and renewed certificates),
// others are not, and expired entries leave the index.
func TestRevokeIssuedTo(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	ca := openCA(t, dir, clk)
	issue := func(cn string, life time.Duration) *Issued {
		iss, err := ca.Issue(Request{CommonName: cn, Hosts: []string{"127.0.0.1"}, Usage: ServerAuth | ClientAuth, Lifetime: life})
		if err != nil {
			t.Fatal(err)
		}
		return iss
	}
	a1, a2 := issue("node-a", time.Hour), issue("node-a", 2*time.Hour)
	old := issue("node-a", time.Minute)
	b := issue("node-b", time.Hour)
	clk.Add(2 * time.Minute) // old has expired
	if st, err := os.Stat(filepath.Join(dir, IndexFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("index: %v %v", st, err)
	}
	// Another process sharing the directory revokes.
	second := openCA(t, dir, clk)
	serials, err := second.RevokeIssuedTo("node-a")
	if err != nil || len(serials) != 2 {
		t.Fatalf("RevokeIssuedTo: %v, %v", serials, err)
	}
	got := map[string]bool{serials[0].Text(16): true, serials[1].Text(16): true}
	if !got[a1.Cert.SerialNumber.Text(16)] || !got[a2.Cert.SerialNumber.Text(16)] {
		t.Fatalf("RevokeIssuedTo returned %v, want the serials of a1 and a2", serials)
	}
	if again, err := second.RevokeIssuedTo("node-a"); err != nil || len(again) != 0 {
		t.Fatalf("again: %v, %v", again, err)
	}
	if changed, err := ca.ReloadIfChanged(); err != nil || !changed {
		t.Fatalf("ReloadIfChanged: %v %v", changed, err)
	}
	if changed, err := ca.ReloadIfChanged(); err != nil || changed {
		t.Fatalf("ReloadIfChanged again: %v %v", changed, err)
	}
	for _, c := range []*CA{ca, second} {
		if !c.Revoked(a1.Cert.SerialNumber) || !c.Revoked(a2.Cert.SerialNumber) || c.Revoked(b.Cert.SerialNumber) || c.Revoked(old.Cert.SerialNumber) {
			t.Fatal("wrong certificates revoked")
		}
	}
	entries, err := ca.readIndex()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 {
		t.Fatalf("index holds %d entries, want 3 (the expired one dropped)", len(entries))
	}
	if _, err := ca.RevokeIssuedTo(""); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("empty name: %v", err)
	}
}

// TestCRL: a holder of the CA certificates follows the revocation list,
// from PEM it is given and from a file someone else updates, refuses
// lists the CA did not sign and older ones, and fails closed on a file it
// cannot read.
func TestCRL(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	ca := openCA(t, dir, clk)
	other := openCA(t, t.TempDir(), clk)
	iss, err := ca.Issue(Request{CommonName: "node-a", Hosts: []string{"127.0.0.1"}, Usage: ServerAuth})
	if err != nil {
		t.Fatal(err)
	}
	roots, err := ReadCerts(ca.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	// From PEM.
	crl := NewCRL(roots)
	before := ca.CRLPEM()
	if ok, err := crl.Update(before); err != nil || !ok {
		t.Fatalf("Update: %v %v", ok, err)
	}
	if err := crl.Check(iss.Cert); err != nil {
		t.Fatalf("not revoked yet: %v", err)
	}
	if err := ca.Revoke(iss.Cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if ok, err := crl.Update(ca.CRLPEM()); err != nil || !ok {
		t.Fatalf("Update: %v %v", ok, err)
	}
	if err := crl.Check(iss.Cert); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked: %v", err)
	}
	if ok, err := crl.Update(before); err != nil || ok {
		t.Fatalf("an older list replaced a newer one: %v %v", ok, err)
	}
	if _, err := crl.Update(other.CRLPEM()); err == nil || !strings.Contains(err.Error(), "not signed") {
		t.Fatalf("another CA's list: %v", err)
	}
	if _, err := crl.Update([]byte("junk")); err == nil {
		t.Fatal("junk accepted")
	}
	if err := crl.Check(iss.Cert); !errors.Is(err, ErrRevoked) {
		t.Fatalf("after refused updates: %v", err)
	}

	// From a file: a borrower's copy of ca-cert.pem and ca-crl.pem.
	bdir := t.TempDir()
	caFile := filepath.Join(bdir, CACertFile)
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadClientTLS(caFile)
	if err != nil {
		t.Fatalf("no ca-crl.pem: %v", err)
	}
	server := func(iss *Issued) *tls.Config {
		c, err := iss.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		return &tls.Config{Certificates: []tls.Certificate{c}}
	}
	client := cfg.Clone()
	client.ServerName = "127.0.0.1"
	client.Time = clk.Now
	if _, cerr := handshake(t, server(iss), client); cerr != nil {
		t.Fatalf("without a list: %v", cerr)
	}
	crlFile := filepath.Join(bdir, CRLFile)
	if err := os.WriteFile(crlFile, ca.CRLPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, cerr := handshake(t, server(iss), client); cerr == nil || !strings.Contains(cerr.Error(), "revoked") {
		t.Fatalf("revoked server: %v", cerr)
	}
	good, err := ca.Issue(Request{CommonName: "node-b", Hosts: []string{"127.0.0.1"}, Usage: ServerAuth})
	if err != nil {
		t.Fatal(err)
	}
	if _, cerr := handshake(t, server(good), client); cerr != nil {
		t.Fatalf("good server: %v", cerr)
	}
	// A list that does not verify fails every check (closed), until fixed.
	if err := os.WriteFile(crlFile, other.CRLPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, cerr := handshake(t, server(good), client); cerr == nil || !strings.Contains(cerr.Error(), "cannot check revocation") {
		t.Fatalf("forged list: %v", cerr)
	}
	if _, err := LoadClientTLS(caFile); err == nil {
		t.Fatal("LoadClientTLS took a forged list")
	}
	if err := os.WriteFile(crlFile, ca.CRLPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, cerr := handshake(t, server(good), client); cerr != nil {
		t.Fatalf("list fixed: %v", cerr)
	}
}

// FuzzParseCRL: arbitrary bytes (a CRL comes from the control plane in
// join and heartbeat answers) never panic the parser, and nothing but a
// list the CA signed is accepted.
func FuzzParseCRL(f *testing.F) {
	ca, err := Open(f.TempDir(), Options{})
	if err != nil {
		f.Fatal(err)
	}
	roots := []*x509.Certificate{ca.Certificate()}
	f.Add(ca.CRLPEM())
	f.Add([]byte("-----BEGIN X509 CRL-----\nMAA=\n-----END X509 CRL-----\n"))
	f.Add([]byte("junk"))
	good := string(ca.CRLPEM())
	f.Fuzz(func(t *testing.T, b []byte) {
		crl, err := ParseCRL(b, roots)
		if err == nil && crl == nil {
			t.Fatal("no list and no error")
		}
		if err == nil && string(b) != good && crl.CheckSignatureFrom(roots[0]) != nil {
			t.Fatal("accepted a list the CA did not sign")
		}
		_, _ = NewCRL(roots).Update(b)
	})
}

// TestRevokeAfterALongIndexLine: a line of the index too long for a
// line scanner (a damaged file, a holder with a very long name) does not
// hide the entries after it: RevokeIssuedTo still revokes them.
func TestRevokeAfterALongIndexLine(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	ca := openCA(t, dir, clk)
	f, err := os.OpenFile(filepath.Join(dir, IndexFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(strings.Repeat("x", 100<<10) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.Issue(Request{CommonName: "node-a", Hosts: []string{"127.0.0.1"}, Usage: ServerAuth | ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	serials, err := ca.RevokeIssuedTo("node-a")
	if err != nil || len(serials) != 1 || serials[0].Cmp(iss.Cert.SerialNumber) != 0 {
		t.Fatalf("RevokeIssuedTo after a long line: %v, %v", serials, err)
	}
}
