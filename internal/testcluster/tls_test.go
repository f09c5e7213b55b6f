package testcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/pki"
)

// nodeCert reads a node's certificate and key from its state dir.
func nodeCert(t *testing.T, n *Node) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(filepath.Join(n.StateDir, "node-cert.pem"), filepath.Join(n.StateDir, "node-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
		t.Fatal(err)
	}
	return c
}

// tlsClient trusts the cluster CA and presents cert (if not nil).
func tlsClient(c *Cluster, cert *tls.Certificate) *http.Client {
	cfg := c.CA.ClientConfig(cert)
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
}

// TestTLSEnrollment: in a cluster with a CA, agents join with a CSR and
// get a certificate naming their node; the control plane calls them over
// mutual TLS (a lease works end to end), and node calls without the
// node's own certificate are refused.
func TestTLSEnrollment(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 2})
	ctx := ctxT(t)
	if !strings.HasPrefix(c.URL, "https://") {
		t.Fatalf("control plane at %s", c.URL)
	}
	nodes, err := c.Client().Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes {
		n := c.NodeByID(nd.ID)
		if !strings.HasPrefix(nd.AgentURL, "https://") {
			t.Errorf("node %s agent URL %s", nd.Name, nd.AgentURL)
		}
		cert := nodeCert(t, n)
		u, _ := url.Parse(nd.AgentURL)
		if cert.Leaf.Subject.CommonName != nd.ID || len(cert.Leaf.IPAddresses) != 1 || cert.Leaf.IPAddresses[0].String() != u.Hostname() {
			t.Errorf("node %s certificate: CN %q, IPs %v", nd.ID, cert.Leaf.Subject.CommonName, cert.Leaf.IPAddresses)
		}
		if err := c.CA.Verify(cert.Leaf, pki.ServerAuth|pki.ClientAuth); err != nil {
			t.Errorf("node %s certificate: %v", nd.ID, err)
		}
		if st, err := os.Stat(filepath.Join(n.StateDir, "node-key.pem")); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("node key: %v %v", st, err)
		}
	}

	// A lease: prepared over mutual TLS, then served.
	l := createBlock(t, c.Client(), 8<<20, api.ModeShared)
	nc, err := nbd.DialURI(ctx, l.URI, nbd.WithTLS(dataTLS(t, c)))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()

	n1, n2 := c.NodeByID(nodes[0].ID), c.NodeByID(nodes[1].ID)
	cert1, cert2 := nodeCert(t, n1), nodeCert(t, n2)
	cred1 := readIdentity(t, n1).Credential
	beat := func(hc *http.Client) error {
		_, err := api.NewClient(c.URL, cred1, hc).Heartbeat(ctx, n1.ID(), api.Heartbeat{Health: "ok"})
		return err
	}
	if err := beat(tlsClient(c, &cert1)); err != nil {
		t.Fatalf("heartbeat with the node's own certificate: %v", err)
	}
	for _, tc := range []struct {
		name string
		hc   *http.Client
		code string
	}{
		{"no certificate", tlsClient(c, nil), api.CodeUnauthorized},
		{"another node's certificate", tlsClient(c, &cert2), api.CodeForbidden},
	} {
		if err := beat(tc.hc); !api.IsCode(err, tc.code) {
			t.Errorf("heartbeat with %s: %v, want %s", tc.name, err, tc.code)
		}
	}

	// The agent's lease-execution API takes calls from the control plane's
	// certificate only, whatever the bearer key.
	key := readIdentity(t, n1).AgentKey
	for _, tc := range []struct {
		name string
		hc   *http.Client
	}{{"no certificate", tlsClient(c, nil)}, {"a node's certificate", tlsClient(c, &cert2)}} {
		req, _ := http.NewRequestWithContext(ctx, "GET", nodes[0].AgentURL+"/agent/v1/status", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := tc.hc.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("agent status with %s: %s", tc.name, resp.Status)
		}
	}
	// And a client that does not trust the cluster CA is refused at the
	// handshake.
	if _, err := http.Get(nodes[0].AgentURL + "/agent/v1/ping"); err == nil {
		t.Error("the agent API verified against the system's CAs")
	}
}

// TestTLSRevokedNodeCertificate: a revoked node certificate is refused on
// the node's next call; the agent joins again with the bootstrap token and
// gets a new one.
func TestTLSRevokedNodeCertificate(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1})
	n := c.Nodes[0]
	old := nodeCert(t, n)
	if err := c.CA.Revoke(old.Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	_, err := api.NewClient(c.URL, readIdentity(t, n).Credential, tlsClient(c, &old)).Heartbeat(ctx, n.ID(), api.Heartbeat{Health: "ok"})
	if err == nil {
		t.Fatal("heartbeat with a revoked certificate accepted")
	}
	c.Eventually("a new node certificate", func() bool {
		b, err := os.ReadFile(filepath.Join(n.StateDir, "node-cert.pem"))
		if err != nil {
			return false
		}
		certs, err := pki.ParseCerts(b)
		return err == nil && certs[0].SerialNumber.Cmp(old.Leaf.SerialNumber) != 0
	})
	c.Eventually("the node ready with its new certificate", func() bool { return c.NodeState(n.ID()) == api.NodeReady })
	// A rejoin registers the node before its devices: wait for them.
	c.Eventually("the node's block device available again", func() bool {
		devs, err := c.Client().Devices(ctx)
		if err != nil {
			return false
		}
		for _, d := range devs {
			if d.NodeID == n.ID() && d.Kind == api.KindBlock && d.State == "available" {
				return true
			}
		}
		return false
	})
	l := createBlock(t, c.Client(), 4<<20, api.ModeShared)
	if l.NodeID != n.ID() {
		t.Fatalf("lease on %s", l.NodeID)
	}
}

