package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/api"
)

// This file is the placement leader of replicas sharing a PostgreSQL
// store (issue 17; docs/operations.md, "Replicas"). The replica elected
// for the background duties (replica.go) also places every lease: the
// others forward the API calls whose writes must be serialized against
// the inventory (lease creations and releases) to it, and serve every
// other call themselves. One replica placing means one exact placement
// view (no lost races for a device, so no placement retries) and one
// group commit (batch.go) that gathers every replica's borrowers, so
// fewer and larger write transactions.
//
// The leader names itself in its answers to those calls
// (api.PlacementLeaderHeader, nameLeader), and api.Client sends its later
// ones straight to it when that address is one of its own, so that most
// calls skip the hop.
//
// Forwarding is a routing optimisation, never a condition of correctness:
// the store re-checks every reservation, so a replica that serves a
// create itself (no leader known, the leader unreachable, a request that
// was already forwarded once) is as correct as before, only slower.
//
// Security: a replica forwards only a call it has authenticated and
// authorized itself, with the caller's own Authorization header; the
// leader authenticates and authorizes it again, as any call. The hop
// header (forwardedHeader) grants nothing: it only stops a second
// forward, so a client that sends it gets its call served where it
// landed. Over HTTPS the forward verifies the leader's certificate
// against the cluster CA (Config.CA: it must be a control plane's,
// APIServerCN, not a node's for the same host) or Config.PeerTLS.

// forwardedHeader marks a call forwarded by a replica (its value: the
// forwarding replica's address). A call that carries it is served where
// it lands, never forwarded again.
const forwardedHeader = "Rialto-Forwarded-By"

// Forwarding timing: a replica re-reads the leader's address from the
// store every leaderRecheck (and at once when a forward fails); a leader
// it could not reach is not tried again for leaderBackoff. failoverBound
// bounds how long a forward is retried against a new leader before the
// replica serves the call itself.
const (
	leaderRecheck = time.Second
	leaderBackoff = time.Second
	failoverBound = 5 * time.Second
)

// leaderDirectory is the optional store capability forwarding needs: an
// election that records the leader's API address, and its lookup
// (store/postgres, leader.go).
type leaderDirectory interface {
	CampaignAdvertising(ctx context.Context, url string) (context.Context, func(), error)
	LeaderURL(ctx context.Context) (string, error)
}

// forwarder is a replica's route to the placement leader. The zero value
// (nil pointer) forwards nothing.
type forwarder struct {
	self   string // this replica's advertised API address
	dir    leaderDirectory
	client *http.Client
	clock  func() time.Time
	calls  *prometheus.CounterVec // by outcome

	mu       sync.Mutex
	leader   string    // the last address read ("" none)
	readAt   time.Time // when it was read
	badURL   string    // a leader that could not be reached ...
	badUntil time.Time // ... is not tried before this
}

// newForwarder returns the forwarder of a server whose store is shared
// and has a leader directory, and which advertises an address; nil
// otherwise.
func newForwarder(s *Server) *forwarder {
	dir, ok := s.st.(leaderDirectory)
	if !ok || s.cfg.AdvertiseURL == "" {
		return nil
	}
	tc := s.cfg.PeerTLS
	if tc == nil && s.cfg.CA != nil {
		// The leader's certificate must be a control plane's: the CA
		// also issues nodes' certificates, for hosts their joins declare
		// (a replica's among them, maybe), and the call carries the
		// tenant's token.
		ca := s.cfg.CA
		tc = &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12,
			VerifyConnection: func(cs tls.ConnectionState) error { return verifyAPIPeer(ca, cs) }}
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		TLSClientConfig:       tc,
		ForceAttemptHTTP2:     tc != nil,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
	}
	f := &forwarder{self: strings.TrimSuffix(s.cfg.AdvertiseURL, "/"), dir: dir, client: &http.Client{Transport: tr}, clock: s.now,
		calls: newForwardedCalls(s.reg)}
	return f
}

// newForwardedCalls registers with r the forwarder's counter of the calls
// that must be serialized, by outcome (each starting at 0).
func newForwardedCalls(r prometheus.Registerer) *prometheus.CounterVec {
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_forwarded_calls_total",
		Help: "Calls that must be serialized (lease creations and releases) by where they were served: forwarded (to the placement leader), local (this replica leads, or no leader was known or reachable), ambiguous (the leader failed mid-call; answered 503)."},
		[]string{"outcome"})
	for _, o := range []string{"forwarded", "local", "ambiguous"} {
		calls.WithLabelValues(o)
	}
	r.MustRegister(calls)
	return calls
}

// close closes the forwarder's idle connections.
func (f *forwarder) close() {
	if f != nil {
		f.client.CloseIdleConnections()
	}
}

