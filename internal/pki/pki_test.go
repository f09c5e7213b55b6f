package pki

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is an injected clock tests move by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func openCA(t *testing.T, dir string, clk *clock) *CA {
	t.Helper()
	ca, err := Open(dir, Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestOpenCreatesAndReloads(t *testing.T) {
	clk := newClock()
	dir := filepath.Join(t.TempDir(), "ca")
	ca := openCA(t, dir, clk)
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v, %v", st.Mode(), err)
	}
	for name, perm := range map[string]os.FileMode{CAKeyFile: 0o600, CACertFile: 0o644, CRLFile: 0o644} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != perm {
			t.Errorf("%s mode %v, want %v", name, st.Mode().Perm(), perm)
		}
	}
	c := ca.Certificate()
	if !c.IsCA || !strings.HasPrefix(c.Subject.CommonName, "Rialto cluster CA ") || c.PublicKeyAlgorithm != x509.ECDSA {
		t.Fatalf("CA certificate: CA %v, CN %q, %v", c.IsCA, c.Subject.CommonName, c.PublicKeyAlgorithm)
	}
	if got := c.NotAfter.Sub(clk.Now()); got != DefaultCALifetime {
		t.Fatalf("CA lifetime %v", got)
	}
	again := openCA(t, dir, clk)
	if !again.Certificate().Equal(c) {
		t.Fatal("reopening made another CA")
	}
	// Load does not create.
	if _, err := Load(filepath.Join(t.TempDir(), "none"), Options{}); !errors.Is(err, ErrNoCA) {
		t.Fatalf("Load of an empty dir: %v", err)
	}
	// A certificate without its key is not a CA to sign with.
	lone := t.TempDir()
	os.WriteFile(filepath.Join(lone, CACertFile), ca.CertPEM(), 0o644)
	if _, err := Open(lone, Options{}); !errors.Is(err, ErrNoCA) {
		t.Fatalf("Open of a dir with only ca-cert.pem: %v", err)
	}
	// A key that does not match the certificate is refused.
	other := openCA(t, t.TempDir(), clk)
	os.WriteFile(filepath.Join(other.Dir(), CACertFile), ca.CertPEM(), 0o644)
	if _, err := Open(other.Dir(), Options{}); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("mismatched key: %v", err)
	}
}

