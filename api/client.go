package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Error is a non-2xx answer from the API.
type Error struct {
	Status  int
	Code    string
	Message string
	// Plain: the answer's body was not the API's error body but another
	// server's words (a proxy's, Go's HTTPS server answering plain HTTP,
	// a server at the address that is not a control plane); Code is then
	// its status's (CodeOfStatus) and Message the body. Such an answer
	// says nothing of the API's objects: a plain 404 is not a lease gone.
	Plain bool
}

func (e *Error) Error() string {
	return fmt.Sprintf("rialto api: %s (%d %s)", e.Message, e.Status, e.Code)
}

// IsCode reports whether err is the API's answer with the given code: an
// *Error that is not Plain (a proxy's 404 is not the API's not_found).
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code && !e.Plain
}

// ErrUntrustedServer means the control plane's TLS certificate did not
// verify against the CAs the client trusts: most often the client was not
// given the cluster's CA certificate (RIALTO_CACERT, --cacert), or was given
// another cluster's.
var ErrUntrustedServer = errors.New("the control plane's certificate is not trusted (is RIALTO_CACERT the cluster's ca-cert.pem?)")

// ErrUntrustedClient means the control plane refused the TLS client
// certificate this client presented because it does not know the CA that
// signed it (the TLS alert unknown_ca): most often an agent whose node
// certificate a CA signed that `rialto ca drop-old` dropped since, and a
// control plane restarted on the new file. The agent keeps failing its
// heartbeats until it is restarted with the cluster's current
// ca-cert.pem: then it sets that certificate aside and joins again.
var ErrUntrustedClient = errors.New("the control plane does not trust this node's certificate: the CA that signed it is not one it trusts (dropped by `rialto ca drop-old`?); restart the agent with the cluster's current ca-cert.pem: it then sets that certificate aside and joins again (docs/operations.md, Rotating the CA)")

// remoteUnknownCA reports whether err is the TLS alert unknown_ca from
// the server: it refused the client certificate presented.
func remoteUnknownCA(err error) bool {
	var op *net.OpError
	// crypto/tls reports a received alert as a *net.OpError whose Op is
	// "remote error" around an unexported alert type.
	return errors.As(err, &op) && op.Op == "remote error" && op.Err != nil && op.Err.Error() == "tls: unknown certificate authority"
}

// ControlPlaneServerCN is the common name of the certificate a control
// plane's API presents (signed by the cluster CA). The cluster CA also
// issues the nodes' certificates (common name the node's ID), for the
// hosts their joins declare, which may be the control plane's address: a
// client that trusts the cluster CA checks this name as well
// (VerifyControlPlane), so that it sends its token to a control plane
// only, never to a node's certificate presented at the API's address.
const ControlPlaneServerCN = "rialto control plane"

// ErrNotControlPlane means the server's certificate verified against the
// CA the client was given but is not a control plane's
// (ControlPlaneServerCN): a node's certificate of the cluster CA, say, at
// the control plane's address. Nothing was sent to it.
var ErrNotControlPlane = errors.New("the server's certificate is not a control plane's")

// VerifyControlPlane is a tls.Config.VerifyConnection hook for a client of
// a control plane's API, run after crypto/tls has verified the chain and
// the host name: the certificate must be a control plane's
// (ControlPlaneServerCN). Errors wrap ErrNotControlPlane.
func VerifyControlPlane(cs tls.ConnectionState) error {
	server := "the server"
	if cs.ServerName != "" { // empty when dialled by IP address (no SNI)
		server += " at " + cs.ServerName
	}
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("%w: %s presented no certificate", ErrNotControlPlane, server)
	}
	if cn := cs.PeerCertificates[0].Subject.CommonName; cn != ControlPlaneServerCN {
		return fmt.Errorf("%w: %s presents a certificate for %q, not %q", ErrNotControlPlane, server, cn, ControlPlaneServerCN)
	}
	return nil
}

