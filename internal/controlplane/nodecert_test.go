package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestTLSLenderRetriesInternalErrorAlert: a call whose handshake the agent
// answers with an internal_error alert (it had no certificate at hand
// yet) reached no agent handler, and the lender makes it again, a few
// times; a call that reached the agent is never made twice, and other
// handshake failures are not retried.
func TestTLSLenderRetriesInternalErrorAlert(t *testing.T) {
	t.Parallel()
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.Issue(pki.Request{CommonName: "node-a", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth | pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	lender, err := NewTLSLender(ca)
	if err != nil {
		t.Fatal(err)
	}
	// agent serves the agent API over TLS; its first failFirst handshakes
	// have no certificate. hang: the handler drops the connection without
	// an answer.
	type agent struct {
		url                  string
		handshakes, requests atomic.Int32
	}
	serve := func(failFirst int32, hang bool) *agent {
		a := &agent{}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			a.requests.Add(1)
			if hang {
				c, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					c.Close()
				}
				return
			}
			w.Write([]byte(`{"uri":"nbd://x/y"}`))
		}), ErrorLog: log.New(io.Discard, "", 0)}
		srv.TLSConfig = &tls.Config{
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				if a.handshakes.Add(1) <= failFirst {
					return nil, errors.New("no certificate yet")
				}
				return &cert, nil
			},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(),
		}
		go srv.ServeTLS(ln, "", "")
		t.Cleanup(func() { srv.Close() })
		a.url = "https://" + ln.Addr().String()
		return a
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prepare := func(a *agent) error {
		_, err := lender.Prepare(ctx, api.Node{ID: "node-a", AgentURL: a.url}, "rak_secret", api.PrepareRequest{LeaseID: "l1"})
		return err
	}
	for _, tc := range []struct {
		name                 string
		failFirst            int32
		hang                 bool
		wantErr              string // "": success
		handshakes, requests int32
	}{
		{"a certificate at once", 0, false, "", 1, 1},
		{"a certificate at the third handshake", 2, false, "", 3, 1},
		{"never a certificate", 1 << 30, false, "tls: internal error", handshakeRetries, 0},
		{"the call reached the agent", 0, true, "EOF", 1, 1},
	} {
		a := serve(tc.failFirst, tc.hang)
		err := prepare(a)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.wantErr)
		}
		if h, r := a.handshakes.Load(), a.requests.Load(); h != tc.handshakes || r != tc.requests {
			t.Errorf("%s: %d handshakes, %d requests; want %d, %d", tc.name, h, r, tc.handshakes, tc.requests)
		}
	}

	// An agent that presents another node's certificate is refused by
	// the lender's own check: not retried.
	other := serve(0, false)
	if _, err := lender.Prepare(ctx, api.Node{ID: "node-b", AgentURL: other.url}, "rak_secret", api.PrepareRequest{LeaseID: "l1"}); err == nil || !strings.Contains(err.Error(), `node "node-a"`) {
		t.Errorf("another node's certificate: %v", err)
	}
	if h, r := other.handshakes.Load(), other.requests.Load(); h != 1 || r != 0 {
		t.Errorf("another node's certificate: %d handshakes, %d requests; want 1, 0", h, r)
	}
}

