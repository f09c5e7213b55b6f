package controlplane

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/networds"
)

// HTTPLender is the default Lender: it calls the agent's lease-execution API
// at node.AgentURL with the node's agent key as bearer token.
type HTTPLender struct {
	hc *http.Client
	// client, if set, picks the client for a node (TLSLender's, which
	// checks the agent's identity); else hc serves every node.
	client  func(api.Node) (*http.Client, error)
	clients clientCache
}

// newLenderTransport is a transport with pooled keep-alive connections;
// deadlines come from the caller's context.
func newLenderTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
}

// NewHTTPLender returns a Lender using hc (nil: a client with pooled
// keep-alive connections; deadlines come from the caller's context).
func NewHTTPLender(hc *http.Client) *HTTPLender {
	if hc == nil {
		hc = &http.Client{Transport: newLenderTransport()}
	}
	return &HTTPLender{hc: hc}
}

// clientCache keeps one HTTP client per node.
type clientCache struct {
	mu sync.Mutex
	m  map[string]*http.Client
}

func (c *clientCache) get(key string, mk func() *http.Client) *http.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	if hc, ok := c.m[key]; ok {
		return hc
	}
	if c.m == nil {
		c.m = map[string]*http.Client{}
	}
	hc := mk()
	c.m[key] = hc
	return hc
}

// lenderBufs holds the buffers lender answers are read into.
var lenderBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Prepare asks the lender to prepare an export.
func (h *HTTPLender) Prepare(ctx context.Context, node api.Node, agentKey string, req api.PrepareRequest) (api.PrepareResponse, error) {
	var out api.PrepareResponse
	err := h.post(ctx, node, agentKey, "/agent/v1/prepare", req, &out)
	if err == nil && out.URI == "" {
		err = fmt.Errorf("controlplane: agent %s confirmed without a URI", node.ID)
	}
	return out, err
}

// Teardown asks the lender to stop serving a lease.
func (h *HTTPLender) Teardown(ctx context.Context, node api.Node, agentKey string, req api.TeardownRequest) error {
	return h.post(ctx, node, agentKey, "/agent/v1/teardown", req, nil)
}

func (h *HTTPLender) post(ctx context.Context, node api.Node, agentKey, path string, in, out any) error {
	hc := h.hc
	if h.client != nil {
		var err error
		if hc, err = h.client(node); err != nil {
			return err
		}
	}
	return postVia(ctx, hc, node, agentKey, path, in, out)
}

// postVia is post through the HTTP client hc.
func postVia(ctx context.Context, hc *http.Client, node api.Node, agentKey, path string, in, out any) error {
	if node.AgentURL == "" {
		return fmt.Errorf("controlplane: node %s has no agent URL", node.ID)
	}
	// The request body is not pooled: the transport may still read it
	// after Do returns.
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("controlplane: encode %s: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(node.AgentURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("controlplane: agent %s: %w", node.ID, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+agentKey)
	resp, err := hc.Do(req)
	if err != nil {
		return &lenderError{node: node, path: path, err: err}
	}
	defer resp.Body.Close()
	buf := lenderBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 64<<10 {
			lenderBufs.Put(buf)
		}
	}()
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, 1<<20)); err != nil {
		return &lenderError{node: node, path: path, err: err}
	}
	data := buf.Bytes()
	if resp.StatusCode/100 != 2 {
		return answerError(node, path, resp.Status, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return &lenderError{node: node, path: path, err: fmt.Errorf("decode: %w", err)}
		}
	}
	return nil
}

// lenderError is a lender's error answer to a call of its API (status
// set), or the call's failure (err). Its Error is the whole story, for
// the control plane's log; plain is what a user reads (plainText).
type lenderError struct {
	node   api.Node
	path   string // the API's path called
	status string // the answer's HTTP status; "" if the call failed
	code   string // the answer's error code, if it had one
	msg    string // the answer's message (at most 200 bytes)
	err    error  // why the call failed
}

