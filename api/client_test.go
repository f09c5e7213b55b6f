package api

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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
	"testing"
	"time"
)

// TestHTTPClientCA: a client given the server's CA verifies it; one
// trusting other CAs gets ErrUntrustedServer.
func TestHTTPClientCA(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`[]`))
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	srv.StartTLS()
	defer srv.Close()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca-cert.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	// Another CA: a self-signed certificate of its own (every httptest
	// server shares one).
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
	}{{"the server's CA", caFile, true}, {"the system's CAs", "", false}, {"another CA", otherFile, false}} {
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