// TLSConfig returns a client TLS configuration for a control plane's API
// that trusts the CA certificates in the PEM file caFile, and only those,
// and accepts only a control plane's certificate (VerifyControlPlane).
func TLSConfig(caFile string) (*tls.Config, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("rialto api: CA certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("rialto api: CA certificate: no PEM certificate in %s", caFile)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, VerifyConnection: VerifyControlPlane}, nil
}

// HTTPClient returns an HTTP client with the given timeout that verifies
// HTTPS servers against the CA certificates in caFile, accepting only a
// control plane's certificate (TLSConfig), or ("" for caFile) against the
// system's CAs.
func HTTPClient(caFile string, timeout time.Duration) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if caFile != "" {
		cfg, err := TLSConfig(caFile)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = cfg
	}
	return &http.Client{Timeout: timeout, Transport: tr}, nil
}

// Client talks to a control plane.
type Client struct {
	ep    *endpoints
	token string
	hc    *http.Client
}

// NewClient returns a client for the control plane at base (e.g.
// "https://127.0.0.1:7070") authenticating with token (tenant API token,
// node credential or bootstrap token, depending on the call). hc may be nil
// (a 30 s timeout, the system's CAs); HTTPClient makes one that trusts the
// cluster's CA. base may list several replicas' addresses separated by
// commas: the client then fails over between them (failover.go).
func NewClient(base, token string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	return &Client{ep: newEndpoints(base), token: token, hc: hc}
}

// WithToken returns a copy of c that uses token.
func (c *Client) WithToken(token string) *Client {
	cc := *c
	cc.token = token
	return &cc
}

// Do sends a request with a JSON body (nil for none) and decodes a JSON
// answer into out (nil to discard). Extra headers may be given.
func (c *Client) Do(ctx context.Context, method, path string, body, out any, hdr ...string) error {
	return c.do(ctx, false, method, path, body, out, hdr...)
}

// do is Do; toLeader sends the request to the placement leader first
// (failover.go).
func (c *Client) do(ctx context.Context, toLeader bool, method, path string, body, out any, hdr ...string) error {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return fmt.Errorf("rialto api: encode request: %w", err)
		}
	}
	resp, err := c.roundTrip(ctx, toLeader, func(base string) (*http.Request, error) {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
		if err != nil {
			return nil, fmt.Errorf("rialto api: %w", err)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		return req, nil
	})
	if err != nil {
		var cv *tls.CertificateVerificationError
		if errors.As(err, &cv) {
			return fmt.Errorf("rialto api: %s %s: %w: %v", method, path, ErrUntrustedServer, cv.Err)
		}
		if remoteUnknownCA(err) {
			return fmt.Errorf("rialto api: %s %s: %w: %w", method, path, ErrUntrustedClient, err)
		}
		return fmt.Errorf("rialto api: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return ErrorOf(resp)
	}
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	// One read into a reused buffer, then one decode: cheaper than a
	// json.Decoder, which grows a buffer of its own for every answer.
	buf := bodyBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 64<<10 {
			bodyBufs.Put(buf)
		}
	}()
	buf.Reset()
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return fmt.Errorf("rialto api: read %s %s: %w", method, path, err)
	}
	if err := json.Unmarshal(buf.Bytes(), out); err != nil {
		return fmt.Errorf("rialto api: decode %s %s: %w", method, path, err)
	}
	return nil
}

// ErrorOf is the *Error of an error answer (a status not 2xx) of the API:
// its body's code and message, or, when the body is not the API's (a
// proxy's, a plain HTTP server's), Plain with the code of its status
// (CodeOfStatus) and the body as the message. It reads resp.Body (at most
// 1 MiB of it) and leaves it open.
func ErrorOf(resp *http.Response) *Error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	eb, ok := apiErrorBody(data)
	if !ok {
		return &Error{Status: resp.StatusCode, Code: CodeOfStatus(resp.StatusCode), Message: strings.TrimSpace(string(data)), Plain: true}
	}
	return &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
}