// target is the leader's address to forward to, or "" to serve locally
// (no leader known, this replica, or a leader that could not be reached
// a moment ago). fresh forces a read from the store.
func (f *forwarder) target(ctx context.Context, fresh bool) string {
	now := f.clock()
	f.mu.Lock()
	if fresh || now.Sub(f.readAt) >= leaderRecheck {
		// One caller reads; the others meanwhile use the address read
		// before.
		f.readAt = now
		f.mu.Unlock()
		url, err := f.dir.LeaderURL(ctx)
		f.mu.Lock()
		if err == nil {
			f.leader, f.readAt = strings.TrimSuffix(url, "/"), now
		} else {
			f.leader = "" // the store is away: serve locally (which answers 503)
		}
	}
	url := f.leader
	if url == f.self || (url == f.badURL && now.Before(f.badUntil)) {
		url = ""
	}
	f.mu.Unlock()
	return url
}

// unreachable records that url could not be reached.
func (f *forwarder) unreachable(url string) {
	f.mu.Lock()
	f.badURL, f.badUntil = url, f.clock().Add(leaderBackoff)
	f.mu.Unlock()
}

// forwards reports whether calls to route name are forwarded to the
// placement leader: the ones whose writes change what is placed.
func forwards(name string) bool {
	return name == "POST /v1/leases" || name == "POST /v1/leases/{id}/release"
}

// nameLeader names this replica as the placement leader in the answer to
// a call that forwards (api.PlacementLeaderHeader) when it leads: a
// client that knows this address sends such calls here directly, saving
// the forwarding hop (the header passes through a forwarding replica's
// answer too).
func (f *forwarder) nameLeader(w http.ResponseWriter, leading bool) {
	if leading {
		w.Header().Set(api.PlacementLeaderHeader, f.self)
	}
}

// forward serves r by forwarding it to the placement leader, and reports
// whether it did (answered w); false: the caller serves r itself, with
// r.Body as it was. p is the caller, authenticated and authorized here.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, p principal) bool {
	f := s.fwd
	if f == nil || s.Leading() || r.Header.Get(forwardedHeader) != "" || p.role != roleTenant {
		return false
	}
	ctx := r.Context()
	url := f.target(ctx, false)
	if url == "" {
		f.calls.WithLabelValues("local").Inc()
		return false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil || len(body) > maxBody {
		return false // the handler words the error
	}
	// A creation without an idempotency key must not be sent twice: if
	// the leader fails after the request went out, it may have created
	// the lease. Releases are idempotent (a released lease stays so).
	retrySent := r.Method == http.MethodPost && (r.Header.Get(idempotencyHeader) != "" || strings.HasSuffix(r.URL.Path, "/release"))
	deadline := f.clock().Add(failoverBound)
	for {
		resp, sent, err := f.send(ctx, url, r, body)
		if err == nil {
			defer resp.Body.Close()
			h := w.Header()
			for k, vs := range resp.Header {
				switch http.CanonicalHeaderKey(k) {
				case "Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length", "Trailer", "Upgrade":
					continue
				}
				h[k] = vs
			}
			w.WriteHeader(resp.StatusCode)
			io.Copy(w, resp.Body)
			f.calls.WithLabelValues("forwarded").Inc()
			// The leader changed what is placed: this replica's view, if
			// it is used again (a dry run, a call served here), reloads.
			s.res.Invalidate()
			return true
		}
		if ctx.Err() != nil {
			writeError(w, http.StatusServiceUnavailable, api.ErrorInfo{Code: api.CodeUnavailable, Message: "the call ended before the placement leader answered"})
			return true
		}
		f.unreachable(url)
		if sent && !retrySent {
			s.log.Warn("placement leader failed during a forwarded call; answering 503", "leader", url, "err", err)
			f.calls.WithLabelValues("ambiguous").Inc()
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, api.ErrorInfo{Code: api.CodeUnavailable,
				Message: "the placement leader failed while serving this call, which may or may not have taken effect; retry (with an Idempotency-Key a retry is safe)"})
			return true
		}
		next := f.target(ctx, true)
		if next == "" || next == url || f.clock().After(deadline) {
			// No other leader (yet): serve the call here; the store
			// serializes it against every other replica's writes.
			f.calls.WithLabelValues("local").Inc()
			r.Body = io.NopCloser(bytes.NewReader(body))
			return false
		}
		url = next
	}
}

// send forwards r (whose body is body) to the leader at url, with the
// caller's credential and idempotency key. sent reports whether the
// request may have reached the leader: false when it failed before its
// headers were written (no connection, a TLS handshake refused).
func (f *forwarder) send(ctx context.Context, url string, r *http.Request, body []byte) (resp *http.Response, sent bool, err error) {
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }})
	req, err := http.NewRequestWithContext(ctx, r.Method, url+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	for _, k := range []string{"Authorization", "Content-Type", "Accept", idempotencyHeader} {
		if v := r.Header.Values(k); len(v) > 0 {
			req.Header[k] = v
		}
	}
	req.Header.Set(forwardedHeader, f.self)
	resp, err = f.client.Do(req)
	return resp, err == nil || wrote.Load(), err
}
