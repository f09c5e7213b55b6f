package networds

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"github.com/rialto-project/rialto/internal/pki"
	"math/big"
	"net"
	"testing"
	"time"
)

// authority is a CA of the test's.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newAuthority(t *testing.T) authority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return authority{cert, key, pool}
}

// issue is a certificate of ca's for localhost, valid from nb to na.
func (ca authority) issue(t *testing.T, nb, na time.Time) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, NotBefore: nb, NotAfter: na, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serve accepts connections on a loopback listener and hands each to h.
func serve(t *testing.T, h func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h(c)
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// TestDescribe: real connections' failures — a closed port, TLS
// handshakes with certificates of another CA, expired, not yet valid, for
// another name, a server that refuses the client's certificate, one that
// does not speak TLS — in words, without the address or x509's text.
func TestDescribe(t *testing.T) {
	ca, other := newAuthority(t), newAuthority(t)
	now := time.Now()
	good := ca.issue(t, now.Add(-time.Hour), now.Add(time.Hour))
	tlsServer := func(cert tls.Certificate, clientCAs *x509.CertPool) string {
		cfg := &tls.Config{Certificates: []tls.Certificate{cert}}
		if clientCAs != nil {
			cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, clientCAs
		}
		return serve(t, func(c net.Conn) {
			tc := tls.Server(c, cfg)
			_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
			_ = tc.Handshake()
		})
	}
	handshake := func(addr, name string, cfg *tls.Config) error {
		cfg.ServerName = name
		cfg.RootCAs = ca.pool
		c, err := (&tls.Dialer{Config: cfg}).DialContext(context.Background(), "tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		// TLS 1.3: a client's certificate is judged after the client's
		// handshake ends; the server's alert comes with the first read.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		return err
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	_, refused := net.Dial("tcp", closedAddr)
	for _, c := range []struct {
		name  string
		err   error
		kind  Kind
		words string
	}{
		{"closed port", fmt.Errorf("nbd: dial: %w", refused), Unreachable, "connection refused"},
		{"another CA", handshake(tlsServer(other.issue(t, now.Add(-time.Hour), now.Add(time.Hour)), nil), "localhost", &tls.Config{}),
			PeerCertificate, "signed by an unknown authority"},
		{"expired", handshake(tlsServer(ca.issue(t, now.Add(-2*time.Hour), now.Add(-time.Hour)), nil), "localhost", &tls.Config{}),
			PeerCertificate, "expired"},
		{"not valid yet", handshake(tlsServer(ca.issue(t, now.Add(time.Hour), now.Add(2*time.Hour)), nil), "localhost", &tls.Config{}),
			PeerCertificate, "not valid yet"},
		{"another name", handshake(tlsServer(good, nil), "n2.example", &tls.Config{}), PeerCertificate, "name mismatch: it is not for n2.example"},
		{"own certificate of another CA", handshake(tlsServer(good, ca.pool), "localhost",
			&tls.Config{Certificates: []tls.Certificate{other.issue(t, now.Add(-time.Hour), now.Add(time.Hour))}}),
			OwnCertificate, "signed by an unknown authority"},
		{"no own certificate", handshake(tlsServer(good, ca.pool), "localhost", &tls.Config{}), OwnCertificate, "none was presented"},
		{"not TLS", handshake(serve(t, func(c net.Conn) { _, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) }), "localhost", &tls.Config{}),
			NotTLS, "it does not speak TLS"},
		{"revoked", fmt.Errorf("nbd: connection ended: %w", pki.ErrRevoked), PeerCertificate, "revoked"},
		{"its CA dropped", fmt.Errorf("nbd: connection ended: %w", pki.ErrUntrusted), PeerCertificate, "its CA was dropped"},
		{"something else", fmt.Errorf("short read"), Other, ""},
	} {
		kind, words := Describe(c.err)
		if kind != c.kind || words != c.words {
			t.Errorf("%s: Describe(%v) = %d %q, want %d %q", c.name, c.err, kind, words, c.kind, c.words)
		}
	}
}
