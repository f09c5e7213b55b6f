package testcluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestAgentAPIRefusesRevokedClientOnOpenConnection: a client certificate
// the cluster CA revokes while an HTTPS connection to an agent's API
// presenting it is open (keep-alive, over HTTP/1.1 and HTTP/2) is
// refused on that connection's next request, once the agent holds the
// list: 401, the API's error JSON saying the client certificate is
// revoked, and the connection closed; a new connection fails its
// handshake. Before, the agent checked the list at the handshake only:
// the request on the open connection was served (200, the agent's
// status to the control plane's certificate).
func TestAgentAPIRefusesRevokedClientOnOpenConnection(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1})
	n := c.Nodes[0]
	ctx := ctxT(t)
	for _, h2 := range []bool{false, true} {
		cl := newAgentStatusClient(ctx, t, c, n, h2)
		proto := cl.proto
		if resp, body, _ := cl.status(ctx); resp == nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: the agent's status to a control plane's certificate before its revocation: %v %s", proto, resp, body)
		}

		revoker, err := pki.Load(c.CA.Dir(), pki.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := revoker.Revoke(cl.cert.Leaf.SerialNumber); err != nil {
			t.Fatal(err)
		}
		c.Sweep()     // the control plane takes the directory's list
		c.Heartbeat() // and hands it to the agent
		if !c.CA.Revoked(cl.cert.Leaf.SerialNumber) {
			t.Fatal("the control plane did not take the revocation")
		}

		cl.refusedOnOpenConnection(ctx, "revoked")
	}
}

// TestAgentAPIRefusesDroppedCAClientOnOpenConnection: a client
// certificate of a CA that `rialto ca drop-old` dropped, presented on an
// HTTPS connection to an agent's API opened before the agent took the
// bundle without that CA (from the restarted control plane's heartbeat
// answer), is refused on that connection's next request: 401, the API's
// error JSON saying the client certificate is no longer trusted, its CA
// dropped, and the connection closed. Before, the agent checked the
// client's chain at the handshake only: the request was served.
func TestAgentAPIRefusesDroppedCAClientOnOpenConnection(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1})
	n := c.Nodes[0]
	ctx := ctxT(t)
	// Issued by the CA before the rotation.
	cl := newAgentStatusClient(ctx, t, c, n, true)
	newCA := c.RotateCA()
	c.Heartbeat() // the agent trusts both CAs
	// The control plane, then the agent, take certificates of the new
	// CA, so that the agent's heartbeats go on once the old one is
	// dropped.
	c.RestartControlPlane()
	n.Restart()
	if iss := c.IssuerOf(t, cl.url); !iss.Equal(newCA) {
		t.Fatalf("the restarted agent's certificate is issued by %q, want the new CA", iss.Subject.CommonName)
	}
	cl.tr.TLSClientConfig = c.CA.ClientConfig(cl.cert) // trusts both
	cl.key = readIdentity(t, n).AgentKey               // its join's
	if resp, body, _ := cl.status(ctx); resp == nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the agent's status to a control plane's certificate of the old CA, before drop-old: %v %s", resp, body)
	}

	if err := c.CA.DropOld(); err != nil {
		t.Fatal(err)
	}
	c.RestartControlPlane() // trusts the new CA alone, and hands it out
	c.Heartbeat()           // the agent takes it

	cl.refusedOnOpenConnection(ctx, "no longer trusted")
}

// agentStatusClient calls an agent's GET /agent/v1/status over one
// keep-alive connection, presenting a client certificate of the control
// plane's name (the lease-execution routes take no other), as a
// replica's would be, that the cluster CA issues.
type agentStatusClient struct {
	t          *testing.T
	url, key   string
	proto      string
	cert       *tls.Certificate
	tr         *http.Transport
	hc         *http.Client
	handshakes atomic.Int32
}

func newAgentStatusClient(ctx context.Context, t *testing.T, c *Cluster, n *Node, h2 bool) *agentStatusClient {
	t.Helper()
	node, err := c.Client().Node(ctx, n.ID())
	if err != nil {
		t.Fatal(err)
	}
	iss, err := c.CA.Issue(pki.Request{CommonName: pki.ControlPlaneCN, Usage: pki.ClientAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	cl := &agentStatusClient{t: t, url: node.AgentURL, key: readIdentity(t, n).AgentKey, proto: "HTTP/1.1", cert: &cert}
	if h2 {
		cl.proto = "HTTP/2.0"
	}
	cl.tr = &http.Transport{TLSClientConfig: c.CA.ClientConfig(&cert), ForceAttemptHTTP2: h2}
	t.Cleanup(cl.tr.CloseIdleConnections)
	cl.hc = &http.Client{Timeout: 30 * time.Second, Transport: cl.tr}
	return cl
}

// status calls GET /agent/v1/status: the answer (nil: the call failed)
// and its body, and whether it went over a connection made before.
func (cl *agentStatusClient) status(ctx context.Context) (*http.Response, []byte, bool) {
	t := cl.t
	t.Helper()
	var reused bool
	trace := &httptrace.ClientTrace{
		GotConn:          func(i httptrace.GotConnInfo) { reused = i.Reused },
		TLSHandshakeDone: func(tls.ConnectionState, error) { cl.handshakes.Add(1) },
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), "GET", cl.url+"/agent/v1/status", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+cl.key)
	resp, err := cl.hc.Do(req)
	if err != nil {
		return nil, nil, reused
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Proto != cl.proto {
		t.Fatalf("the agent answered over %s, want %s", resp.Proto, cl.proto)
	}
	return resp, body, reused
}

// refusedOnOpenConnection checks that the next call, over the connection
// the one before used, is refused (401, the API's error JSON saying the
// client certificate, named by its serial number, is state) and that
// the refusal closed it: the call after needs a new handshake, and is
// refused.
func (cl *agentStatusClient) refusedOnOpenConnection(ctx context.Context, state string) {
	t := cl.t
	t.Helper()
	proto, serial := cl.proto, cl.cert.Leaf.SerialNumber.Text(16)
	before := cl.handshakes.Load()
	resp, body, reused := cl.status(ctx)
	if resp == nil {
		t.Fatalf("%s: the request on the open connection failed without an answer (reused: %v)", proto, reused)
	}
	if !reused || cl.handshakes.Load() != before {
		t.Fatalf("%s: the request did not go over the connection opened before (reused %v, %d handshakes since)", proto, reused, cl.handshakes.Load()-before)
	}
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("%s: a request on a connection open since before its client certificate became %s: %s %s, want 401", proto, state, resp.Status, body)
	}
	var e api.ErrorBody
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != api.CodeUnauthorized ||
		!strings.Contains(e.Error.Message, "client certificate") || !strings.Contains(e.Error.Message, state) ||
		!strings.Contains(e.Error.Message, serial) {
		t.Fatalf("%s: the refusal's body: %s (%v), want the API's error JSON saying the client certificate (serial %s) is %s", proto, body, err, serial, state)
	}
	// A new connection's handshake refuses the certificate (revoked), or
	// the client does not offer it (its CA is not one the agent asks
	// for): the call is refused all the same.
	if resp, body, _ := cl.status(ctx); resp != nil && resp.StatusCode != http.StatusForbidden {
		t.Fatalf("%s: a request after the refusal: %s %s, want a failed handshake or 403", proto, resp.Status, body)
	}
	if cl.handshakes.Load() == before {
		t.Fatalf("%s: the request after the refusal reused its connection", proto)
	}
}
