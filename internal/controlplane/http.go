package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/httpapi"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/httpx"
	"github.com/rialto-project/rialto/internal/pki"
)

// handlerFunc is an API handler: it returns the status and value to answer
// with, or an error that apiError maps.
type handlerFunc func(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error)

type route struct {
	httpapi.Route
	access access
	h      handlerFunc
}

var (
	readErrors = []int{401, 403, 500}
	// listErrors are readErrors with 400, for lists that take a query.
	listErrors = []int{400, 401, 403, 500}
	// explainParam is the lease actions' ?explain (see brief).
	explainParam = []httpapi.Param{{Name: "explain", Type: "boolean", Description: "include the plan's explanation (GET /v1/leases/{id} always has it)"}}
	createErrors = []int{400, 401, 403, 409, 422, 429, 503, 500}
)

func (s *Server) routeTable() []route {
	rts := []route{
		{httpapi.Route{Method: "POST", Path: "/v1/join", Summary: "Register an agent's node and devices; returns the node credential.",
			Request: api.JoinRequest{}, Response: api.JoinResponse{}, Errors: []int{400, 401, 403, 409, 500}}, accessBootstrap, s.hJoin},
		{httpapi.Route{Method: "POST", Path: "/v1/nodes/{id}/heartbeat", Summary: "Report an agent's health, links and served leases; answers what to tear down.",
			Request: api.Heartbeat{}, Response: api.HeartbeatResponse{}, Errors: []int{400, 401, 403, 404, 500}}, accessNode, s.hHeartbeat},
		{httpapi.Route{Method: "GET", Path: "/v1/nodes", Summary: "List nodes.", Response: []api.Node{}, Errors: readErrors}, accessReader, s.hNodes},
		{httpapi.Route{Method: "GET", Path: "/v1/nodes/{id}", Summary: "Show a node.", Response: api.Node{}, Errors: []int{401, 403, 404, 500}}, accessReader, s.hNode},
		{httpapi.Route{Method: "GET", Path: "/v1/devices", Summary: "List devices (the Resource Registration Table).", Response: []api.Device{}, Errors: readErrors}, accessReader, s.hDevices},
		{httpapi.Route{Method: "GET", Path: "/v1/topology", Summary: "Nodes and measured links (the Topology Status Table).", Response: api.Topology{}, Errors: readErrors}, accessReader, s.hTopology},
		{httpapi.Route{Method: "GET", Path: "/v1/leases", Summary: "List the caller's leases (an admin token sees all).", Response: []api.Lease{},
			Query: []httpapi.Param{{Name: "state", Type: "string", Description: "only leases in this state"},
				{Name: "kind", Type: "string", Description: "only leases of this kind (block, memory, accel, nic)"},
				{Name: "tenant", Type: "string", Description: "only this tenant's leases (an admin token; a tenant's token may name only its own tenant)"},
				{Name: "live", Type: "boolean", Description: "only leases that hold or are taking devices (reserved, active, releasing)"},
				{Name: "limit", Type: "integer", Description: "at most this many (default and maximum 1000); a full page has a Link header (rel=next) to the next"},
				{Name: "after", Type: "string", Description: "the leases after this cursor, in the listing's order (creation time, then ID): the Link header's, or <created_at in Unix nanoseconds>.<id> of a page's last lease"}}, Errors: listErrors}, accessTenant, s.hLeases},
		{httpapi.Route{Method: "POST", Path: "/v1/leases", Summary: "Place, reserve and activate a lease (two-phase with the lenders).",
			Request: api.LeaseRequest{}, Response: api.Lease{}, Status: http.StatusCreated, Also: []int{http.StatusOK}, Query: explainParam, Errors: createErrors}, accessTenant, s.hCreateLease},
		{httpapi.Route{Method: "GET", Path: "/v1/leases/{id}", Summary: "Show a lease.", Response: api.Lease{}, Errors: []int{401, 403, 404, 500}}, accessTenant, s.hLease},
		{httpapi.Route{Method: "POST", Path: "/v1/leases/{id}/renew", Summary: "Extend a lease's TTL from now.",
			Request: api.RenewRequest{}, Response: api.Lease{}, Query: explainParam, Errors: []int{400, 401, 403, 404, 409, 500}}, accessTenant, s.hRenew},
		{httpapi.Route{Method: "POST", Path: "/v1/leases/{id}/release", Summary: "Release a lease; lenders tear its exports down.",
			Response: api.Lease{}, Query: explainParam, Errors: []int{400, 401, 403, 404, 409, 500}}, accessTenant, s.hRelease},
		{httpapi.Route{Method: "POST", Path: "/v1/explain", Summary: "Dry run: the plan a lease request would get; reserves nothing.",
			Request: api.LeaseRequest{}, Response: api.Plan{}, Errors: []int{400, 401, 403, 409, 500}}, accessTenant, s.hExplain},
		{httpapi.Route{Method: "GET", Path: "/v1/events", Summary: "Audit events after an ID, oldest first (a tenant sees its own leases' and the cluster's; an admin all); with follow=1, a stream of them that stays open (docs/api.md).", Response: []api.Event{},
			Query: []httpapi.Param{{Name: "since", Type: "integer", Description: "return events with a greater ID (410 if events after it were pruned: history retention)"},
				{Name: "limit", Type: "integer", Description: "at most this many (default and maximum 1000)"},
				{Name: "follow", Type: "boolean", Description: "stream the events after since, then each new one as it is appended (SSE with Accept: text/event-stream or format=sse, else newline-delimited JSON); Last-Event-ID resumes"},
				{Name: "format", Type: "string", Description: "with follow: sse or ndjson"}}, Streams: []string{"text/event-stream", "application/x-ndjson"},
			Errors: []int{400, 401, 403, 410, 429, 500, 503}}, accessReader, s.hEvents},
		{httpapi.Route{Method: "GET", Path: "/v1/profiles", Summary: "List device profiles.", Response: []api.Profile{}, Errors: readErrors}, accessReader, s.hProfiles},
		{httpapi.Route{Method: "PUT", Path: "/v1/profiles/{model}", Summary: "Store a measured or declared device profile. A node's token may store only profiles of models of its own devices (403 otherwise).",
			Request: api.Profile{}, Response: api.Profile{}, Errors: []int{400, 401, 403, 500}}, accessWriter, s.hPutProfile},
		{httpapi.Route{Method: "GET", Path: "/v1/usage", Summary: "Devices' measured use: what they hold and their data-plane bandwidth over the last minutes (from heartbeats; in memory).",
			Response: []api.DeviceUsage{}, Errors: readErrors}, accessReader, s.hUsage},
		{httpapi.Route{Method: "GET", Path: "/v1/metrics-targets", Summary: "Prometheus scrape targets, in the format of Prometheus's HTTP service discovery (http_sd_configs): this control plane and every node's agent, each serving GET /metrics (docs/operations.md).",
			Response: []api.MetricsTargetGroup{}, Errors: readErrors}, accessReader, s.hMetricsTargets},
		{httpapi.Route{Method: "GET", Path: "/v1/whoami", Summary: "Who the token is.", Response: api.Whoami{}, Errors: readErrors}, accessReader, s.hWhoami},
		{httpapi.Route{Method: "POST", Path: "/v1/login-links", Summary: "A one-time link that signs a browser in to the dashboard (/ui/) as this token (docs/ui.md).",
			Response: api.LoginLink{}, Status: http.StatusCreated, Errors: []int{401, 403, 500}}, accessTenant, s.hLoginLink},
	}
	rts = append(rts, route{httpapi.Route{Method: "DELETE", Path: "/v1/nodes/{id}",
		Summary:  "Remove a node (admin): its leases become lost, its certificates are revoked, its credential is forgotten; a node still heartbeating needs force.",
		Response: api.NodeRemoval{}, Query: []httpapi.Param{{Name: "force", Type: "boolean", Description: "remove a node that still heartbeats"}},
		Errors: []int{400, 401, 403, 404, 409, 500, 503}}, accessTenant, s.hRemoveNode})
	if s.cfg.CA != nil {
		// Only a control plane with a cluster CA issues node certificates
		// and hands out its CA certificates.
		rts = append(rts, route{httpapi.Route{Method: "POST", Path: "/v1/nodes/{id}/certificate",
			Summary: "Renew a node's certificate from a CSR (the call presents the current certificate over mutual TLS).",
			Request: api.NodeCertificateRequest{}, Response: api.NodeCertificateResponse{}, Errors: []int{400, 401, 403, 404, 500}}, accessNode, s.hNodeCertificate},
			route{httpapi.Route{Method: "GET", Path: "/v1/ca-certificates",
				Summary:  "The cluster CA's certificates the control plane trusts (PEM), unless their hash is ca_hash, and its revocation list when newer than crl_number: a long-running client follows a CA rotation and the revocations with them.",
				Response: api.CACertificates{}, Query: []httpapi.Param{{Name: "ca_hash", Type: "string", Description: "the hash of the certificates the caller holds (hex SHA-256 of their DER, newest first): the answer leaves them out when it is theirs"},
					{Name: "crl_number", Type: "integer", Description: "the number of the revocation list the caller holds (0: none): the answer carries the CA's (crl) when its number is higher; without it, never"}},
				Errors: []int{400, 401, 403, 500, 503}}, accessReader, s.hCACertificates})
	}
	return rts
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	table := append(s.routeTable(), s.moveRoutes()...)
	docRoutes := make([]httpapi.Route, 0, len(table)+3)
	for _, rt := range table {
		rt.Auth = rt.access.String()
		docRoutes = append(docRoutes, rt.Route)
		mux.Handle(rt.Method+" "+rt.Path, s.wrap(rt))
	}
	docRoutes = append(docRoutes,
		httpapi.Route{Method: "GET", Path: "/v1/openapi.json", Summary: "This document.", Response: httpapi.Content{Type: "application/json", Schema: map[string]any{"type": "object"}}},
		httpapi.Route{Method: "GET", Path: "/metrics", Summary: "Prometheus metrics.", Response: "text/plain"},
		httpapi.Route{Method: "GET", Path: "/healthz", Summary: "Liveness of the control plane and its store.", Response: "text/plain", Errors: []int{503}},
		httpapi.Route{Method: "GET", Path: "/ui/", Summary: "The web dashboard (docs/ui.md); sign in with a login link or a token.", Response: "text/html"},
		httpapi.Route{Method: "GET", Path: "/redfish/v1", Summary: "DMTF Redfish service root: the CompositionService facade (docs/redfish.md).", Response: httpapi.Content{Type: "application/json", Schema: map[string]any{"type": "object"}}},
	)
	doc, err := httpapi.OpenAPI("Rialto control plane", "v1", docRoutes, api.ErrorBody{})
	if err != nil {
		panic("controlplane: openapi: " + err.Error()) // static table; a test covers it
	}
	s.openapi = doc
	mux.Handle("GET /v1/openapi.json", s.instrument("/v1/openapi.json", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(s.openapi)
	})))
	mux.Handle("GET /metrics", http.HandlerFunc(s.serveMetrics))
	mux.Handle("GET /healthz", s.instrument("/healthz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.st.Counts(r.Context()); err != nil {
			http.Error(w, "store unavailable", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})))
	// The Redfish facade calls the /v1 routes above in process (redfish.go).
	rf := s.redfishService(mux)
	mux.Handle("/redfish", s.instrument("redfish", rf))
	mux.Handle("/redfish/", s.instrument("redfish", rf))
	// The dashboard, too (ui.go).
	s.ui = s.uiService(mux)
	mux.Handle("/ui", s.instrument("ui", s.ui))
	mux.Handle("/ui/", s.instrument("ui", s.ui))
	mux.Handle("/", s.instrument("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, api.ErrorInfo{Code: api.CodeNotFound, Message: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)})
	})))
	return mux
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (s *Server) instrument(name string, h http.Handler) http.Handler {
	hist := s.m.latency.WithLabelValues(name)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		if sw.code == 0 {
			sw.code = http.StatusOK
		}
		hist.Observe(time.Since(start).Seconds())
		s.m.requests.WithLabelValues(name, strconv.Itoa(sw.code)).Inc()
	})
}