func TestIssue(t *testing.T) {
	clk := newClock()
	ca := openCA(t, t.TempDir(), clk)
	tests := []struct {
		name    string
		req     Request
		wantErr string
		check   func(t *testing.T, c *x509.Certificate)
	}{
		{name: "server with IPs and names", req: Request{CommonName: "controlplane", Usage: ServerAuth,
			Hosts: []string{"127.0.0.1", "::1", "localhost", "cp.rack.example"}},
			check: func(t *testing.T, c *x509.Certificate) {
				if len(c.IPAddresses) != 2 || len(c.DNSNames) != 2 || c.DNSNames[1] != "cp.rack.example" {
					t.Fatalf("SANs %v %v", c.IPAddresses, c.DNSNames)
				}
				if len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
					t.Fatalf("EKU %v", c.ExtKeyUsage)
				}
				if c.NotAfter.Sub(clk.Now()) != DefaultLifetime {
					t.Fatalf("lifetime %v", c.NotAfter.Sub(clk.Now()))
				}
			}},
		{name: "client", req: Request{CommonName: "tenant-a", Usage: ClientAuth, Lifetime: time.Hour},
			check: func(t *testing.T, c *x509.Certificate) {
				if len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth || c.IsCA {
					t.Fatalf("EKU %v CA %v", c.ExtKeyUsage, c.IsCA)
				}
				if c.NotAfter.Sub(clk.Now()) != time.Hour || clk.Now().Sub(c.NotBefore) != backdate {
					t.Fatalf("validity %v .. %v", c.NotBefore, c.NotAfter)
				}
			}},
		{name: "both usages", req: Request{CommonName: "node-1", Usage: ServerAuth | ClientAuth, Hosts: []string{"10.0.0.7"}},
			check: func(t *testing.T, c *x509.Certificate) {
				if len(c.ExtKeyUsage) != 2 {
					t.Fatalf("EKU %v", c.ExtKeyUsage)
				}
			}},
		{name: "lifetime capped at the CA's", req: Request{CommonName: "x", Usage: ClientAuth, Lifetime: 100 * 365 * 24 * time.Hour},
			check: func(t *testing.T, c *x509.Certificate) {
				if !c.NotAfter.Equal(ca.Certificate().NotAfter) {
					t.Fatalf("NotAfter %v, CA %v", c.NotAfter, ca.Certificate().NotAfter)
				}
			}},
		{name: "no name", req: Request{Usage: ClientAuth}, wantErr: "no common name"},
		{name: "no usage", req: Request{CommonName: "x"}, wantErr: "usage"},
		{name: "server without hosts", req: Request{CommonName: "x", Usage: ServerAuth}, wantErr: "at least one host"},
		{name: "bad host", req: Request{CommonName: "x", Usage: ServerAuth, Hosts: []string{"http://x"}}, wantErr: "bad host name"},
		{name: "negative lifetime", req: Request{CommonName: "x", Usage: ClientAuth, Lifetime: -time.Second}, wantErr: "negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			iss, err := ca.Issue(tc.req)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := ca.Verify(iss.Cert, tc.req.Usage); err != nil {
				t.Fatal(err)
			}
			if _, err := iss.TLSCertificate(); err != nil {
				t.Fatal(err)
			}
			if iss.Cert.Subject.CommonName != tc.req.CommonName || iss.Cert.SerialNumber.BitLen() < 64 {
				t.Fatalf("subject %q serial %v", iss.Cert.Subject.CommonName, iss.Cert.SerialNumber)
			}
			tc.check(t, iss.Cert)
		})
	}
}

func TestExpiry(t *testing.T) {
	clk := newClock()
	ca := openCA(t, t.TempDir(), clk)
	iss, err := ca.Issue(Request{CommonName: "n", Usage: ClientAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		advance time.Duration
		ok      bool
	}{{0, true}, {59 * time.Minute, true}, {2 * time.Minute, false}}
	for _, s := range steps {
		clk.Add(s.advance)
		err := ca.Verify(iss.Cert, ClientAuth)
		if (err == nil) != s.ok {
			t.Fatalf("at %v: Verify %v, want ok=%v", clk.Now(), err, s.ok)
		}
		if !s.ok && !strings.Contains(err.Error(), "expired") {
			t.Fatalf("expired certificate: %v", err)
		}
	}
	// A CA past its own expiry issues nothing.
	clk.Add(DefaultCALifetime)
	if _, err := ca.Issue(Request{CommonName: "n", Usage: ClientAuth}); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("issue from an expired CA: %v", err)
	}
}

// handshake runs a TLS handshake over loopback and returns both sides'
// errors.
func handshake(t *testing.T, server, client *tls.Config) (serr, cerr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		tc := tls.Server(c, server)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		err = tc.Handshake()
		if err == nil {
			// TLS 1.3 client certificates are checked after the
			// client's handshake returns: read to see the outcome.
			_, err = tc.Read(make([]byte, 1))
		}
		done <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := tls.Dialer{Config: client}
	c, cerr := d.DialContext(ctx, "tcp", ln.Addr().String())
	if cerr == nil {
		_, cerr = c.Write([]byte{1})
		if cerr == nil {
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, cerr = c.Read(make([]byte, 1)) // EOF when the server is happy
			if errors.Is(cerr, io.EOF) {
				cerr = nil
			}
		}
		c.Close()
	}
	serr = <-done
	return serr, cerr
}

