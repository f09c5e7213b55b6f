package controlplane

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestLenderConnectionFailuresReadPlainly: a call to a lender whose
// certificate is not accepted (signed by a CA the control plane does not
// trust, or for another name), or that cannot be reached, reads as the
// lender's name and what went wrong in words; the x509 detail and the
// address are the error's, for the log. They read "lender n2 could not be
// reached: tls: failed to verify certificate: x509: certificate signed by
// unknown authority".
func TestLenderConnectionFailuresReadPlainly(t *testing.T) {
	t.Parallel()
	agent := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(agent.Close)
	trusted := x509.NewCertPool()
	trusted.AddCert(agent.Certificate())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for _, c := range []struct {
		name, url  string
		cfg        *tls.Config
		want, logs string
	}{
		{"unknown authority", agent.URL, &tls.Config{}, "lender n2's certificate was not accepted (signed by an unknown authority)", "x509: "},
		{"another name", agent.URL, &tls.Config{RootCAs: trusted, ServerName: "n2.example"},
			"lender n2's certificate was not accepted (name mismatch: it is not for n2.example)", "x509: "},
		{"closed port", "https://" + closed, &tls.Config{}, "lender n2 could not be reached: connection refused", closed},
	} {
		x := NewHTTPLender(&http.Client{Transport: &http.Transport{TLSClientConfig: c.cfg}})
		_, err := x.TransferStatus(t.Context(), api.Node{ID: "node-2", Name: "n2", AgentURL: c.url}, "key", "t1", "")
		if err == nil {
			t.Fatalf("%s: the call went through", c.name)
		}
		if got := plainText(err); got != c.want {
			t.Errorf("%s: plainText = %q, want %q", c.name, got, c.want)
		}
		if !strings.Contains(err.Error(), c.logs) {
			t.Errorf("%s: the error for the log lost %q: %v", c.name, c.logs, err)
		}
	}
}

// TestTransferErrorNamesLenders: the source's words for a failed copy
// name the lenders (api.TransferDestination, api.TransferThisLender);
// words that name neither say which lender gave the copy up.
func TestTransferErrorNamesLenders(t *testing.T) {
	src, dst := api.Node{ID: "node-1", Name: "n1"}, api.Node{ID: "node-3", Name: "n3"}
	for _, c := range []struct{ st, want string }{
		{"the destination could not be reached from this lender: connection refused",
			"the destination n3 could not be reached from n1: connection refused"},
		{"the destination's certificate was not accepted by this lender (expired)",
			"the destination n3's certificate was not accepted by n1 (expired)"},
		{"the destination could not be reached from this lender (this lender's agent log says why)",
			"the destination n3 could not be reached from n1 (n1's agent log says why)"},
		{"it failed on its side (its agent's log says why)", "the source n1 gave the copy up: it failed on its side (its agent's log says why)"},
		{"", "the source n1 gave the copy up (failed)"},
	} {
		if got := transferError(src, dst, api.Transfer{State: api.TransferFailed, Error: c.st}); got != c.want {
			t.Errorf("transferError(%q) = %q, want %q", c.st, got, c.want)
		}
	}
}