func writeError(w http.ResponseWriter, status int, info api.ErrorInfo) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="rialto"`)
	}
	httpx.WriteError(w, status, info.Code, info.Message)
}

// wrap authenticates, authorizes, runs the handler and maps its error.
func (s *Server) wrap(rt route) http.Handler {
	name := rt.Method + " " + rt.Path
	fwd := s.fwd != nil && forwards(name)
	return s.instrument(name, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		var p principal
		var err error
		if rt.access != accessPublic {
			p, err = s.authenticate(ctx, r)
			if err == nil && !rt.access.allows(p) {
				err = fmt.Errorf("%w: %s needs %s; this is %s", ErrForbidden, name, withArticle(rt.access.String()), withArticle(p.role.String()))
			}
		}
		if err == nil && fwd && s.forward(w, r, p) {
			return // the placement leader answered (forward.go)
		}
		if fwd {
			s.fwd.nameLeader(w, s.Leading())
		}
		var status int
		var out any
		if err == nil {
			status, out, err = rt.h(ctx, p, r, w)
		}
		if err != nil {
			if errors.Is(err, httpx.ErrBadBody) {
				err = fmt.Errorf("%w: %v", ErrInvalid, err)
			}
			if errors.Is(err, pki.ErrRevoked) {
				w.Header().Set("Connection", "close") // a revoked peer's connection ends here
			}
			code, info := apiError(err)
			if code >= 500 && code != http.StatusServiceUnavailable {
				s.log.Error("request failed", "route", name, "err", err)
			} else if code == http.StatusUnauthorized || code == http.StatusForbidden {
				s.log.Info("request refused", "route", name, "status", code, "who", p.fp)
			}
			writeError(w, code, info)
			return
		}
		if _, ok := out.(streamed); ok {
			return // the handler wrote its answer (stream.go)
		}
		httpx.WriteJSON(w, status, wireForm(out))
	}))
}

// maxBody is the request-body limit.
const maxBody = 1 << 20

// maxHeartbeatBody is a heartbeat's: it lists a lender's exports by part
// (api.Heartbeat.Exports), up to 65536 of them.
const maxHeartbeatBody = 16 << 20

// defaultBodyTimeout is Config.BodyTimeout's default.
const defaultBodyTimeout = 30 * time.Second

// bodyDeadline gives every request with a body Config.BodyTimeout to
// send it: the connection's read deadline is set before the handler runs
// and cleared once the body has been read to its end (or failed), so that
// the rest of the handler (a lease creation waits for its lenders) and a
// stream (GET /v1/events?follow=1, which has no body) are not cut. A body
// that does not arrive in time fails its read: the handler answers 400 and
// the connection closes. Deadlines are set on the network connection, in
// real time, whatever Config.Clock is.
func (s *Server) bodyDeadline(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout)) != nil {
			h.ServeHTTP(w, r) // not a network connection (a test's recorder)
			return
		}
		r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, timeout: s.cfg.BodyTimeout}
		h.ServeHTTP(w, r)
	})
}

// deadlineBody clears its connection's read deadline when the body ends,
// and words a body that did not arrive in time.
type deadlineBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration
	done    bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The deadline stays: the server's read of what is left of the
		// body, before it answers, fails at once and the connection
		// closes.
		b.done = true
		return n, fmt.Errorf("the body did not arrive within %s", b.timeout)
	}
	if err != nil && !b.done {
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// decode reads a request body strictly (httpx.DecodeJSON); with allowEmpty
// an empty or null body is no error and leaves v as it is.
//
// A body that names a field twice (also in other cases: Go's decoder
// matches names regardless of case, "kind" and "Kind" are one field) is
// refused: which of the two counts differs between parsers, and a proxy or
// an audit log that reads the other could be fooled.
func decode(w http.ResponseWriter, r *http.Request, allowEmpty bool, v any) error {
	return decodeLimit(w, r, allowEmpty, maxBody, v)
}

// decodeLimit is decode with a body limit of limit bytes.
func decodeLimit(w http.ResponseWriter, r *http.Request, allowEmpty bool, limit int64, v any) error {
	var body bytes.Buffer
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.TeeReader(r.Body, &body), r.Body}
	err := httpx.DecodeJSON(w, r, limit, v)
	if allowEmpty && errors.Is(err, httpx.ErrEmptyBody) {
		return nil
	}
	if err == nil {
		err = duplicateKey(body.Bytes())
	}
	return err
}

// duplicateKey refuses a JSON document with an object that has a key
// twice (compared without case, as encoding/json matches them). data
// decoded without error. It scans the bytes itself (encoding/json's
// Decoder.Token allocates for every token: it doubled the cost of a
// heartbeat's body): the keys of the objects open are kept lowered in one
// buffer, looked up one by one in an object with few keys, in a map in a
// larger one.
func duplicateKey(data []byte) error {
	type span struct{ a, b int }
	type open struct {
		object bool
		first  int // its first key in keys
		big    map[string]bool
	}
	const few = 16 // keys looked up one by one
	var (
		stack   []open
		keys    []span // the keys of the objects open, lowered in buf
		buf     []byte
		wantKey bool
	)
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '{':
			stack = append(stack, open{object: true, first: len(keys)})
			wantKey = true
		case '[':
			stack = append(stack, open{})
			wantKey = false
		case '}', ']':
			if len(stack) == 0 {
				return nil // not JSON: the decoder judged it
			}
			if top := stack[len(stack)-1]; top.object {
				if top.first < len(keys) {
					buf = buf[:keys[top.first].a]
				}
				keys = keys[:top.first]
			}
			stack = stack[:len(stack)-1]
			wantKey = false
		case ',':
			wantKey = len(stack) > 0 && stack[len(stack)-1].object
		case '"':
			j, plain := i+1, true
			for ; j < len(data) && data[j] != '"'; j++ {
				switch c := data[j]; {
				case c == '\\':
					plain = false
					j++
				case c >= 0x80:
					plain = false
				}
			}
			if j >= len(data) {
				return nil // not JSON: the decoder judged it
			}
			raw := data[i : j+1]
			i = j
			if !wantKey {
				continue
			}
			wantKey = false
			top := &stack[len(stack)-1]
			a := len(buf)
			if plain {
				for _, c := range raw[1 : len(raw)-1] {
					if 'A' <= c && c <= 'Z' {
						c += 'a' - 'A'
					}
					buf = append(buf, c)
				}
			} else {
				var k string
				if err := json.Unmarshal(raw, &k); err != nil {
					return nil // not JSON: the decoder judged it
				}
				buf = append(buf, strings.ToLower(k)...)
			}
			k := buf[a:]
			dup := false
			switch {
			case top.big != nil:
				dup = top.big[string(k)]
			default:
				for _, o := range keys[top.first:] {
					if string(buf[o.a:o.b]) == string(k) {
						dup = true
						break
					}
				}
			}
			if dup {
				var name string
				json.Unmarshal(raw, &name)
				return fmt.Errorf("%w: duplicate key %q", httpx.ErrBadBody, name)
			}
			keys = append(keys, span{a, len(buf)})
			switch n := len(keys) - top.first; {
			case top.big != nil:
				top.big[string(k)] = true
			case n > few:
				top.big = make(map[string]bool, 2*n)
				for _, o := range keys[top.first:] {
					top.big[string(buf[o.a:o.b])] = true
				}
			}
		}
	}
	return nil
}

func (s *Server) hJoin(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	var req api.JoinRequest
	if err := decode(w, r, false, &req); err != nil {
		return 0, nil, err
	}
	out, err := s.joinAs(ctx, req, s.joinCertNode(r))
	return http.StatusOK, out, err
}

// joinCertNode is the node whose certificate a join's connection
// presented ("" for none): a certificate of the cluster CA for client
// use, valid and not revoked, which proves the join is that node's agent
// (an agent restarted with its state presents the one it holds).
func (s *Server) joinCertNode(r *http.Request) string {
	if s.cfg.CA == nil || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return ""
	}
	if !s.cacheTrusted() {
		if _, err := s.syncCRL(r.Context()); err != nil {
			s.log.Warn("reading the revocation list", "err", err)
			return ""
		}
	}
	leaf := r.TLS.PeerCertificates[0]
	if err := s.cfg.CA.Verify(leaf, pki.ClientAuth); err != nil {
		return ""
	}
	return leaf.Subject.CommonName
}

func (s *Server) hHeartbeat(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	id := r.PathValue("id")
	if id != p.nodeID {
		return 0, nil, fmt.Errorf("%w: this node credential belongs to node %s, not %s", ErrForbidden, p.nodeID, id)
	}
	if err := s.checkNodeTLS(r, id); err != nil {
		return 0, nil, err
	}
	var h api.Heartbeat
	if err := decodeLimit(w, r, true, maxHeartbeatBody, &h); err != nil {
		return 0, nil, err
	}
	if err := checkUsage(h.Usage); err != nil {
		return 0, nil, err
	}
	out, err := s.heartbeat(ctx, id, h)
	if err == nil {
		s.usage.record(id, h.Usage, s.now()) // usage.go
	}
	return http.StatusOK, out, err
}

func (s *Server) hNodes(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	out, err := s.st.Nodes(ctx)
	return http.StatusOK, redactNodes(p, out), err
}

func (s *Server) hNode(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	n, err := s.st.Node(ctx, r.PathValue("id"))
	return http.StatusOK, redactNode(p, n.Node), err
}

// redactNode leaves out of a node shown to p what identifies its machine
// and only an administrator needs: the machine ID (with which a join,
// given the bootstrap token, claims a node that is down or removed) and
// the host's block devices and NICs. A tenant (or an agent) keeps what
// placement and its leases show anyway: the node's name, address,
// hostname, cores and memory.
func redactNode(p principal, n api.Node) api.Node {
	if p.role == roleTenant && p.admin {
		return n
	}
	n.Fingerprint.MachineID = ""
	n.Fingerprint.BlockDevices, n.Fingerprint.NICs = nil, nil
	return n
}

// redactNodes is redactNode over a list (in place).
func redactNodes(p principal, ns []api.Node) []api.Node {
	for i := range ns {
		ns[i] = redactNode(p, ns[i])
	}
	return ns
}

func (s *Server) hDevices(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	out, err := s.st.Devices(ctx)
	return http.StatusOK, out, err
}

func (s *Server) hTopology(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	nodes, err := s.st.Nodes(ctx)
	if err != nil {
		return 0, nil, err
	}
	links, err := s.st.Links(ctx)
	return http.StatusOK, api.Topology{Nodes: redactNodes(p, nodes), Links: s.usage.withLoad(links, s.now())}, err
}

func (s *Server) hLeases(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	f := leaseFilter(p)
	q := r.URL.Query()
	if t := q.Get("tenant"); t != "" {
		if !p.admin && t != p.tenant {
			return 0, nil, fmt.Errorf("%w: a tenant's token lists its own tenant's leases only", ErrForbidden)
		}
		f.Tenant = t
	}
	if k := api.Kind(q.Get("kind")); k != "" {
		if !k.Valid() {
			return 0, nil, fmt.Errorf("%w: kind=%q is not one of %v", ErrInvalid, k, api.Kinds)
		}
		f.Kind = k
	}
	if st := q.Get("state"); st != "" {
		f.States = []api.LeaseState{api.LeaseState(st)}
	}
	if v := q.Get("live"); v != "" {
		live, err := strconv.ParseBool(v)
		if err != nil {
			return 0, nil, fmt.Errorf("%w: live=%q is not a boolean", ErrInvalid, v)
		}
		if live {
			// Listing every ended lease grows with history; live=1 keeps
			// the answer as small as the leases that matter now.
			keep := []api.LeaseState{}
			for _, st := range []api.LeaseState{api.LeaseReserved, api.LeaseActive, api.LeaseReleasing} {
				if f.States == nil || f.States[0] == st {
					keep = append(keep, st)
				}
			}
			f.States = keep
		}
	}
	// Pages (docs/api.md, "Paging"): at most limit leases, after the
	// cursor; a full page links to the next.
	f.Limit = maxLeasePage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > maxLeasePage {
			return 0, nil, fmt.Errorf("%w: limit must be between 1 and %d", ErrInvalid, maxLeasePage)
		}
		f.Limit = n
	}
	after, err := api.ParseCursor(q.Get("after"))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: after: %v", ErrInvalid, err)
	}
	f.After = after
	ls, err := s.st.Leases(ctx, f)
	if err != nil {
		return 0, nil, err
	}
	if len(ls) == f.Limit {
		q.Set("after", api.LeaseCursor(ls[len(ls)-1]).String())
		w.Header().Set("Link", "</v1/leases?"+q.Encode()+`>; rel="next"`)
	}
	for i := range ls {
		ls[i] = p.redact(ls[i])
	}
	return http.StatusOK, ls, nil
}

// maxLeasePage is GET /v1/leases's default and greatest limit.
const maxLeasePage = 1000

func (s *Server) hCreateLease(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	var req api.LeaseRequest
	if err := decode(w, r, false, &req); err != nil {
		return 0, nil, err
	}
	if k := r.Header.Get(idempotencyHeader); k != "" {
		if req.IdempotencyKey != "" && req.IdempotencyKey != k {
			return 0, nil, fmt.Errorf("%w: Idempotency-Key header and idempotency_key field differ", ErrInvalid)
		}
		req.IdempotencyKey = k
	}
	l, created, err := s.createLease(ctx, p, req)
	if err != nil {
		return 0, nil, err
	}
	status := http.StatusCreated
	if !created {
		status = http.StatusOK
	}
	return status, brief(r, p.redact(l)), nil
}

func (s *Server) hLease(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	l, err := s.getLease(ctx, p, r.PathValue("id"))
	return http.StatusOK, p.redact(l), err
}

func (s *Server) hRenew(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	var req api.RenewRequest
	if err := decode(w, r, true, &req); err != nil {
		return 0, nil, err
	}
	l, err := s.renewLease(ctx, p, r.PathValue("id"), req.TTLSeconds)
	return http.StatusOK, brief(r, p.redact(l)), err
}

func (s *Server) hRelease(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	var empty struct{}
	if err := decode(w, r, true, &empty); err != nil {
		return 0, nil, err
	}
	l, err := s.releaseLease(ctx, p, r.PathValue("id"))
	return http.StatusOK, brief(r, p.redact(l)), err
}

// brief drops the plan's explanation from the answer to a lease action
// (create, renew, release) unless the request asks for it with
// ?explain=1: it is most of the answer's bytes, and `rialto lease show`
// (GET /v1/leases/{id}) always has it.
func brief(r *http.Request, l api.Lease) api.Lease {
	if l.Plan == nil || len(l.Plan.Explanation) == 0 {
		return l
	}
	if r.URL.RawQuery != "" {
		if v, err := strconv.ParseBool(r.URL.Query().Get("explain")); err == nil && v {
			return l
		}
	}
	pl := *l.Plan
	pl.Explanation = nil
	l.Plan = &pl
	return l
}

func (s *Server) hExplain(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	var req api.LeaseRequest
	if err := decode(w, r, false, &req); err != nil {
		return 0, nil, err
	}
	plan, err := s.explainLease(ctx, p.tenant, req)
	return http.StatusOK, plan, err
}

func (s *Server) hEvents(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	q := r.URL.Query()
	if v := q.Get("follow"); v != "" {
		if follow, err := strconv.ParseBool(v); err != nil {
			return 0, nil, fmt.Errorf("%w: follow=%q is not a boolean", ErrInvalid, v)
		} else if follow {
			return s.hFollow(ctx, p, r, w)
		}
	}
	var since int64
	limit := 1000
	if v := q.Get("since"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, nil, fmt.Errorf("%w: since must be a non-negative integer", ErrInvalid)
		}
		since = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > 1000 {
			return 0, nil, fmt.Errorf("%w: limit must be between 1 and 1000", ErrInvalid)
		}
		limit = n
	}
	tenant := "" // nodes and the admin see every event
	if p.role == roleTenant && !p.admin {
		tenant = p.tenant
	}
	out, err := s.st.Events(ctx, since, limit, tenant)
	if err != nil {
		return 0, nil, err
	}
	// Read after the events: a prune that took events after since
	// committed before the read shows here.
	if err := s.checkCursor(ctx, since); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

func (s *Server) hProfiles(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	out, err := s.st.Profiles(ctx)
	return http.StatusOK, out, err
}

func (s *Server) hPutProfile(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	model := r.PathValue("model")
	if p.role == roleNode {
		if err := s.nodeHasModel(ctx, p.nodeID, model); err != nil {
			return 0, nil, err
		}
	}
	var prof api.Profile
	if err := decode(w, r, false, &prof); err != nil {
		return 0, nil, err
	}
	if prof.Model == "" {
		prof.Model = model
	}
	if prof.Model != model || strings.TrimSpace(model) == "" || len(model) > 256 {
		return 0, nil, fmt.Errorf("%w: the body's model must match the path", ErrInvalid)
	}
	if prof.Source != "" && prof.Source != "measured" && prof.Source != "declared" {
		return 0, nil, fmt.Errorf("%w: source must be measured or declared", ErrInvalid)
	}
	if len(prof.WriteBps) == 0 && len(prof.ReadBps) == 0 {
		return 0, nil, fmt.Errorf("%w: a profile needs write_bps or read_bps points (bytes/s with 1, 2, … concurrent streams)", ErrInvalid)
	}
	if len(prof.WriteBps) > 1024 || len(prof.ReadBps) > 1024 {
		return 0, nil, fmt.Errorf("%w: at most 1024 points per curve", ErrInvalid)
	}
	if err := validateProfile(prof); err != nil {
		return 0, nil, err
	}
	prof.ID = prof.Model
	if prof.MeasuredAt.IsZero() {
		prof.MeasuredAt = s.now()
	}
	out, err := s.st.PutProfile(ctx, prof, api.Event{At: s.now(), Type: "profile.stored", Subject: prof.Model, Message: prof.Source, State: "ready"})
	s.invalidate() // placement reads profiles with the inventory
	return http.StatusOK, out, err
}

// nodeHasModel refuses a node's profile for a model none of its devices
// (those it joined with) is: a node characterizes its own devices only,
// and a profile steers placement on every node with that model.
func (s *Server) nodeHasModel(ctx context.Context, nodeID, model string) error {
	devs, err := s.st.Devices(ctx)
	if err != nil {
		return fmt.Errorf("profile: devices: %w", err)
	}
	for _, d := range devs {
		if d.NodeID == nodeID && d.Model != "" && d.Model == model {
			return nil
		}
	}
	return fmt.Errorf("%w: node %s has no device of model %q: a node credential stores profiles only for the models of its own devices (an admin token stores any)", ErrForbidden, nodeID, model)
}

// leaseFilter limits a listing to what p may see.
func leaseFilter(p principal) store.LeaseFilter {
	if p.admin {
		return store.LeaseFilter{}
	}
	return store.LeaseFilter{Tenant: p.tenant}
}

// validateProfile checks what placement relies on: finite, positive
// bandwidths and a finite, non-negative latency.
func validateProfile(p api.Profile) error {
	for _, c := range []struct {
		name string
		bps  []float64
	}{{"write_bps", p.WriteBps}, {"read_bps", p.ReadBps}} {
		for i, b := range c.bps {
			if math.IsNaN(b) || math.IsInf(b, 0) || b <= 0 {
				return fmt.Errorf("%w: %s[%d] is %v; bandwidths must be finite and positive (bytes/s)", ErrInvalid, c.name, i, b)
			}
		}
	}
	if math.IsNaN(p.Latency4KUs) || math.IsInf(p.Latency4KUs, 0) || p.Latency4KUs < 0 {
		return fmt.Errorf("%w: latency_4k_us is %v; it must be finite and not negative", ErrInvalid, p.Latency4KUs)
	}
	return nil
}
