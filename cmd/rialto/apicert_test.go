package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/pki"
)

// TestCLIRefusesNodeCertificate: the CLI sends its token only to a
// control plane. The cluster CA also issues nodes' certificates, for the
// hosts their joins declare — any machine holding the bootstrap token
// may declare the control plane's address —, so a server presenting one
// of those at the API's address is not the control plane, whatever its
// host name: the CLI refuses it before sending anything. It sent the
// tenant's token.
func TestCLIRefusesNodeCertificate(t *testing.T) {
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// What a join answers: common name the node's ID, the declared hosts.
	node, err := ca.Issue(pki.Request{CommonName: "node-rogue", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth | pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := node.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	rogue := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte("[]"))
	}))
	rogue.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	rogue.StartTLS()
	defer rogue.Close()

	const token = "cli-token-secret"
	vars := map[string]string{"RIALTO_ADDR": rogue.URL, "RIALTO_TOKEN": token, "RIALTO_CACERT": ca.CertFile()}
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string { return vars[k] }}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := run(ctx, []string{"nodes", "-o", "json"}, e)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) > 0 {
		t.Fatalf("the CLI sent its call to a node's certificate (exit %d), Authorization %q", code, seen)
	}
	if code == 0 || !strings.Contains(errb.String(), "not a control plane") {
		t.Fatalf("exit %d, %q: want a refusal that says the certificate is not a control plane's", code, errb.String())
	}
}
