package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/pki"
)

// msgRecorder is a slog handler that keeps the messages logged.
type msgRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *msgRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *msgRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *msgRecorder) WithGroup(string) slog.Handler            { return l }
func (l *msgRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}

// count is how many messages containing s were logged.
func (l *msgRecorder) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

// TestServingWaitsForCertificate: the agent's TLS servers never answer a
// handshake with an internal_error alert for a certificate about to
// come: with none yet, or an expired one, the handshake waits for the
// next (and presents it); one still waiting when its context ends (the
// agent stops) fails.
func TestServingWaitsForCertificate(t *testing.T) {
	t.Parallel()
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	past, err := pki.Load(ca.Dir(), pki.Options{Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CSR(key, "", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	sign := func(from *pki.CA) []byte {
		iss, err := from.SignCSR(csr, pki.Request{CommonName: "node-a", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth | pki.ClientAuth, Lifetime: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return iss.CertPEM
	}
	expired, fresh := sign(past), sign(ca)
	freshCerts, err := pki.ParseCerts(fresh)
	if err != nil {
		t.Fatal(err)
	}

	const waiting = "waits for the node certificate"
	for _, tc := range []struct {
		name string
		held []byte // the certificate held when the handshake starts
		stop bool   // the server's context ends instead of a certificate coming
	}{
		{name: "none yet", held: nil},
		{name: "an expired one", held: expired},
		{name: "none, and the agent stops", stop: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &msgRecorder{}
			nt := &nodeTLS{crl: pki.NewCRL([]*x509.Certificate{ca.Certificate()}), key: key,
				log: slog.New(logs), changed: make(chan struct{})}
			nt.roots.Store(newTrust([]*x509.Certificate{ca.Certificate()}))
			if tc.held != nil {
				if err := nt.setCert(tc.held); err != nil {
					t.Fatal(err)
				}
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			sctx, stop := context.WithCancel(context.Background())
			defer stop()
			served := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					served <- err
					return
				}
				defer c.Close()
				sc := tls.Server(c, nt.serverTLS())
				err = sc.HandshakeContext(sctx)
				if err == nil {
					_, err = sc.Write([]byte("x")) // the client reads it before closing
				}
				served <- err
			}()
			type result struct {
				notAfter time.Time
				err      error
			}
			dialed := make(chan result, 1)
			go func() {
				c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
				if err != nil {
					dialed <- result{err: err}
					return
				}
				defer c.Close()
				c.Read(make([]byte, 1))
				dialed <- result{notAfter: c.ConnectionState().PeerCertificates[0].NotAfter}
			}()
			deadline := time.Now().Add(20 * time.Second)
			for logs.count(waiting) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the handshake did not wait for a certificate")
				}
				select {
				case r := <-dialed:
					t.Fatalf("the handshake ended before a certificate came: %v, %v", r.notAfter, r.err)
				case <-time.After(5 * time.Millisecond): // poll
				}
			}
			if tc.stop {
				stop()
			} else if err := nt.setCert(fresh); err != nil {
				t.Fatal(err)
			}
			r := <-dialed
			if tc.stop {
				if r.err == nil {
					t.Fatal("a handshake without a certificate succeeded")
				}
				if err := <-served; err == nil {
					t.Fatal("the server's handshake succeeded without a certificate")
				}
				return
			}
			if r.err != nil {
				t.Fatalf("handshake: %v", r.err)
			}
			if !r.notAfter.Equal(freshCerts[0].NotAfter) {
				t.Fatalf("presented a certificate valid until %v, want the new one (%v)", r.notAfter, freshCerts[0].NotAfter)
			}
			if err := <-served; err != nil {
				t.Fatalf("server: %v", err)
			}
		})
	}
}

// TestNodeKeyReadableByOthersRefused: a node key restored without its
// mode (cp without -p, a tar extracted under umask 022) let every user
// of the lender present the node's certificate. The agent refuses it and
// names the chmod; at 0600 the same key is used.
func TestNodeKeyReadableByOthersRefused(t *testing.T) {
	t.Parallel()
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	caFile := ca.CertFile()
	_, keyPEM, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	keyPath := filepath.Join(state, nodeKeyFile)
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(keyPath, 0o644); err != nil {
		t.Fatal(err)
	}
	a := &Agent{cfg: Config{CAFile: caFile, StateDir: state}, log: slog.New(&msgRecorder{})}
	if err := a.setupTLS(); err == nil || !strings.Contains(err.Error(), "chmod 600 "+keyPath) {
		t.Fatalf("a node key of mode 0644: %v, want a refusal naming chmod 600", err)
	}
	if err := os.Chmod(keyPath, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.setupTLS(); err != nil || a.tls == nil {
		t.Fatalf("the same key at 0600: %v", err)
	}
}

// TestCACertificatesFromTheControlPlane: the CA certificates of a
// control plane's answer (useCA) replace those in use, are kept in the
// state dir (0644) and used at the next start while the --cacert file
// holds what it held when they came; an operator's new --cacert file wins
// over them. A bundle with a certificate that is not a CA's (a node's,
// which would make every holder of that key a trusted server) is refused.
func TestCACertificatesFromTheControlPlane(t *testing.T) {
	t.Parallel()
	caDir := t.TempDir()
	ca, err := pki.Open(caDir, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "carotate-ca-cert.pem")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	start := func() *Agent {
		t.Helper()
		a := &Agent{cfg: Config{CAFile: caFile, StateDir: state}, log: slog.New(&msgRecorder{})}
		if err := a.setupTLS(); err != nil {
			t.Fatal(err)
		}
		return a
	}
	a := start()
	before := a.caHash()
	leaf, err := ca.Issue(pki.Request{CommonName: "node-x", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth})
	if err != nil {
		t.Fatal(err)
	}
	a.useCA(string(leaf.CertPEM) + string(ca.CertPEM()))
	if a.caHash() != before {
		t.Fatal("a bundle with a node's certificate was taken")
	}
	if _, err := os.Stat(filepath.Join(state, caCertFile)); err == nil {
		t.Fatal("a bundle with a node's certificate was kept")
	}

	if err := ca.Rotate(); err != nil {
		t.Fatal(err)
	}
	a.useCA(string(ca.CertPEM()))
	if a.caHash() != ca.CertHash() {
		t.Fatal("the rotated CA certificates are not in use")
	}
	if st, err := os.Stat(filepath.Join(state, caCertFile)); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("the kept CA certificates: %v (mode %v), want 0644", err, st.Mode().Perm())
	}
	// A node certificate of the new CA verifies (renewals after the
	// control plane's restart).
	iss, err := ca.SignCSR(mustCSR(t, a), pki.Request{CommonName: "node-a", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth | pki.ClientAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.useCert(string(iss.CertPEM)); err != nil {
		t.Fatalf("a node certificate of the rotated CA: %v", err)
	}

	if b := start(); b.caHash() != ca.CertHash() {
		t.Fatal("restarted with the same --cacert file, the agent does not use the kept CA certificates")
	}
	// The operator gives the agent another file: it wins.
	other, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile, other.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := start(); c.caHash() != other.CertHash() {
		t.Fatal("restarted with a new --cacert file, the agent does not use it")
	}
}

func mustCSR(t *testing.T, a *Agent) []byte {
	t.Helper()
	csr, err := a.csr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return []byte(csr)
}