func TestHandshakes(t *testing.T) {
	clk := newClock()
	ca := openCA(t, t.TempDir(), clk)
	other := openCA(t, t.TempDir(), clk)
	scfg, err := ca.ServerConfig("controlplane", []string{"127.0.0.1"}, tls.RequireAndVerifyClientCert, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clientCert := func(from *CA, life time.Duration) *tls.Certificate {
		iss, err := from.Issue(Request{CommonName: "node-1", Usage: ClientAuth, Lifetime: life})
		if err != nil {
			t.Fatal(err)
		}
		c, err := iss.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	good := clientCert(ca, time.Hour)
	short := clientCert(ca, time.Minute)
	revoked := clientCert(ca, time.Hour)
	if err := ca.Revoke(revoked.Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		client  *tls.Config
		advance time.Duration
		wantErr string // in the server's or the client's error
	}{
		{name: "mutual", client: ca.ClientConfig(good)},
		{name: "no client certificate", client: ca.ClientConfig(nil), wantErr: "certificate"},
		// Go's client withholds a certificate the server's CA list does
		// not name.
		{name: "client of another CA", client: ca.ClientConfig(clientCert(other, time.Hour)), wantErr: "certificate required"},
		{name: "client of another CA, forced", client: forced(ca.ClientConfig(nil), clientCert(other, time.Hour)), wantErr: "unknown authority"},
		{name: "client trusts another CA", client: other.ClientConfig(good), wantErr: "unknown authority"},
		{name: "revoked client", client: ca.ClientConfig(revoked), wantErr: "revoked"},
		{name: "expired client", client: ca.ClientConfig(short), advance: 2 * time.Minute, wantErr: "expired"},
		// The server's certificate is renewed in memory: after 50 of its
		// 60 minutes, handshakes still succeed.
		{name: "server renewed", client: ca.ClientConfig(good), advance: 48 * time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk.Add(tc.advance)
			serr, cerr := handshake(t, scfg, tc.client)
			if tc.wantErr == "" {
				if serr != nil || cerr != nil {
					t.Fatalf("server %v, client %v", serr, cerr)
				}
				return
			}
			if serr == nil && cerr == nil {
				t.Fatal("handshake succeeded")
			}
			msg := ""
			if serr != nil {
				msg += serr.Error()
			}
			if cerr != nil {
				msg += " / " + cerr.Error()
			}
			if !strings.Contains(msg, tc.wantErr) {
				t.Fatalf("errors %q, want %q", msg, tc.wantErr)
			}
		})
	}
}

// forced makes a client present cert whatever CAs the server names.
func forced(c *tls.Config, cert *tls.Certificate) *tls.Config {
	c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	return c
}

func TestRevocationPersisted(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	ca := openCA(t, dir, clk)
	var serials []*big.Int
	for range 3 {
		iss, err := ca.Issue(Request{CommonName: "n", Usage: ClientAuth})
		if err != nil {
			t.Fatal(err)
		}
		serials = append(serials, iss.Cert.SerialNumber)
	}
	// A second process sharing the directory revokes one; the first
	// revokes another without losing it.
	second := openCA(t, dir, clk)
	if err := second.Revoke(serials[0]); err != nil {
		t.Fatal(err)
	}
	if err := ca.Revoke(serials[1]); err != nil {
		t.Fatal(err)
	}
	if err := ca.Revoke(serials[1]); err != nil {
		t.Fatalf("revoking twice: %v", err)
	}
	if err := second.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*CA{ca, second, openCA(t, dir, clk)} {
		if !c.Revoked(serials[0]) || !c.Revoked(serials[1]) || c.Revoked(serials[2]) {
			t.Fatalf("revoked: %v %v %v", c.Revoked(serials[0]), c.Revoked(serials[1]), c.Revoked(serials[2]))
		}
	}
	// The CRL on disk is signed by the CA and lists both.
	blk, _ := pem.Decode(ca.CRLPEM())
	crl, err := x509.ParseRevocationList(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := crl.CheckSignatureFrom(ca.Certificate()); err != nil {
		t.Fatal(err)
	}
	if len(crl.RevokedCertificateEntries) != 2 || crl.Number.Int64() < 3 {
		t.Fatalf("CRL: %d entries, number %v", len(crl.RevokedCertificateEntries), crl.Number)
	}
	// A CRL not signed by the CA is refused at load.
	forged := openCA(t, t.TempDir(), clk)
	os.WriteFile(filepath.Join(dir, CRLFile), forged.CRLPEM(), 0o644)
	if _, err := Open(dir, Options{Now: clk.Now}); err == nil || !strings.Contains(err.Error(), "not signed") {
		t.Fatalf("forged CRL: %v", err)
	}
}

func TestSignCSR(t *testing.T) {
	clk := newClock()
	ca := openCA(t, t.TempDir(), clk)
	req := Request{CommonName: "node-7", Usage: ServerAuth | ClientAuth, Hosts: []string{"10.0.0.7", "node7.rack"}, Lifetime: 6 * time.Hour}
	csrFor := func(cn string, hosts []string) []byte {
		c, _, err := NewCSR(cn, hosts)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	rsaCSR := func(bits int) []byte {
		k, err := rsa.GenerateKey(rand.Reader, bits)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-7"}}, k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	}
	p224CSR := func() []byte {
		k, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	}
	tampered := func() []byte {
		b := csrFor("node-7", nil)
		blk, _ := pem.Decode(b)
		blk.Bytes[len(blk.Bytes)-5] ^= 0xff
		return pem.EncodeToMemory(blk)
	}
	tests := []struct {
		name    string
		csr     []byte
		wantErr string
	}{
		{name: "names from the request", csr: csrFor("", nil)},
		{name: "matching names", csr: csrFor("node-7", []string{"node7.rack", "10.0.0.7"})},
		{name: "RSA 2048", csr: rsaCSR(2048)},
		{name: "another node's name", csr: csrFor("node-8", nil), wantErr: `CSR names "node-8"`},
		{name: "a host not allowed", csr: csrFor("node-7", []string{"controlplane"}), wantErr: "not allowed"},
		{name: "an address not allowed", csr: csrFor("node-7", []string{"10.0.0.8"}), wantErr: "not allowed"},
		{name: "tampered signature", csr: tampered(), wantErr: "signature"},
		{name: "weak RSA", csr: rsaCSR(1024), wantErr: "1024 bits"},
		{name: "P-224", csr: p224CSR(), wantErr: "curve"},
		{name: "not PEM", csr: []byte("hello"), wantErr: "no CERTIFICATE REQUEST"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			iss, err := ca.SignCSR(tc.csr, req)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := iss.Cert
			if c.Subject.CommonName != "node-7" || len(c.IPAddresses) != 1 || len(c.DNSNames) != 1 || iss.KeyPEM != nil {
				t.Fatalf("cert %q %v %v", c.Subject.CommonName, c.IPAddresses, c.DNSNames)
			}
			if c.NotAfter.Sub(clk.Now()) != 6*time.Hour {
				t.Fatalf("lifetime %v", c.NotAfter.Sub(clk.Now()))
			}
			if err := ca.Verify(c, ServerAuth|ClientAuth); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRotate(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	ca := openCA(t, dir, clk)
	old, err := ca.Issue(Request{CommonName: "n", Usage: ClientAuth, Lifetime: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Revoke(old.Cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	keep, _ := ca.Issue(Request{CommonName: "m", Usage: ClientAuth, Lifetime: 24 * time.Hour})
	oldCA := ca.Certificate()
	if err := ca.Rotate(); err != nil {
		t.Fatal(err)
	}
	if ca.Certificate().Equal(oldCA) || ca.Certificate().Subject.CommonName == oldCA.Subject.CommonName {
		t.Fatal("Rotate kept the CA certificate or its name")
	}
	fresh, _ := ca.Issue(Request{CommonName: "m", Usage: ClientAuth})
	re := openCA(t, dir, clk) // what another process sees
	for _, c := range []*CA{ca, re} {
		if err := c.Verify(keep.Cert, ClientAuth); err != nil {
			t.Fatalf("a certificate of the old CA after Rotate: %v", err)
		}
		if err := c.Verify(fresh.Cert, ClientAuth); err != nil {
			t.Fatal(err)
		}
		if !c.Revoked(old.Cert.SerialNumber) {
			t.Fatal("revocation lost by Rotate")
		}
	}
	if certs, _ := ReadCerts(filepath.Join(dir, CACertFile)); len(certs) != 2 {
		t.Fatalf("ca-cert.pem holds %d certificates after Rotate", len(certs))
	}
	if err := ca.DropOld(); err != nil {
		t.Fatal(err)
	}
	if err := ca.Verify(keep.Cert, ClientAuth); err == nil {
		t.Fatal("old CA still trusted after DropOld")
	}
	if err := openCA(t, dir, clk).Verify(fresh.Cert, ClientAuth); err != nil {
		t.Fatal(err)
	}
}

// TestOpenSSLAccepts has OpenSSL (curl's library) verify issued
// certificates and the CRL; GnuTLS (libnbd, qemu) is exercised by the NBD
// interop tests.
func TestOpenSSLAccepts(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl not installed")
	}
	ca := openCA(t, t.TempDir(), &clock{t: time.Now()})
	dir := t.TempDir()
	srv, err := ca.Issue(Request{CommonName: "controlplane", Usage: ServerAuth, Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	bad, _ := ca.Issue(Request{CommonName: "gone", Usage: ClientAuth})
	if err := ca.Revoke(bad.Cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if err := WriteFiles(dir, "server", ca.CertPEM(), srv.CertPEM, srv.KeyPEM); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(dir, ServerKeyFile)); st.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v", st.Mode().Perm())
	}
	os.WriteFile(filepath.Join(dir, "bad.pem"), bad.CertPEM, 0o644)
	out, err := exec.Command("openssl", "verify", "-purpose", "sslserver", "-verify_ip", "127.0.0.1",
		"-CAfile", ca.CertFile(), filepath.Join(dir, ServerCertFile)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), ": OK") {
		t.Fatalf("openssl verify: %v\n%s", err, out)
	}
	out, err = exec.Command("openssl", "verify", "-crl_check", "-CRLfile", filepath.Join(ca.Dir(), CRLFile),
		"-CAfile", ca.CertFile(), filepath.Join(dir, "bad.pem")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "revoked") {
		t.Fatalf("openssl verify of a revoked certificate: %v\n%s", err, out)
	}
	out, err = exec.Command("openssl", "verify", "-crl_check", "-CRLfile", filepath.Join(ca.Dir(), CRLFile),
		"-CAfile", ca.CertFile(), filepath.Join(dir, ServerCertFile)).CombinedOutput()
	if err != nil {
		t.Fatalf("openssl verify with the CRL: %v\n%s", err, out)
	}
}

// TestRunningCAFollowsARotation: `rialto ca rotate` run while control
// planes share the directory re-signs ca-crl.pem with the new key. A
// running process (which signs with the old key until it restarts) still
// reads the list, revokes and verifies the new CA's certificates: it
// trusts what the directory's ca-cert.pem now holds beside its own
// signing certificate. It refused the list ("not signed by the CA")
// until restarted: a node removed through another replica meanwhile kept
// its certificates there. A directory whose ca-cert.pem no longer holds
// the process's signing certificate (a new CA) is still refused, saying
// to restart.
func TestRunningCAFollowsARotation(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	running := openCA(t, dir, clk)
	oldSigner := running.Certificate()
	gone, err := running.Issue(Request{CommonName: "gone", Usage: ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	rot := openCA(t, dir, clk) // rialto ca rotate, another process
	if err := rot.Rotate(); err != nil {
		t.Fatal(err)
	}
	fresh, err := rot.Issue(Request{CommonName: "fresh", Usage: ClientAuth}) // a restarted replica's
	if err != nil {
		t.Fatal(err)
	}
	if _, err := running.ReloadIfChanged(); err != nil {
		t.Fatalf("re-reading the list a rotation signed: %v", err)
	}
	if err := running.Verify(fresh.Cert, ClientAuth); err != nil {
		t.Fatalf("a certificate of the rotated CA: %v", err)
	}
	if !running.Certificate().Equal(oldSigner) {
		t.Fatal("the running CA took the new signing key before its restart")
	}
	if err := running.Revoke(gone.Cert.SerialNumber); err != nil {
		t.Fatalf("revoking after a rotation: %v", err)
	}
	// A restarted process (the new signer) reads what the running one wrote.
	if again := openCA(t, dir, clk); !again.Revoked(gone.Cert.SerialNumber) || !again.Certificate().Equal(rot.Certificate()) {
		t.Fatal("the revocation by the running process is not in the directory")
	}
	// A new CA in the directory (moved away, created anew) is not this one.
	other := t.TempDir()
	if _, err := Open(other, Options{Now: clk.Now}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{CACertFile, CAKeyFile, CRLFile} {
		b, err := os.ReadFile(filepath.Join(other, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err = running.ReloadIfChanged()
	if err == nil || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("a new CA's list: %v, want an error saying to restart", err)
	}
	if !running.Revoked(gone.Cert.SerialNumber) {
		t.Fatal("the list held was dropped")
	}
}

// TestDropOldResignsTheList: a revocation list signed with the old key
// (by a control plane still running on it after the rotation, which
// keeps signing with its key until restarted) is signed anew by
// `rialto ca drop-old`, so that the directory, trusting only the new CA,
// still opens and keeps the list. DropOld rewrote the certificates only:
// the next start refused the directory ("not signed by the CA").
func TestDropOldResignsTheList(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	running := openCA(t, dir, clk)
	gone, err := running.Issue(Request{CommonName: "gone", Usage: ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	if err := openCA(t, dir, clk).Rotate(); err != nil {
		t.Fatal(err)
	}
	if err := running.Revoke(gone.Cert.SerialNumber); err != nil { // signed with the old key
		t.Fatal(err)
	}
	num := openCA(t, dir, clk).CRLNumber()
	if err := openCA(t, dir, clk).DropOld(); err != nil {
		t.Fatal(err)
	}
	again, err := Open(dir, Options{Now: clk.Now})
	if err != nil {
		t.Fatalf("the directory after drop-old: %v", err)
	}
	if !again.Revoked(gone.Cert.SerialNumber) || again.CRLNumber().Cmp(num) <= 0 {
		t.Fatalf("the list after drop-old: revoked %v, number %v (was %v)", again.Revoked(gone.Cert.SerialNumber), again.CRLNumber(), num)
	}
}

// TestServerConfigFollowsARotation: a server configuration made before
// `rialto ca rotate` (a replica that was not restarted) accepts client
// certificates of the new CA once its CA followed the rotation (the
// sweep's ReloadIfChanged): a replica restarted first issues those to
// agents, which present them to every replica. Its ClientCAs were fixed
// when it was made: the handshake refused them.
func TestServerConfigFollowsARotation(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	running := openCA(t, dir, clk)
	scfg, err := running.ServerConfig("controlplane", []string{"127.0.0.1"}, tls.VerifyClientCertIfGiven, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rot := openCA(t, dir, clk)
	if err := rot.Rotate(); err != nil {
		t.Fatal(err)
	}
	iss, err := rot.Issue(Request{CommonName: "node-1", Usage: ClientAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := running.ReloadIfChanged(); err != nil {
		t.Fatal(err)
	}
	serr, cerr := handshake(t, scfg, forced(running.ClientConfig(nil), &fresh))
	if serr != nil || cerr != nil {
		t.Fatalf("a client certificate of the rotated CA: server %v, client %v", serr, cerr)
	}
	// Still refused: one of another CA.
	other := openCA(t, t.TempDir(), clk)
	iss, err = other.Issue(Request{CommonName: "node-2", Usage: ClientAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if serr, cerr := handshake(t, scfg, forced(running.ClientConfig(nil), &foreign)); serr == nil && cerr == nil {
		t.Fatal("a client certificate of another CA was accepted")
	}
}