// answerError is the lenderError of an error answer whose body is data.
func answerError(node api.Node, path, status string, data []byte) *lenderError {
	e := &lenderError{node: node, path: path, status: status, msg: strings.TrimSpace(string(data))}
	var eb api.ErrorBody
	if json.Unmarshal(data, &eb) == nil && eb.Error.Message != "" {
		e.code, e.msg = eb.Error.Code, eb.Error.Message
	}
	if len(e.msg) > 200 {
		e.msg = e.msg[:200]
	}
	return e
}

func (e *lenderError) Error() string {
	if e.status == "" {
		return fmt.Sprintf("controlplane: agent %s %s: %v", e.node.ID, e.path, e.err)
	}
	msg := e.msg
	if e.code != "" {
		msg = e.code + ": " + msg
	}
	return fmt.Sprintf("controlplane: agent %s %s: %s: %s", e.node.ID, e.path, e.status, msg)
}

func (e *lenderError) Unwrap() error { return e.err }

// plain is the error as a user reads it: the lender by name, and what it
// answered in its words (without the packages they name: plainWords) or
// why it could not be asked. No path, status or code: "lender node2
// refused the part: device disk0 cannot be opened (no such file or
// directory)" (the agent answers in words for the tenant: agent.Refusal).
func (e *lenderError) plain() string {
	name := e.node.Name
	if name == "" {
		name = e.node.ID
	}
	if e.status != "" {
		return fmt.Sprintf("lender %s refused %s: %s", name, lenderCall(e.path), plainWords(e.msg))
	}
	var ue *url.Error
	switch {
	case errors.Is(e.err, context.DeadlineExceeded):
		return fmt.Sprintf("lender %s did not answer in time", name)
	case errors.Is(e.err, context.Canceled):
		return fmt.Sprintf("the call to lender %s was given up", name)
	}
	if w, ok := connWords(name, e.err); ok {
		return w
	}
	if errors.As(e.err, &ue) {
		return fmt.Sprintf("lender %s could not be reached: %s", name, plainWords(ue.Err.Error()))
	}
	return fmt.Sprintf("lender %s: %s", name, plainWords(e.err.Error()))
}

// connWords says what err, the failure of a call to lender name, was
// when it is the network's or TLS's (networds): "lender n2 could not be
// reached: connection refused", "lender n2's certificate was not accepted
// (signed by an unknown authority)". The addresses and x509's words are
// the control plane's log's.
func connWords(name string, err error) (string, bool) {
	kind, words := networds.Describe(err)
	switch kind {
	case networds.Unreachable:
		return fmt.Sprintf("lender %s could not be reached: %s", name, words), true
	case networds.Broken:
		return fmt.Sprintf("the connection to lender %s broke: %s", name, words), true
	case networds.PeerCertificate:
		return fmt.Sprintf("lender %s's certificate was not accepted (%s)", name, words), true
	case networds.OwnCertificate:
		return fmt.Sprintf("lender %s did not accept the control plane's certificate (%s)", name, words), true
	case networds.NotTLS:
		return fmt.Sprintf("lender %s does not speak TLS (its agent URL says it does)", name), true
	}
	return "", false
}

// lenderCall says what a call of the agent API at path asks for.
func lenderCall(path string) string {
	switch {
	case path == "/agent/v1/prepare", strings.HasPrefix(path, "/agent/v1/transfers"):
		return "the part"
	case path == "/agent/v1/teardown":
		return "the teardown"
	case path == "/agent/v1/role-config":
		return "to tell the slot's role"
	}
	return "the call"
}

// nodeCache keeps the node records lender calls need (address, agent key,
// state), so that a lease cycle does not read and decode its lenders'
// rows every time. It is dropped by invalidate, which every join, rejoin
// and liveness change calls.
type nodeCache struct {
	mu  sync.Mutex
	gen uint64
	m   map[string]store.NodeRecord
}

