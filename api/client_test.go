package api

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/pki"
)

// tlsServer serves HTTPS on 127.0.0.1 with a certificate of ca for
// commonName, recording the Authorization header of every request.
func tlsServer(t *testing.T, ca *pki.CA, commonName string) (srv *httptest.Server, seen func() []string) {
	t.Helper()
	iss, err := ca.Issue(pki.Request{CommonName: commonName, Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth | pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var auth []string
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Write([]byte(`[]`))
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), auth...)
	}
}

// TestHTTPClientCA: a client given the cluster CA verifies a control
// plane's certificate; one trusting other CAs gets ErrUntrustedServer.
func TestHTTPClientCA(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.Open(filepath.Join(dir, "tls"), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := tlsServer(t, ca, ControlPlaneServerCN)
	// Another CA: a self-signed certificate of its own.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "other CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	otherFile := filepath.Join(dir, "other.pem")
	os.WriteFile(otherFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name    string
		caFile  string
		trusted bool
	}{{"the cluster CA", ca.CertFile(), true}, {"the system's CAs", "", false}, {"another CA", otherFile, false}} {
		hc, err := HTTPClient(tc.caFile, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_, err = NewClient(srv.URL, "tok", hc).Nodes(ctx)
		if tc.trusted && err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !tc.trusted && !errors.Is(err, ErrUntrustedServer) {
			t.Fatalf("%s: %v, want ErrUntrustedServer", tc.name, err)
		}
	}
	if _, err := HTTPClient(filepath.Join(dir, "missing.pem"), time.Second); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
	os.WriteFile(filepath.Join(dir, "empty.pem"), []byte("not a certificate"), 0o644)
	if _, err := HTTPClient(filepath.Join(dir, "empty.pem"), time.Second); err == nil {
		t.Fatal("a file without certificates was accepted")
	}
}

// TestHTTPClientRefusesNodeCertificate: the cluster CA also issues nodes'
// certificates, for the hosts their joins declare (which may be the
// control plane's): a server presenting one of those at the API's address
// is not the control plane. A client of HTTPClient (or TLSConfig) with
// the cluster CA refuses it at the handshake, before it sends its token.
func TestHTTPClientRefusesNodeCertificate(t *testing.T) {
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rogue, seen := tlsServer(t, ca, "node-x")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	hc, err := HTTPClient(ca.CertFile(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewClient(rogue.URL, "rat_tenant-secret", hc).Nodes(ctx)
	if got := seen(); len(got) != 0 {
		t.Fatalf("the client sent its call to a node's certificate: Authorization %q", got)
	}
	if !errors.Is(err, ErrNotControlPlane) {
		t.Fatalf("%v, want ErrNotControlPlane", err)
	}

	cfg, err := TLSConfig(ca.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", rogue.Listener.Addr().String(), cfg)
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, ErrNotControlPlane) {
		t.Fatalf("TLSConfig's handshake with a node's certificate: %v, want ErrNotControlPlane", err)
	}
}

// TestErrorWithoutAPIBody: an error answer whose body is not the API's
// (a proxy's, Go's HTTPS server answering plain HTTP, a plain 404) gets
// the code the API gives its status, not internal, which is the API's
// code for a failure of the server, and keeps the body as the message.
func TestErrorWithoutAPIBody(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		status int
		body   string
		code   string
	}{
		{400, "Client sent an HTTP request to an HTTPS server.\n", CodeInvalid},
		{401, "no", CodeUnauthorized},
		{403, "Forbidden", CodeForbidden},
		{404, "404 page not found\n", CodeNotFound},
		{405, "Method Not Allowed", CodeInvalid},
		{409, "busy", CodeConflict},
		{410, "pruned", CodeGone},
		{413, "Request Entity Too Large", CodeInvalid},
		{422, "nowhere", CodeInfeasible},
		{429, "slow down", CodeQuota},
		{500, "oops", CodeInternal},
		{502, "<html>Bad Gateway</html>", CodeInternal},
		{503, "Service Unavailable", CodeUnavailable},
		{504, "Gateway Timeout", CodeInternal},
		// The API's own body keeps its code, whatever the status.
		{400, `{"error":{"code":"conflict","message":"m"}}`, CodeConflict},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			io.WriteString(w, tc.body)
		}))
		c := NewClient(srv.URL, "t", nil)
		_, err := c.Nodes(ctx)
		var ae *Error
		if !errors.As(err, &ae) || ae.Status != tc.status || ae.Code != tc.code {
			t.Errorf("%d %q: %v; want code %s", tc.status, tc.body, err, tc.code)
		} else if want := strings.TrimSpace(tc.body); !strings.HasPrefix(want, "{") && (ae.Message != want || !ae.Plain || IsCode(err, tc.code)) {
			// Plain: another server's answer says nothing of the
			// API's objects (a proxy's 404 is not a lease gone).
			t.Errorf("%d %q: message %q, plain %v, IsCode %v; want the body, plain, not the API's code", tc.status, tc.body, ae.Message, ae.Plain, IsCode(err, tc.code))
		} else if strings.HasPrefix(want, "{") && (ae.Plain || !IsCode(err, tc.code)) {
			t.Errorf("%d %q: the API's answer is plain %v, IsCode %v", tc.status, tc.body, ae.Plain, IsCode(err, tc.code))
		}
		// The event stream's refusal reads the same (it retries a 5xx).
		if tc.status >= 500 {
			srv.Close()
			continue
		}
		err = c.FollowEvents(ctx, 0, FollowOptions{}, func(Event) error { return nil })
		if !errors.As(err, &ae) || ae.Status != tc.status || ae.Code != tc.code {
			t.Errorf("%d %q: follow events: %v; want code %s", tc.status, tc.body, err, tc.code)
		}
		srv.Close()
	}
}