// apiErrorBody decodes data, an error answer's body, as the API's error
// body; ok is false when it is not one (no JSON, or no code).
func apiErrorBody(data []byte) (eb ErrorBody, ok bool) {
	if json.Unmarshal(data, &eb) != nil || eb.Error.Code == "" {
		return ErrorBody{}, false
	}
	return eb, true
}

var bodyBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Join registers an agent (c must carry the bootstrap token).
func (c *Client) Join(ctx context.Context, r JoinRequest) (JoinResponse, error) {
	var out JoinResponse
	err := c.Do(ctx, http.MethodPost, "/v1/join", r, &out)
	return out, err
}

// NodeCertificate asks for a new certificate of a node, before its
// current one expires (c must carry the node credential; a control plane
// with a cluster CA also wants the current certificate presented over TLS).
func (c *Client) NodeCertificate(ctx context.Context, nodeID string, r NodeCertificateRequest) (NodeCertificateResponse, error) {
	var out NodeCertificateResponse
	err := c.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(nodeID)+"/certificate", r, &out)
	return out, err
}

// CACertificates returns the cluster CA's certificates the control plane
// trusts, without them (only their hash) when their hash is caHash, and
// its revocation list when the number of the caller's (crlNumber: 0 for
// none) is lower.
func (c *Client) CACertificates(ctx context.Context, caHash string, crlNumber int64) (CACertificates, error) {
	var out CACertificates
	q := url.Values{"ca_hash": {caHash}, "crl_number": {strconv.FormatInt(crlNumber, 10)}}
	err := c.Do(ctx, http.MethodGet, "/v1/ca-certificates?"+q.Encode(), nil, &out)
	return out, err
}

// Heartbeat reports an agent's health (c must carry the node credential).
func (c *Client) Heartbeat(ctx context.Context, nodeID string, h Heartbeat) (HeartbeatResponse, error) {
	var out HeartbeatResponse
	err := c.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(nodeID)+"/heartbeat", h, &out)
	return out, err
}

// RemoveNode removes a node (an admin token): its leases become lost, its
// certificates are revoked and its credential forgotten. A node that
// still heartbeats is refused (409) unless force.
func (c *Client) RemoveNode(ctx context.Context, id string, force bool) (NodeRemoval, error) {
	var out NodeRemoval
	p := "/v1/nodes/" + url.PathEscape(id)
	if force {
		p += "?force=true"
	}
	err := c.Do(ctx, http.MethodDelete, p, nil, &out)
	return out, err
}

// Nodes lists nodes.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	var out []Node
	return out, c.Do(ctx, http.MethodGet, "/v1/nodes", nil, &out)
}

// MetricsTargets returns the Prometheus scrape targets: the control plane
// and every node's agent.
func (c *Client) MetricsTargets(ctx context.Context) ([]MetricsTargetGroup, error) {
	var out []MetricsTargetGroup
	return out, c.Do(ctx, http.MethodGet, "/v1/metrics-targets", nil, &out)
}

// Node returns one node.
func (c *Client) Node(ctx context.Context, id string) (Node, error) {
	var out Node
	return out, c.Do(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(id), nil, &out)
}

// Devices lists devices.
func (c *Client) Devices(ctx context.Context) ([]Device, error) {
	var out []Device
	return out, c.Do(ctx, http.MethodGet, "/v1/devices", nil, &out)
}

// Topology returns nodes and links.
func (c *Client) Topology(ctx context.Context) (Topology, error) {
	var out Topology
	return out, c.Do(ctx, http.MethodGet, "/v1/topology", nil, &out)
}

// Leases lists the live leases (reserved, active, releasing): those that
// hold or are taking devices. The answer stays as small as what is lent
// now, however long the history.
func (c *Client) Leases(ctx context.Context) ([]Lease, error) {
	return c.ListLeases(ctx, LeaseQuery{})
}