// nodeRecord returns a node's record, from the cache when it has it.
func (s *Server) nodeRecord(ctx context.Context, id string) (store.NodeRecord, error) {
	c := &s.nodes
	c.mu.Lock()
	n, ok := c.m[id]
	gen := c.gen
	c.mu.Unlock()
	if ok {
		return n, nil
	}
	n, err := s.st.Node(ctx, id)
	if err != nil {
		return n, err
	}
	c.mu.Lock()
	if c.gen == gen {
		if c.m == nil {
			c.m = map[string]store.NodeRecord{}
		}
		c.m[id] = n
	}
	c.mu.Unlock()
	return n, nil
}

// prepareParts asks every part's lender to prepare its export, in parallel,
// each within PrepareTimeout. It returns the URIs, or the nodes that failed
// (node ID → why, in plain words naming the lender: plainText; the whole
// error is logged), and the parts whose lenders refused them only because
// they are still wiping their ranges after an earlier lease.
// req supplies what the lease record does not keep: the role and its
// config (the caps are the lease's); placement counts the lease's
// placements (api.PrepareRequest.Placement).
func (s *Server) prepareParts(ctx context.Context, l api.Lease, req api.LeaseRequest, placement int) ([]string, map[string]string, []api.Part) {
	uris := make([]string, len(l.Parts))
	errs := make([]error, len(l.Parts))
	nodes := map[string]store.NodeRecord{}
	failed := map[string]string{}
	for _, p := range l.Parts {
		if _, ok := nodes[p.NodeID]; ok {
			continue
		}
		n, err := s.nodeRecord(ctx, p.NodeID)
		if err != nil {
			s.log.Warn("lender did not confirm: its record", "lease", l.ID, "node", p.NodeID, "err", err)
			failed[p.NodeID] = "lender " + p.NodeID + ": " + plainText(err)
			continue
		}
		nodes[p.NodeID] = n
	}
	if len(failed) > 0 {
		return nil, failed, nil
	}
	devNames := s.res.DeviceNames(ctx)
	prepare := func(i int, p api.Part) {
		// The call's bound starts before Now is stamped: the lender
		// deducts it (TimeoutSeconds) from the time left.
		pctx, cancel := context.WithTimeout(ctx, s.cfg.PrepareTimeout)
		defer cancel()
		n := nodes[p.NodeID]
		start := time.Now()
		resp, err := s.lender.Prepare(pctx, n.Node, n.AgentKey, api.PrepareRequest{
			LeaseID: l.ID, Kind: l.Kind, Mode: l.Mode, DeviceID: p.DeviceID, DeviceName: devNames[p.DeviceID],
			Offset: p.Offset, Length: p.Length, Export: partExport(l.Credential, i, placement), Role: req.Role,
			RoleConfig: req.RoleConfig, Gateway: req.Kind == api.KindAccel && req.Mode == api.ModeShared,
			BandwidthCap: l.BandwidthCap, IOPSCap: l.IOPSCap, ExpiresAt: l.ExpiresAt, Now: s.now(),
			TimeoutSeconds: s.cfg.PrepareTimeout.Seconds(), Placement: placement,
		})
		s.m.lenderLatency.WithLabelValues("prepare").Observe(time.Since(start).Seconds())
		if err == nil && resp.URI == "" {
			err = errors.New("confirmed without a URI")
		}
		uris[i], errs[i] = resp.URI, err
	}
	if len(l.Parts) == 1 {
		prepare(0, l.Parts[0]) // the usual case needs no goroutine
	} else {
		var wg sync.WaitGroup
		for i, p := range l.Parts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				prepare(i, p)
			}()
		}
		wg.Wait()
	}
	var wiping []api.Part
	other := map[string]bool{} // lenders that failed otherwise
	for i, err := range errs {
		if err == nil {
			continue
		}
		id := l.Parts[i].NodeID
		s.log.Warn("lender did not confirm; skipping it", "lease", l.ID, "node", id, "err", err)
		name := nodes[id].Name
		if name == "" {
			name = id
		}
		why := plainText(err)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			why = fmt.Sprintf("lender %s gave no confirmation within %v", name, s.cfg.PrepareTimeout)
		case !strings.HasPrefix(why, "lender "):
			why = "lender " + name + ": " + why // each reason names its lender
		}
		if strings.Contains(why, api.RangeBeingWiped) || strings.Contains(why, api.RangeStillServed) {
			wiping = append(wiping, l.Parts[i])
			if _, other := failed[id]; other {
				continue // the other failure names the lender
			}
		} else {
			other[id] = true
		}
		failed[id] = why
	}
	// A lender that refused only ranges it is still wiping, or still
	// serves for another lease (a lost lease's export it has not been told
	// to tear down yet), is not to be skipped: the lease is placed around
	// those ranges (wiping.go).
	wiping = slices.DeleteFunc(wiping, func(p api.Part) bool { return other[p.NodeID] })
	if len(failed) > 0 {
		return nil, failed, wiping
	}
	return uris, nil, nil
}

