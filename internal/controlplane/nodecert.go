package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/pki"
	"github.com/rialto-project/rialto/internal/resource"
)

// nodeHosts are the hosts a node's certificate may name: those of its
// address, agent URL and data-plane endpoints.
func nodeHosts(address, agentURL string, endpoints map[api.Kind]string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(h string) {
		if h != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	add(address)
	if u, err := url.Parse(agentURL); err == nil {
		add(u.Hostname())
	}
	for _, ep := range endpoints {
		if h, _, err := net.SplitHostPort(ep); err == nil {
			add(h)
		}
	}
	return out
}

// checkNodeHosts refuses hosts a node's certificate must not name: a
// wildcard (*.example.com) would make it good for every host of the
// domain — other lenders' addresses, the control plane's — and a node is
// one host.
func checkNodeHosts(hosts []string) error {
	for _, h := range hosts {
		if strings.Contains(h, "*") {
			return fmt.Errorf("%w: a node's address, agent URL and endpoints name its own hosts; %q is a wildcard", ErrInvalid, h)
		}
	}
	return nil
}

// nodeCertRequest is what a node's certificate names.
func (s *Server) nodeCertRequest(nodeID string, hosts []string) pki.Request {
	return pki.Request{CommonName: nodeID, Hosts: hosts, Usage: pki.ServerAuth | pki.ClientAuth, Lifetime: s.cfg.NodeCertLifetime}
}

// checkJoinCSR checks a join's CSR before the node is registered: a
// control plane with a CA requires one, within the node's hosts.
func (s *Server) checkJoinCSR(r api.JoinRequest) error {
	if s.cfg.CA == nil {
		return nil
	}
	if r.CSR == "" {
		return fmt.Errorf("%w: this control plane issues node certificates: the join needs a CSR (csr); give the agent the cluster's CA certificate (--cacert, RIALTO_CACERT)", ErrInvalid)
	}
	hosts := nodeHosts(r.Address, r.AgentURL, r.Endpoints)
	if len(hosts) == 0 {
		return fmt.Errorf("%w: a node certificate needs the node's address", ErrInvalid)
	}
	if err := checkNodeHosts(hosts); err != nil {
		return err
	}
	// The node ID is not known yet; the CSR leaves the name to us.
	if _, err := pki.CheckCSR([]byte(r.CSR), s.nodeCertRequest("pending", hosts)); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
}

// signNodeCSR issues node n's certificate from a CSR; serial is its
// serial number.
func (s *Server) signNodeCSR(ctx context.Context, n api.Node, csr string) (out api.NodeCertificateResponse, serial *big.Int, err error) {
	hosts := nodeHosts(n.Address, n.AgentURL, n.Endpoints)
	if err := checkNodeHosts(hosts); err != nil {
		return api.NodeCertificateResponse{}, nil, err
	}
	iss, err := s.cfg.CA.SignCSR([]byte(csr), s.nodeCertRequest(n.ID, hosts))
	if err != nil {
		if errors.Is(err, pki.ErrBadRequest) {
			return api.NodeCertificateResponse{}, nil, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		return api.NodeCertificateResponse{}, nil, fmt.Errorf("controlplane: sign node certificate: %w", err)
	}
	// In the store before it is handed out: any replica removing the
	// node revokes it (crlstore.go).
	if err := s.recordIssued(ctx, iss); err != nil {
		return api.NodeCertificateResponse{}, nil, err
	}
	s.log.Info("node certificate issued", "node", n.ID, "serial", iss.Cert.SerialNumber.Text(16), "expires", iss.Cert.NotAfter)
	return api.NodeCertificateResponse{Certificate: string(iss.CertPEM), CACertificate: string(s.cfg.CA.CertPEM())}, iss.Cert.SerialNumber, nil
}

// APIServerCN is the common name of the API's certificate (APIServerTLS):
// api.ControlPlaneServerCN, which clients outside this package check. The
// cluster CA also issues node certificates, for the hosts a node's join
// declares (which may be a replica's): a client of the API that holds the
// cluster's CA checks this name too (verifyAPIPeer, api.TLSConfig, the
// agent's client), as a node certificate's is its node ID.
const APIServerCN = api.ControlPlaneServerCN

// verifyAPIPeer is a tls.Config.VerifyConnection hook for a client of a
// control plane's API (crypto/tls has checked the chain and the host):
// the certificate must be the API's, not revoked.
func verifyAPIPeer(ca *pki.CA, cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("controlplane: the peer presented no certificate")
	}
	if err := ca.VerifyPeer(cs); err != nil {
		return err
	}
	if cn := cs.PeerCertificates[0].Subject.CommonName; cn != APIServerCN {
		return fmt.Errorf("controlplane: the certificate at %s is %q's, not a control plane's", cs.ServerName, cn)
	}
	return nil
}

// APIServerTLS is the API's server TLS configuration with a cluster CA
// (pki.CA.ServerConfig): a certificate for hosts, renewed before it
// expires, and client certificates asked for, not required (agents
// present their node certificates; people and their tools need none).
// One the client presents must chain to the CA and be valid, but a
// revoked one is not refused in the handshake: the node calls it could
// authenticate refuse it themselves, on every call (checkPeerRevoked,
// checkNodeTLS: 401, the connection closed), and no other call looks at
// it. Refused in the handshake, the heartbeat of an agent whose node was
// removed, or whose certificate was revoked, while it ran would fail
// without an answer, on every new connection, and the agent would never
// learn to join again; the 401 makes it join again at once. It names the
// protocols the API speaks (HTTP/2, HTTP/1.1) itself, and so does the
// configuration a handshake takes once the CA trusts other certificates
// (a rotation followed: pki.CA.ServerConfig's GetConfigForClient, a copy
// of this one): it does not count on the server adding them to it.
func APIServerTLS(ca *pki.CA, hosts []string) (*tls.Config, error) {
	cfg, err := ca.ServerConfig(APIServerCN, hosts, tls.VerifyClientCertIfGiven, 0)
	if err != nil {
		return nil, err
	}
	cfg.VerifyConnection = nil
	cfg.NextProtos = []string{"h2", "http/1.1"}
	return cfg, nil
}

// checkNodeTLS holds a node's own calls (heartbeats, renewals) to mutual
// TLS when the control plane has a CA: the connection must present a
// certificate of the cluster CA naming the node, not revoked. Its answer
// is 401, so that an agent whose certificate expired joins again.
func (s *Server) checkNodeTLS(r *http.Request, nodeID string) error {
	if s.cfg.CA == nil {
		return nil
	}
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return fmt.Errorf("%w: node calls need the node's certificate (mutual TLS)", ErrUnauthorized)
	}
	leaf := r.TLS.PeerCertificates[0]
	if err := s.cfg.CA.Verify(leaf, pki.ClientAuth); err != nil {
		return fmt.Errorf("%w: node certificate: %v", ErrUnauthorized, err)
	}
	if leaf.Subject.CommonName != nodeID {
		return fmt.Errorf("%w: the certificate presented belongs to node %q, not %s", ErrForbidden, leaf.Subject.CommonName, nodeID)
	}
	return nil
}