// TestTLSRenewal: with a short certificate lifetime the agent renews its
// certificate before it expires (with its node credential: not by joining
// again) and stays usable. The renewal window is the last third of the
// lifetime, in real time (TLS checks certificates against the wall clock):
// 9 s gives the agent's heartbeats (every 100 ms) a 3 s window, which a
// loaded machine's stalls do not close.
func TestTLSRenewal(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1, NodeCertLifetime: 9 * time.Second})
	n := c.Nodes[0]
	first := nodeCert(t, n)
	cred := readIdentity(t, n).Credential
	c.Eventually("a renewed certificate", func() bool {
		b, err := os.ReadFile(filepath.Join(n.StateDir, "node-cert.pem"))
		if err != nil {
			return false
		}
		certs, err := pki.ParseCerts(b)
		return err == nil && certs[0].NotAfter.After(first.Leaf.NotAfter)
	})
	if time.Now().After(first.Leaf.NotAfter) {
		t.Fatalf("the certificate was renewed after it expired (%v)", first.Leaf.NotAfter)
	}
	if readIdentity(t, n).Credential != cred {
		t.Fatal("the agent joined again instead of renewing its certificate")
	}
	// Well past the first certificate's expiry, leases still go through.
	Eventually(t, 20*time.Second, "the first certificate to expire", func() bool { return time.Now().After(first.Leaf.NotAfter.Add(time.Second)) })
	l := createBlock(t, c.Client(), 4<<20, api.ModeShared)
	c.Eventually("the node ready", func() bool { return c.NodeState(n.ID()) == api.NodeReady })
	if _, err := c.Client().ReleaseLease(ctxT(t), l.ID); err != nil {
		t.Fatal(err)
	}
	if readIdentity(t, n).Credential != cred {
		t.Fatal("the agent joined again")
	}
}

// TestTLSExpiredCertificateRejoins: an agent whose certificate expired
// while it was stopped joins again (presenting no certificate: the expired
// one would fail the handshake) and gets a new one.
func TestTLSExpiredCertificateRejoins(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1, NodeCertLifetime: 2 * time.Second})
	n := c.Nodes[0]
	first := nodeCert(t, n)
	n.Kill()
	Eventually(t, 20*time.Second, "the certificate to expire", func() bool { return time.Now().After(first.Leaf.NotAfter) })
	n.Restart()
	if got := nodeCert(t, n); !got.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Fatalf("the node kept its expired certificate (until %v)", got.Leaf.NotAfter)
	}
	c.Eventually("the node ready", func() bool { return c.NodeState(n.ID()) == api.NodeReady })
}