// partExport is the export name (the data-plane secret) of part i of the
// lease whose credential is given, as prepared for placement (1, 2, …
// as the lease is placed again after lenders that did not confirm):
// HMAC-SHA256(credential, "part/"+i), and "/placement/"+placement after
// the first, base64url. The lender of one part learns nothing from it
// about the names of the other parts; the borrower gets every part's
// name in its URI. A placement's names are its own: a lender skipped in
// one round, which was sent its part's name all the same, or the lender
// of another part there, learns no name a later placement serves.
func partExport(credential string, i, placement int) string {
	m := hmac.New(sha256.New, []byte(credential))
	m.Write([]byte("part/" + strconv.Itoa(i)))
	if placement > 1 {
		m.Write([]byte("/placement/" + strconv.Itoa(placement)))
	}
	return "rlp_" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// teardownParts asks each lender of l (once per node) to stop serving it,
// in parallel, each within PrepareTimeout. Failures are logged: a lender
// that missed it is told again by its next heartbeat response.
func (s *Server) teardownParts(ctx context.Context, l api.Lease, placement int, skipNodes ...string) {
	seen := map[string]bool{}
	for _, n := range skipNodes {
		seen[n] = true
	}
	var lenders []store.NodeRecord
	for _, p := range l.Parts {
		if seen[p.NodeID] || p.Lost() {
			continue // a lost part's lender is told by its heartbeat answer
		}
		seen[p.NodeID] = true
		n, err := s.nodeRecord(ctx, p.NodeID)
		if err != nil {
			s.log.Warn("teardown: node", "lease", l.ID, "node", p.NodeID, "err", err)
			continue
		}
		if n.State == api.NodeDown {
			continue
		}
		lenders = append(lenders, n)
	}
	teardown := func(n store.NodeRecord) {
		tctx, cancel := context.WithTimeout(ctx, s.cfg.PrepareTimeout)
		defer cancel()
		start := time.Now()
		err := s.lender.Teardown(tctx, n.Node, n.AgentKey, api.TeardownRequest{LeaseID: l.ID, Placement: placement})
		s.m.lenderLatency.WithLabelValues("teardown").Observe(time.Since(start).Seconds())
		if err != nil {
			s.log.Warn("teardown failed; the lender's heartbeat will reconcile", "lease", l.ID, "node", n.ID, "err", err)
			return // its ranges stay marked as being wiped until a heartbeat says otherwise
		}
		if placement == 0 {
			// The lender answers a teardown once its wipes are done.
			s.wiped(ctx, l.ID, n.ID)
		}
	}
	if len(lenders) == 1 {
		teardown(lenders[0]) // the usual case needs no goroutine
		return
	}
	var wg sync.WaitGroup
	for _, n := range lenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			teardown(n)
		}()
	}
	wg.Wait()
}