func (s *Server) hNodeCertificate(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	id := r.PathValue("id")
	if id != p.nodeID {
		return 0, nil, fmt.Errorf("%w: this node credential belongs to node %s, not %s", ErrForbidden, p.nodeID, id)
	}
	if err := s.checkNodeTLS(r, id); err != nil {
		return 0, nil, err
	}
	var req api.NodeCertificateRequest
	if err := decode(w, r, false, &req); err != nil {
		return 0, nil, err
	}
	// The node as its credential names it in the store now, not as the
	// (cached) authentication found it: removed meanwhile, it is not.
	n, err := s.nodeOfCredential(ctx, r, id)
	if err != nil {
		return 0, nil, err
	}
	out, serial, err := s.signNodeCSR(ctx, n, req.CSR)
	if err != nil {
		return 0, nil, err
	}
	// A removal that committed since the read above revoked the node's
	// certificates before it, maybe not this one: read again, after the
	// certificate is in the CA's index and the store's record of issues.
	// The removal, on whichever replica, revokes what the store records
	// once more after its commit (removeNode), so either it revokes this
	// certificate or this read sees the node removed.
	if _, err := s.nodeOfCredential(ctx, r, id); err != nil {
		if _, rerr := s.revokeCerts(ctx, "", []*big.Int{serial}); rerr != nil {
			return 0, nil, fmt.Errorf("controlplane: node %s: revoke the certificate issued while it was removed: %w", id, rerr)
		}
		s.log.Warn("node certificate revoked at once: the node was removed while it was issued", "node", id, "serial", serial.Text(16))
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

// nodeOfCredential reads, from the store (not the token cache), the node
// whose credential r presents, which must be node id: ErrUnauthorized
// once the node was removed or joined again with a new credential.
func (s *Server) nodeOfCredential(ctx context.Context, r *http.Request, id string) (api.Node, error) {
	_, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	n, err := s.st.NodeByCredential(ctx, resource.HashSecret(strings.TrimSpace(tok)))
	if errors.Is(err, store.ErrNotFound) || (err == nil && n.ID != id) {
		return api.Node{}, fmt.Errorf("%w: node %s was removed, or joined again with another credential", ErrUnauthorized, id)
	}
	if err != nil {
		return api.Node{}, fmt.Errorf("controlplane: node %s: %w", id, err)
	}
	return n, nil
}

// TLSLender is the Lender of a control plane with a cluster CA: it calls
// agents over mutual TLS, presenting a certificate named pki.ControlPlaneCN and
// accepting only the certificate of the node it means to reach (common
// name its node ID, not revoked), before any byte of the request (and its
// agent key) is sent.
type TLSLender struct {
	HTTPLender
	ca   *pki.CA
	cert func() (*tls.Certificate, error)
}

// NewTLSLender returns a TLSLender with a client certificate from ca.
func NewTLSLender(ca *pki.CA) (*TLSLender, error) {
	cert, err := ca.Renewing(pki.Request{CommonName: pki.ControlPlaneCN, Usage: pki.ClientAuth})
	if err != nil {
		return nil, err
	}
	l := &TLSLender{ca: ca, cert: cert}
	l.HTTPLender.client = l.clientFor
	return l, nil
}

// clientFor is an HTTP client whose connections verify that the agent at
// the other end is node.
func (l *TLSLender) clientFor(node api.Node) (*http.Client, error) {
	u, err := url.Parse(node.AgentURL)
	if err != nil {
		return nil, fmt.Errorf("controlplane: agent %s: bad agent URL: %w", node.ID, err)
	}
	if u.Scheme != "https" {
		return nil, fmt.Errorf("controlplane: agent %s serves its API without TLS (%s); this control plane calls agents over mutual TLS only", node.ID, u.Redacted())
	}
	return l.clients.get(node.ID, func() *http.Client {
		return &http.Client{Transport: handshakeRetry{l.transport(node, u, nil)}}
	}), nil
}

// transport is a lender transport whose connections verify that the
// agent at u is node: its certificate, signed by the cluster CA, names
// the node and is not revoked, unless its serial number is one of
// revoked (nil: none).
func (l *TLSLender) transport(node api.Node, u *url.URL, revoked []*big.Int) *http.Transport {
	tr := newLenderTransport()
	tr.TLSClientConfig = &tls.Config{
		MinVersion:           tls.VersionTLS12,
		RootCAs:              l.ca.Pool(),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return l.cert() },
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("controlplane: the agent at %s presented no certificate", u.Host)
			}
			leaf := cs.PeerCertificates[0]
			if !slices.ContainsFunc(revoked, func(n *big.Int) bool { return n.Cmp(leaf.SerialNumber) == 0 }) {
				if err := l.ca.VerifyPeer(cs); err != nil {
					return err
				}
			}
			if cn := leaf.Subject.CommonName; cn != node.ID {
				return fmt.Errorf("controlplane: the agent at %s presented the certificate of node %q, not %s", u.Host, cn, node.ID)
			}
			return nil
		},
	}
	return tr
}

