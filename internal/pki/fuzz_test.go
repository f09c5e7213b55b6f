package pki

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzCheckCSR: a CSR comes from a node over the API (POST
// /v1/nodes/ID/certificate). CheckCSR never panics, every refusal wraps
// ErrBadRequest, and a CSR it accepts asks for nothing the request does
// not allow: the certificate the CA signs from it names the requester
// and only the request's hosts.
func FuzzCheckCSR(f *testing.F) {
	ca, err := Open(f.TempDir(), Options{})
	if err != nil {
		f.Fatal(err)
	}
	for _, c := range []struct {
		cn    string
		hosts []string
	}{{"node-1", []string{"10.0.0.1", "n1.example"}}, {"", []string{"N1.Example"}}, {"node-2", nil}, {"node-1", []string{"evil.example"}},
		{"node-1", []string{"::1"}}} {
		csr, _, err := NewCSR(c.cn, c.hosts)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(csr, "10.0.0.1,n1.example")
	}
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	if csr, err := CSR(edKey, "node-1", []string{"10.0.0.1"}); err == nil {
		f.Add(csr, "10.0.0.1")
	}
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nMAA=\n-----END CERTIFICATE REQUEST-----\n"), "")
	f.Add([]byte("junk"), "h")
	f.Fuzz(func(t *testing.T, csrPEM []byte, hosts string) {
		r := Request{CommonName: "node-1", Usage: ServerAuth | ClientAuth}
		for _, h := range strings.Split(hosts, ",") {
			if h != "" {
				r.Hosts = append(r.Hosts, h)
			}
		}
		csr, err := CheckCSR(csrPEM, r)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("refusal does not wrap ErrBadRequest: %v", err)
			}
			return
		}
		if csr.CheckSignature() != nil || len(csr.URIs) > 0 || len(csr.EmailAddresses) > 0 {
			t.Fatal("accepted a CSR with a bad signature, URIs or e-mail names")
		}
		iss, err := ca.SignCSR(csrPEM, r)
		if err != nil {
			t.Fatalf("CheckCSR accepted what SignCSR refuses: %v", err)
		}
		c := iss.Cert
		if c.Subject.CommonName != r.CommonName {
			t.Fatalf("signed a certificate for %q, not %q", c.Subject.CommonName, r.CommonName)
		}
		allowed := map[string]bool{}
		for _, h := range r.Hosts {
			allowed[canonHost(h)] = true
		}
		for _, h := range c.DNSNames {
			if !allowed[canonHost(h)] {
				t.Fatalf("signed host %q, not among %q", h, r.Hosts)
			}
		}
		for _, ip := range c.IPAddresses {
			if !allowed[ip.String()] {
				t.Fatalf("signed address %s, not among %q", ip, r.Hosts)
			}
		}
		if len(c.URIs) > 0 || len(c.EmailAddresses) > 0 {
			t.Fatal("signed URI or e-mail names")
		}
	})
}

// FuzzParseKeyAndCerts: keys and certificates are read from files an
// operator or another process writes (--tls-key, ca-cert.pem). Neither
// parser panics; ParseKey's refusals say they are about a key, and a key
// it accepts signs; ParseCerts returns at least one certificate or an
// error.
func FuzzParseKeyAndCerts(f *testing.F) {
	_, keyPEM, err := NewKey()
	if err != nil {
		f.Fatal(err)
	}
	ca, err := Open(f.TempDir(), Options{})
	if err != nil {
		f.Fatal(err)
	}
	iss, err := ca.Issue(Request{CommonName: "n", Hosts: []string{"127.0.0.1"}, Usage: ServerAuth})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(keyPEM)
	f.Add(iss.KeyPEM)
	f.Add(append(append([]byte(nil), iss.CertPEM...), ca.CertPEM()...))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nMAA=\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte("-----BEGIN RSA PRIVATE KEY-----\nMAA=\n-----END RSA PRIVATE KEY-----\n"))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseKey(b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "pki: key: ") {
				t.Fatalf("unclear refusal: %v", err)
			}
		} else if k == nil || k.Public() == nil {
			t.Fatal("accepted a key without a public half")
		} else if _, err := k.Sign(rand.Reader, make([]byte, 32), signerOpts(k)); err != nil {
			t.Fatalf("accepted a key that cannot sign: %v", err)
		}
		certs, err := ParseCerts(b)
		if err == nil && len(certs) == 0 {
			t.Fatal("no certificate and no error")
		}
		for _, c := range certs {
			if c == nil {
				t.Fatal("a nil certificate")
			}
		}
	})
}

// FuzzReadIndex: the CA's index of issued certificates (issued.txt) is a
// file the replicas sharing the CA directory append to, and what
// RevokeIssuedTo revokes by. readIndex never panics and skips only the
// lines that are not entries: every line of the form "SERIAL EXPIRY
// NAME" (hex, Unix seconds) that has not expired is returned, in order,
// however long the lines around it.
func FuzzReadIndex(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	f.Add([]byte("1f 1900000000 node-1\n2a 1700000000 node-2\nzz 1900000000 x\n3 1900000000 node 3 with spaces\r\n"))
	f.Add([]byte("1 1900000000 a\n" + strings.Repeat("x", 70000) + "\n2 1900000000 node-b\n"))
	f.Add([]byte("ff 99999999999999999999 a\n-1 1900000000 neg\n1 -5 b\n\n1 1900000000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, IndexFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		ca := &CA{dir: dir, now: func() time.Time { return now }}
		got, err := ca.readIndex()
		if err != nil {
			t.Fatalf("readIndex: %v", err)
		}
		var want []string
		for _, line := range bytes.Split(b, []byte("\n")) {
			fs := strings.SplitN(strings.TrimSuffix(string(line), "\r"), " ", 3)
			if len(fs) != 3 {
				continue
			}
			serial, ok := new(big.Int).SetString(fs[0], 16)
			sec, err := strconv.ParseInt(fs[1], 10, 64)
			if !ok || err != nil || !time.Unix(sec, 0).After(now) {
				continue
			}
			want = append(want, fmt.Sprintf("%s %d %s", serial.Text(16), sec, fs[2]))
		}
		var have []string
		for _, e := range got {
			have = append(have, fmt.Sprintf("%s %d %s", e.serial.Text(16), e.notAfter.Unix(), e.cn))
		}
		if !slices.Equal(have, want) {
			t.Fatalf("readIndex returned %d entries, the file holds %d: %.200q", len(have), len(want), have)
		}
	})
}

// signerOpts is what k.Sign takes for a 32-byte digest.
func signerOpts(k crypto.Signer) crypto.SignerOpts {
	if _, ok := k.Public().(ed25519.PublicKey); ok {
		return crypto.Hash(0)
	}
	return crypto.SHA256
}