// AllLeases lists every lease, including ended ones (released, expired,
// failed, lost): the whole history, oldest first.
func (c *Client) AllLeases(ctx context.Context) ([]Lease, error) {
	return c.ListLeases(ctx, LeaseQuery{All: true})
}

// LeaseQuery selects leases for ListLeases; its zero value lists the
// live ones of every kind the token may see.
type LeaseQuery struct {
	All    bool   // also ended leases: the whole history
	Kind   Kind   // only this kind's
	Tenant string // only this tenant's (an admin token; a tenant's may name only its own)
}

// ListLeases lists the leases q selects, oldest first; the control plane
// applies the filters.
func (c *Client) ListLeases(ctx context.Context, q LeaseQuery) ([]Lease, error) {
	v := url.Values{}
	if !q.All {
		v.Set("live", "1")
	}
	if q.Kind != "" {
		v.Set("kind", string(q.Kind))
	}
	if q.Tenant != "" {
		v.Set("tenant", q.Tenant)
	}
	query := v.Encode()
	if query != "" {
		query += "&"
	}
	return c.leasePages(ctx, query)
}

// leasePage is the page size of the lease listings.
const leasePage = 1000

// leasePages reads GET /v1/leases?<query> page by page (each a
// request; a lease that ends or is pruned meanwhile may be missing, none
// is listed twice).
func (c *Client) leasePages(ctx context.Context, query string) ([]Lease, error) {
	out := []Lease{}
	var after Cursor
	for {
		var page []Lease
		path := "/v1/leases?" + query + "limit=" + strconv.Itoa(leasePage)
		if !after.IsZero() {
			path += "&after=" + url.QueryEscape(after.String())
		}
		if err := c.Do(ctx, http.MethodGet, path, nil, &page); err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(page) < leasePage {
			return out, nil
		}
		after = LeaseCursor(page[len(page)-1])
	}
}

// Lease returns one lease.
func (c *Client) Lease(ctx context.Context, id string) (Lease, error) {
	var out Lease
	return out, c.Do(ctx, http.MethodGet, "/v1/leases/"+url.PathEscape(id), nil, &out)
}

// CreateLease places, reserves and activates a lease. A non-empty
// r.IdempotencyKey makes retries return the same lease. The returned
// lease's Plan has no Explanation (the server leaves it out of action
// answers); Lease(ctx, id) returns it with one.
func (c *Client) CreateLease(ctx context.Context, r LeaseRequest) (Lease, error) {
	var out Lease
	var hdr []string
	if r.IdempotencyKey == "" && len(c.ep.bases) > 1 {
		// It may be retried on another replica: make the retry safe.
		r.IdempotencyKey = newIdempotencyKey()
	}
	if r.IdempotencyKey != "" {
		hdr = []string{"Idempotency-Key", r.IdempotencyKey}
	}
	return out, c.do(ctx, true, http.MethodPost, "/v1/leases", r, &out, hdr...)
}

// Explain returns the plan a request would get, reserving nothing.
func (c *Client) Explain(ctx context.Context, r LeaseRequest) (Plan, error) {
	var out Plan
	return out, c.Do(ctx, http.MethodPost, "/v1/explain", r, &out)
}

// RenewLease extends a lease's TTL.
func (c *Client) RenewLease(ctx context.Context, id string, ttlSeconds int64) (Lease, error) {
	var out Lease
	return out, c.Do(ctx, http.MethodPost, "/v1/leases/"+url.PathEscape(id)+"/renew", RenewRequest{TTLSeconds: ttlSeconds}, &out)
}

// ReleaseLease ends a lease.
func (c *Client) ReleaseLease(ctx context.Context, id string) (Lease, error) {
	var out Lease
	return out, c.do(ctx, true, http.MethodPost, "/v1/leases/"+url.PathEscape(id)+"/release", nil, &out)
}