// TestTLSLenderChecksTheNode: the control plane's lender refuses an agent
// URL whose server presents another node's certificate, an expired or a
// revoked one, or no TLS, before sending anything.
func TestTLSLenderChecksTheNode(t *testing.T) {
	t.Parallel()
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lender, err := controlplane.NewTLSLender(ca)
	if err != nil {
		t.Fatal(err)
	}
	reached := make(chan string, 16)
	serve := func(cert tls.Certificate, useTLS bool) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached <- r.URL.Path
			w.Write([]byte(`{"uri":"nbd://x/y"}`))
		}), ErrorLog: log.New(io.Discard, "", 0)}
		scheme := "http"
		if useTLS {
			scheme = "https"
			srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}
			go srv.ServeTLS(ln, "", "")
		} else {
			go srv.Serve(ln)
		}
		t.Cleanup(func() { srv.Close() })
		return scheme + "://" + ln.Addr().String()
	}
	issue := func(cn string, now func() time.Time, life time.Duration) tls.Certificate {
		from := ca
		if now != nil {
			if from, err = pki.Load(ca.Dir(), pki.Options{Now: now}); err != nil {
				t.Fatal(err)
			}
		}
		iss, err := from.Issue(pki.Request{CommonName: cn, Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth | pki.ClientAuth, Lifetime: life})
		if err != nil {
			t.Fatal(err)
		}
		c, err := iss.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	revoked := issue("node-a", nil, 0)
	if err := ca.Revoke(revoked.Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prepare := func(url string) error {
		_, err := lender.Prepare(ctx, api.Node{ID: "node-a", AgentURL: url}, "rak_secret", api.PrepareRequest{LeaseID: "l1"})
		return err
	}
	if err := prepare(serve(issue("node-a", nil, 0), true)); err != nil {
		t.Fatalf("the right node: %v", err)
	}
	<-reached
	for _, tc := range []struct {
		name, url, want string
	}{
		{"another node's certificate", serve(issue("node-b", nil, 0), true), `node "node-b"`},
		{"an expired certificate", serve(issue("node-a", func() time.Time { return time.Now().Add(-2 * time.Hour) }, time.Hour), true), "expired"},
		{"a revoked certificate", serve(revoked, true), "revoked"},
		{"no TLS", serve(tls.Certificate{}, false), "without TLS"},
	} {
		err := prepare(tc.url)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	select {
	case p := <-reached:
		t.Fatalf("a refused agent received %s", p)
	default:
	}
}

// readIdentity reads the secrets a node keeps in its state dir.
func readIdentity(t *testing.T, n *Node) struct{ Credential, AgentKey string } {
	t.Helper()
	var id struct {
		Credential string `json:"credential"`
		AgentKey   string `json:"agent_key"`
	}
	b, err := os.ReadFile(filepath.Join(n.StateDir, "identity.json"))
	if err == nil {
		err = json.Unmarshal(b, &id)
	}
	if err != nil {
		t.Fatal(err)
	}
	return struct{ Credential, AgentKey string }{id.Credential, id.AgentKey}
}

// TestAgentWithDroppedCACertificateToldWhy: a running agent whose node
// certificate the dropped CA signed, heartbeating a control plane
// restarted after `rialto ca drop-old`, fails its heartbeats with
// api.ErrUntrustedClient, which says why and what to do (restart the
// agent with the current ca-cert.pem), rather than only the TLS alert
// ("remote error: tls: unknown certificate authority"), logged every
// heartbeat with nothing to act on. The alert can be lost: under TLS
// 1.3 the client's handshake ends before the server judges its
// certificate, and the server closing with the request unread resets
// the connection, which discards the alert before the client reads it
// ("connection reset by peer", once in a CI run): every heartbeat must
// fail, and one of a few say why, as the agent's do, one a second.
func TestAgentWithDroppedCACertificateToldWhy(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1})
	n := c.Nodes[0]
	if err := c.CA.Rotate(); err != nil {
		t.Fatal(err)
	}
	c.Sweep()     // the running control plane follows the rotation
	c.Heartbeat() // and hands the agent the rotated bundle, with which it verifies the new CA's control plane
	if err := c.CA.DropOld(); err != nil {
		t.Fatal(err)
	}
	c.RestartControlPlane() // trusts the new CA alone
	if iss := nodeCert(t, n).Leaf.Issuer.CommonName; iss == c.CA.Certificate().Subject.CommonName {
		t.Fatalf("the node's certificate is the new CA's (%s) already", iss)
	}
	var errs []error
	for range 10 {
		err := n.Agent().Heartbeat(ctxT(t))
		if err == nil {
			t.Fatal("the heartbeat of an agent whose certificate's CA was dropped was answered")
		}
		if errors.Is(err, api.ErrUntrustedClient) && strings.Contains(err.Error(), "unknown certificate authority") {
			return
		}
		errs = append(errs, err)
	}
	t.Fatalf("the heartbeats of an agent whose certificate's CA was dropped failed with %v, want api.ErrUntrustedClient wrapping the TLS alert", errors.Join(errs...))
}

// TestAgentWithDroppedCACertificateRejoins: an agent whose stored node
// certificate comes from a CA its --cacert file no longer holds (`rialto
// ca drop-old` before the certificate was renewed, the agent given the
// new file and restarted) joins without it, by its credential, its
// leases kept. It presented that certificate, which the control plane
// refused at the handshake ("unknown certificate authority"), at every
// join for as long as the certificate was valid: a restart could not
// bring the node back.

func TestAgentWithDroppedCACertificateRejoins(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1})
	ctx := ctxT(t)
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	n := c.Nodes[0]
	old := nodeCert(t, n)
	if err := c.CA.Rotate(); err != nil {
		t.Fatal(err)
	}
	if err := c.CA.DropOld(); err != nil {
		t.Fatal(err)
	}
	n.Kill()
	c.RestartControlPlane() // issues from the new CA, trusts it alone
	n.Restart()             // reads the new ca-cert.pem
	if cur := nodeCert(t, n); cur.Leaf.SerialNumber.Cmp(old.Leaf.SerialNumber) == 0 || cur.Leaf.Issuer.CommonName != c.CA.Certificate().Subject.CommonName {
		t.Fatalf("the node's certificate after its join: issued by %q, want the new CA %q", cur.Leaf.Issuer.CommonName, c.CA.Certificate().Subject.CommonName)
	}
	if got := c.Lease(l.ID); got.State != api.LeaseActive {
		t.Fatalf("the lease after the rejoin: %s, want active (a join proven by the credential)", got.State)
	}
}
