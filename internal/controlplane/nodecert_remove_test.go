package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestRenewalDuringRemovalIsRevoked: a node's certificate renewal that
// was authenticated (credential and certificate, over mutual TLS) before
// an admin removed the node, and signs after the removal, gives the
// removed node no certificate that works: the renewal is refused, or the
// certificate it got is on the revocation list. A compromised node
// renewing in a loop would otherwise come out of its removal with a fresh
// certificate for its identity and hosts.
func TestRenewalDuringRemovalIsRevoked(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newCASQLite(ctx, t, Config{})
	ca, srv := r.ca, r.srv
	base := serveTLS(t, srv, ca)

	client := func(cert *tls.Certificate) *http.Client {
		tc := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
		if cert != nil {
			tc.Certificates = []tls.Certificate{*cert}
		}
		// ExpectContinueTimeout: a request with Expect: 100-continue
		// sends its body only once the handler reads it.
		return &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ExpectContinueTimeout: time.Minute}}
	}
	anon := api.NewClient(base, "", client(nil))
	csr, keyPEM, err := pki.NewCSR("", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	j, err := anon.WithToken(bootTok).Join(ctx, joinN1(csr))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair([]byte(j.Certificate), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	node := client(&cert)

	// The renewal: headers now (authenticated, its certificate checked),
	// the body once the handler asks for it, after the removal.
	csr2, _, err := pki.NewCSR("", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(api.NodeCertificateRequest{CSR: string(csr2)})
	pr, pw := io.Pipe()
	reading := make(chan struct{})
	rctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got100Continue: func() { close(reading) }})
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, base+"/v1/nodes/"+j.NodeID+"/certificate", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+j.Credential)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Expect", "100-continue")
	type answer struct {
		resp *http.Response
		err  error
	}
	answered := make(chan answer, 1)
	go func() { // the test waits for it below
		resp, err := node.Do(req)
		answered <- answer{resp, err}
	}()
	select {
	case <-reading:
	case a := <-answered:
		t.Fatalf("the renewal was answered before it sent its body: %v", a.err)
	}
	if _, err := anon.WithToken(adminTok).RemoveNode(ctx, j.NodeID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(pw, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	a := <-answered
	if a.err != nil {
		t.Fatal(a.err)
	}
	defer a.resp.Body.Close()
	if a.resp.StatusCode != http.StatusOK {
		return // refused: nothing issued
	}
	var out api.NodeCertificateResponse
	if err := json.NewDecoder(a.resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ParseCerts([]byte(out.Certificate))
	if err != nil || len(certs) == 0 {
		t.Fatalf("certificate: %v", err)
	}
	if !ca.Revoked(certs[0].SerialNumber) {
		t.Fatalf("the removed node %s got certificate %s, not revoked (valid until %s)", j.NodeID, certs[0].SerialNumber.Text(16), certs[0].NotAfter)
	}
}