// Events returns audit events with ID greater than since.
func (c *Client) Events(ctx context.Context, since int64) ([]Event, error) {
	var out []Event
	return out, c.Do(ctx, http.MethodGet, fmt.Sprintf("/v1/events?since=%d", since), nil, &out)
}

// Profiles lists device profiles.
func (c *Client) Profiles(ctx context.Context) ([]Profile, error) {
	var out []Profile
	return out, c.Do(ctx, http.MethodGet, "/v1/profiles", nil, &out)
}

// PutProfile stores a measured or declared profile.
func (c *Client) PutProfile(ctx context.Context, p Profile) (Profile, error) {
	var out Profile
	return out, c.Do(ctx, http.MethodPut, "/v1/profiles/"+url.PathEscape(p.Model), p, &out)
}

// Usage returns the devices' measured use: what they hold and their
// bandwidth over the last minutes.
func (c *Client) Usage(ctx context.Context) ([]DeviceUsage, error) {
	var out []DeviceUsage
	return out, c.Do(ctx, http.MethodGet, "/v1/usage", nil, &out)
}

// LoginLink asks for a one-time dashboard login link for c's token (a
// tenant token); the browser URL is the base URL followed by its Path.
func (c *Client) LoginLink(ctx context.Context) (LoginLink, error) {
	var out LoginLink
	return out, c.Do(ctx, http.MethodPost, "/v1/login-links", nil, &out)
}

// BaseURL is the base URL of the control plane in use (of several, the
// one that answered last).
func (c *Client) BaseURL() string {
	_, b := c.ep.current()
	return b
}

// Whoami tells who c's token is.
func (c *Client) Whoami(ctx context.Context) (Whoami, error) {
	var out Whoami
	return out, c.Do(ctx, http.MethodGet, "/v1/whoami", nil, &out)
}

// MoveLease moves a lease (or one of its parts) to another lender while
// it is used; the answer lists the moves started (GET them to follow).
func (c *Client) MoveLease(ctx context.Context, id string, r MoveRequest) ([]Move, error) {
	var out []Move
	return out, c.Do(ctx, http.MethodPost, "/v1/leases/"+url.PathEscape(id)+"/move", r, &out)
}

// Moves lists the moves under way and those that ended recently, of one
// lease when leaseID is not empty.
func (c *Client) Moves(ctx context.Context, leaseID string) ([]Move, error) {
	var out []Move
	path := "/v1/moves"
	if leaseID != "" {
		path += "?lease=" + url.QueryEscape(leaseID)
	}
	return out, c.Do(ctx, http.MethodGet, path, nil, &out)
}

// Move returns one move.
func (c *Client) Move(ctx context.Context, id string) (Move, error) {
	var out Move
	return out, c.Do(ctx, http.MethodGet, "/v1/moves/"+url.PathEscape(id), nil, &out)
}

// CordonNode stops placing new parts on a node (by ID or name); its
// leases stay. UncordonNode undoes it.
func (c *Client) CordonNode(ctx context.Context, id string) (Node, error) {
	var out Node
	return out, c.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(id)+"/cordon", nil, &out)
}

// UncordonNode lets placement use a cordoned node again.
func (c *Client) UncordonNode(ctx context.Context, id string) (Node, error) {
	var out Node
	return out, c.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(id)+"/uncordon", nil, &out)
}

// DrainNode cordons a node and moves every lease off it.
func (c *Client) DrainNode(ctx context.Context, id string, r DrainRequest) (Drain, error) {
	var out Drain
	return out, c.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(id)+"/drain", r, &out)
}

// NodeDrain returns a node's latest drain.
func (c *Client) NodeDrain(ctx context.Context, id string) (Drain, error) {
	var out Drain
	return out, c.Do(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(id)+"/drain", nil, &out)
}