// TestTLSLenderTeardownRemoved: the teardowns a node's removal sends its
// agent (TeardownRemoved) accept the certificate the removal revoked,
// which the agent still presents, and no other revoked one: not one
// revoked before (a machine the node was taken over from, say), nor
// another node's. Any other call refuses it before a byte of the request
// (and its agent key) is sent.
func TestTLSLenderTeardownRemoved(t *testing.T) {
	t.Parallel()
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	issue := func() *pki.Issued {
		t.Helper()
		iss, err := ca.Issue(pki.Request{CommonName: "node-a", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth | pki.ClientAuth})
		if err != nil {
			t.Fatal(err)
		}
		if err := ca.Revoke(iss.Cert.SerialNumber); err != nil {
			t.Fatal(err)
		}
		return iss
	}
	earlier, current := issue(), issue()
	cert, err := current.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	lender, err := NewTLSLender(ca)
	if err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int32
	var auth atomic.Value
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		auth.Store(r.Header.Get("Authorization"))
		w.Write([]byte(`{}`))
	}), ErrorLog: log.New(io.Discard, "", 0)}
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node := api.Node{ID: "node-a", AgentURL: "https://" + ln.Addr().String()}
	req := api.TeardownRequest{LeaseID: "l1"}

	if err := lender.Teardown(ctx, node, "rak_secret", req); !errors.Is(err, pki.ErrRevoked) {
		t.Errorf("a teardown of a revoked node: %v", err)
	}
	if err := lender.TeardownRemoved(ctx, node, "rak_secret", []*big.Int{earlier.Cert.SerialNumber}, req); !errors.Is(err, pki.ErrRevoked) {
		t.Errorf("a removal's teardown, the agent presenting a certificate revoked before: %v", err)
	}
	other := node
	other.ID = "node-b"
	if err := lender.TeardownRemoved(ctx, other, "rak_secret", []*big.Int{current.Cert.SerialNumber}, req); err == nil || !strings.Contains(err.Error(), `node "node-a"`) {
		t.Errorf("a removal's teardown, the agent presenting another node's certificate: %v", err)
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("%d requests reached an agent whose certificate was refused", n)
	}
	if err := lender.TeardownRemoved(ctx, node, "rak_secret", []*big.Int{current.Cert.SerialNumber}, req); err != nil {
		t.Fatalf("a removal's teardown, the agent presenting the certificate the removal revoked: %v", err)
	}
	if n, a := requests.Load(), auth.Load(); n != 1 || a != "Bearer rak_secret" {
		t.Fatalf("%d requests (authorization %q)", n, a)
	}
}

// TestAPIKeepsHTTP2AfterARotation: the API served as `rialto server`
// serves it (net/http's ServeTLS with APIServerTLS) speaks HTTP/2 to a
// new connection once its CA followed a `rialto ca rotate` of its
// directory, as before it, and accepts a client certificate of the new
// CA there. The configuration such a handshake takes (GetConfigForClient,
// a copy of APIServerTLS's) names h2 and http/1.1 itself, whatever the
// server did to the configuration it was given. Before, it named them
// only because ServeTLS had added them to that configuration (HTTP/2
// was kept, as this test's first part shows, but on net/http's way, not
// its promise); a configuration no ServeTLS had been given named none.
func TestAPIKeepsHTTP2AfterARotation(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newCASQLite(ctx, t, Config{})
	cfg, err := APIServerTLS(r.ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: r.srv.Handler(), TLSConfig: cfg, ErrorLog: log.New(io.Discard, "", 0)}
	served := make(chan error, 1)
	go func() { served <- hs.ServeTLS(ln, "", "") }()
	defer func() {
		hs.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("ServeTLS: %v", err)
		}
	}()
	// A new connection each time, with a client certificate (nil: none).
	get := func(roots []byte, cert *tls.Certificate) (proto, alpn string) {
		t.Helper()
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(roots) {
			t.Fatal("no CA certificate")
		}
		tc := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", NextProtos: []string{"h2", "http/1.1"}}
		if cert != nil {
			tc.Certificates = []tls.Certificate{*cert}
		}
		conn, err := tls.Dial("tcp", ln.Addr().String(), tc)
		if err != nil {
			t.Fatal(err)
		}
		alpn = conn.ConnectionState().NegotiatedProtocol
		conn.Close()
		tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Get("https://" + ln.Addr().String() + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.Proto, alpn
	}
	if proto, alpn := get(r.ca.CertPEM(), nil); proto != "HTTP/2.0" || alpn != "h2" {
		t.Fatalf("before the rotation: %s (ALPN %q), want HTTP/2.0 (h2)", proto, alpn)
	}
	// A configuration made before the rotation that no server was given.
	unserved, err := APIServerTLS(r.ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	rot, err := pki.Load(r.ca.Dir(), pki.Options{}) // rialto ca rotate
	if err != nil {
		t.Fatal(err)
	}
	if err := rot.Rotate(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.srv.syncCRL(ctx); err != nil { // as a sweep does
		t.Fatal(err)
	}
	iss, err := rot.Issue(pki.Request{CommonName: "n-1", Usage: pki.ClientAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if proto, alpn := get(rot.CertPEM(), &fresh); proto != "HTTP/2.0" || alpn != "h2" {
		t.Fatalf("after the rotation, with a certificate of the new CA: %s (ALPN %q), want HTTP/2.0 (h2)", proto, alpn)
	}
	hc, err := unserved.GetConfigForClient(&tls.ClientHelloInfo{})
	if err != nil || hc == nil || !slices.Equal(hc.NextProtos, []string{"h2", "http/1.1"}) {
		t.Fatalf("the configuration of a handshake after the rotation: %v, want one naming h2 and http/1.1", err)
	}
}