// TeardownRemoved is Teardown for the agent of node, whose removal has
// revoked its certificates (revoked: their serial numbers), which
// Teardown's connections refuse: the removal tells the agent, which may
// still run, to tear down the leases lost with it (removeNode), and a
// failed move tells it to drop its destination there (dropDestination).
// The call is postRemoved's.
func (l *TLSLender) TeardownRemoved(ctx context.Context, node api.Node, agentKey string, revoked []*big.Int, req api.TeardownRequest) error {
	return l.postRemoved(ctx, node, agentKey, revoked, "/agent/v1/teardown", req, nil)
}

// TransferAbortRemoved is TransferAbort for the agent of node, whose
// removal has revoked its certificates (revoked: their serial numbers),
// which TransferAbort's connections refuse: a move that fails with an end
// on the node gives its transfer up there (abortMove). The call is
// postRemoved's.
func (l *TLSLender) TransferAbortRemoved(ctx context.Context, node api.Node, agentKey string, revoked []*big.Int, id string) (api.Transfer, error) {
	var out api.Transfer
	err := l.postRemoved(ctx, node, agentKey, revoked, "/agent/v1/transfers/"+url.PathEscape(id)+"/abort", struct{}{}, &out)
	return out, err
}

// postRemoved is post to the agent of node, whose removal has revoked its
// certificates (revoked: their serial numbers). The agent may present one
// of those certificates (its own, not one revoked before: a certificate
// of a machine the node was taken over from, say, is refused); the call's
// connection is its own, kept for no other call. What it sends the
// agent, a lease's or a transfer's ID and the node's agent key, the
// holder of that certificate's key has already: all are in the node's
// state directory.
func (l *TLSLender) postRemoved(ctx context.Context, node api.Node, agentKey string, revoked []*big.Int, path string, in, out any) error {
	u, err := url.Parse(node.AgentURL)
	if err != nil {
		return fmt.Errorf("controlplane: agent %s: bad agent URL: %w", node.ID, err)
	}
	if u.Scheme != "https" {
		return fmt.Errorf("controlplane: agent %s serves its API without TLS (%s); this control plane calls agents over mutual TLS only", node.ID, u.Redacted())
	}
	tr := l.transport(node, u, revoked)
	tr.DisableKeepAlives = true
	defer tr.CloseIdleConnections()
	return postVia(ctx, &http.Client{Transport: handshakeRetry{tr}}, node, agentKey, path, in, out)
}

// handshakeRetries bounds the attempts of a request whose connection
// the agent refused in the handshake with an internal_error alert, and
// handshakeBackoff is the first wait between them (doubled each time).
const (
	handshakeRetries = 4
	handshakeBackoff = 50 * time.Millisecond
)

// handshakeRetry sends a request again when no connection for it could
// be set up because the agent answered the TLS handshake with an
// internal_error alert: a peer's alert for a state of its own (no
// certificate at hand yet, say) that it is likely to be out of in a
// moment. No byte of the request reached the agent (the transport never
// got a connection), so sending it again is safe whatever the request.
// Other failures, and any failure once a connection was had, are
// returned as they are.
type handshakeRetry struct{ rt http.RoundTripper }

func (h handshakeRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	wait := handshakeBackoff
	for attempt := 1; ; attempt++ {
		var gotConn atomic.Bool
		ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(httptrace.GotConnInfo) { gotConn.Store(true) },
		})
		try := req.Clone(ctx)
		if attempt > 1 && req.Body != nil && req.Body != http.NoBody {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			try.Body = body
		}
		resp, err := h.rt.RoundTrip(try)
		if err == nil || gotConn.Load() || attempt == handshakeRetries || !isInternalErrorAlert(err) ||
			(req.Body != nil && req.Body != http.NoBody && req.GetBody == nil) {
			return resp, err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-req.Context().Done():
			t.Stop()
			return nil, err
		}
		wait *= 2
	}
}

// alertInternalError is TLS's internal_error alert (RFC 8446, 6.2).
const alertInternalError tls.AlertError = 80

// isInternalErrorAlert reports whether err is the peer's internal_error
// alert.
func isInternalErrorAlert(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error" && op.Err != nil && op.Err.Error() == alertInternalError.Error()
}

// hCACertificates answers GET /v1/ca-certificates: the CA certificates
// this control plane trusts (after a `rialto ca rotate` of its directory,
// once it followed it: the new CA's and the old one's), left out when
// their hash is the caller's ca_hash. A long-running borrower (rialto
// attach) asks over the connection it verified with the certificates it
// holds, and verifies the control plane and lenders with them from then
// on, as an agent does with its heartbeats' answers. With crl_number, the
// number of the revocation list the caller holds (0: none), the answer
// carries the CA's list when its number is higher, as a heartbeat's
// does: the borrower refuses the lenders it names from then on (a removed
// node's, whose process may still serve).
func (s *Server) hCACertificates(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	q := r.URL.Query()
	var held *big.Int
	if v := q.Get("crl_number"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, nil, fmt.Errorf("%w: crl_number=%q: want the number of the revocation list held (0: none)", ErrInvalid, v)
		}
		held = big.NewInt(n)
	}
	out := api.CACertificates{CAHash: s.cfg.CA.CertHash()}
	if out.CAHash != q.Get("ca_hash") {
		out.CACertificate = string(s.cfg.CA.CertPEM())
	}
	if held != nil {
		// A replica that has not heard itself lately on the broadcast
		// channel re-reads the list first (as for a node's call:
		// checkPeerRevoked).
		if !s.cacheTrusted() {
			if _, err := s.syncCRL(ctx); err != nil {
				return 0, nil, fmt.Errorf("%w: cannot read the revocation list: %v", ErrUnavailable, err)
			}
		}
		if s.cfg.CA.CRLNumber().Cmp(held) > 0 {
			out.CRL = string(s.cfg.CA.CRLPEM())
		}
	}
	return http.StatusOK, out, nil
}
