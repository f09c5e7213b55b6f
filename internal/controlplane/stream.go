package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// The event stream (GET /v1/events?follow=1) is a tail of the store's
// append-only event log. One goroutine per server (the hub's tailer) polls
// the store for events after the last one it saw and keeps the most recent
// ones in a ring; every follower reads the ring from its own cursor (the ID
// of the last event it sent) and waits for the ring to grow. A follower
// whose cursor is older than the ring (it asked for an old ID, or it read
// too slowly) reads the store itself until it reaches the ring. Event IDs
// only grow and a reader sees every commit made before it began (SQLite
// has one writer), so cursor-based delivery has no gap and no duplicate,
// also across reconnections that resume from the last ID received.
//
// Reading the store rather than being told of writes in this process keeps
// the stream right when several control planes share one store.

const (
	// streamRing is how many recent events the hub keeps for followers.
	streamRing = 8192
	// streamPage is how many events one store read returns.
	streamPage = 1000
	// maxFollowers bounds concurrent followers per server.
	maxFollowers = 4096
	// maxFollowersPerCaller bounds one token's (or node's) concurrent
	// followers, so that one tenant cannot take every stream.
	maxFollowersPerCaller = 64
)

// streamed is what a handler returns when it wrote the answer itself.
type streamed struct{}

// Unwrap lets http.ResponseController reach the connection (Flush, write
// deadlines) through the metrics wrapper.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// hubEvent is an event of the ring with what the tenant rule needs.
type hubEvent struct {
	api.Event
	tenant string // a lease event's lease's tenant; "" if unknown
}

// eventHub tails the event log for followers. The zero value is ready to
// use; interval and keepalive take defaults when zero. It is safe for
// concurrent use.
type eventHub struct {
	interval  time.Duration // store poll interval (default 100ms)
	keepalive time.Duration // idle time after which a follower gets a keep-alive (default 15s)
	ringSize  int           // events kept for followers (default streamRing)
	perCaller int           // followers one caller may have (default maxFollowersPerCaller)

	startMu sync.Mutex // serializes starting and stopping the tailer
	cancel  context.CancelFunc
	done    chan struct{}

	mu      sync.Mutex
	subs    int
	callers map[string]int // followers by caller (followerKey)
	closed  bool
	closing chan struct{} // closed by closeAll
	changed chan struct{} // closed (and replaced) when last moves
	ring    []hubEvent    // every event with base < ID <= last, oldest first
	base    int64
	last    int64
	tenants map[string]string // lease ID → tenant, for lease events
}

func (h *eventHub) initLocked() {
	if h.changed == nil {
		h.changed = make(chan struct{})
		h.closing = make(chan struct{})
	}
}

func (h *eventHub) pollInterval() time.Duration {
	if h.interval > 0 {
		return h.interval
	}
	return 100 * time.Millisecond
}

func (h *eventHub) keepaliveInterval() time.Duration {
	if h.keepalive > 0 {
		return h.keepalive
	}
	return 15 * time.Second
}

// lastEventIDer is an optional store capability: the greatest event ID.
type lastEventIDer interface {
	LastEventID(ctx context.Context) (int64, error)
}

func lastEventID(ctx context.Context, st store.Store) (int64, error) {
	if l, ok := st.(lastEventIDer); ok {
		return l.LastEventID(ctx)
	}
	var last int64
	for {
		evs, err := st.Events(ctx, last, streamPage, "")
		if err != nil || len(evs) == 0 {
			return last, err
		}
		last = evs[len(evs)-1].ID
	}
}

// followerKey names the caller whose followers count against
// maxFollowersPerCaller: the token (by fingerprint), or the node.
func followerKey(p principal) string {
	if p.role == roleNode {
		return "node " + p.nodeID
	}
	return "token " + p.fp
}

// subscribe registers a follower of caller (followerKey), starting the
// tailer for the first one; the follower calls the returned function when
// it ends.
func (h *eventHub) subscribe(ctx context.Context, caller string, st store.Store, clk clock.Clock, log *slog.Logger) (func(), error) {
	h.startMu.Lock()
	defer h.startMu.Unlock()
	h.mu.Lock()
	h.initLocked()
	if h.closed {
		h.mu.Unlock()
		return nil, fmt.Errorf("%w: the control plane is shutting down", ErrUnavailable)
	}
	if h.subs >= maxFollowers {
		h.mu.Unlock()
		return nil, fmt.Errorf("%w: %d event followers already; try again later", ErrUnavailable, maxFollowers)
	}
	per := h.perCaller
	if per <= 0 {
		per = maxFollowersPerCaller
	}
	if h.callers[caller] >= per {
		h.mu.Unlock()
		return nil, fmt.Errorf("%w: this %s already has %d event streams open; close one first", ErrQuota, strings.Fields(caller)[0], per)
	}
	if h.callers == nil {
		h.callers = map[string]int{}
	}
	h.subs++
	h.callers[caller]++
	first := h.subs == 1
	h.mu.Unlock()
	if first {
		last, err := lastEventID(ctx, st)
		if err != nil {
			h.mu.Lock()
			h.subs--
			h.dropCallerLocked(caller)
			h.mu.Unlock()
			return nil, err
		}
		h.mu.Lock()
		h.ring, h.base, h.last = nil, last, last
		h.mu.Unlock()
		tctx, cancel := context.WithCancel(context.Background())
		h.cancel, h.done = cancel, make(chan struct{})
		go h.tail(tctx, st, clk, log, h.done)
	}
	return func() { h.unsubscribe(caller) }, nil
}

// dropCallerLocked counts one follower of caller less.
func (h *eventHub) dropCallerLocked(caller string) {
	if h.callers[caller]--; h.callers[caller] <= 0 {
		delete(h.callers, caller)
	}
}

func (h *eventHub) unsubscribe(caller string) {
	h.startMu.Lock()
	defer h.startMu.Unlock()
	h.mu.Lock()
	h.subs--
	h.dropCallerLocked(caller)
	last := h.subs == 0
	h.mu.Unlock()
	if last {
		h.cancel()
		<-h.done
		h.cancel, h.done = nil, nil
	}
}

// closeAll ends every follower's stream and refuses new ones.
func (h *eventHub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.initLocked()
	if !h.closed {
		h.closed = true
		close(h.closing)
	}
}

// tail polls the store every poll interval of clk until ctx ends. It owns
// nothing but its ticker.
func (h *eventHub) tail(ctx context.Context, st store.Store, clk clock.Clock, log *slog.Logger, done chan struct{}) {
	defer close(done)
	t := clk.NewTicker(h.pollInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		for {
			n, err := h.poll(ctx, st)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("event stream: read the event log", "err", err)
				}
				break
			}
			if n < streamPage {
				break
			}
		}
	}
}

// poll reads the events after the hub's last one into the ring.
func (h *eventHub) poll(ctx context.Context, st store.Store) (int, error) {
	h.mu.Lock()
	last := h.last
	h.mu.Unlock()
	evs, err := st.Events(ctx, last, streamPage, "")
	if err != nil || len(evs) == 0 {
		return 0, err
	}
	tenants, err := h.leaseTenants(ctx, st, evs)
	if err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range evs {
		he := hubEvent{Event: ev}
		if isLeaseEvent(ev) {
			he.tenant = tenants[ev.Subject]
		}
		h.ring = append(h.ring, he)
	}
	size := h.ringSize
	if size <= 0 {
		size = streamRing
	}
	if over := len(h.ring) - size; over > 0 {
		h.base = h.ring[over-1].ID
		h.ring = append(h.ring[:0:0], h.ring[over:]...)
	}
	h.last = evs[len(evs)-1].ID
	close(h.changed)
	h.changed = make(chan struct{})
	return len(evs), nil
}

// isLeaseEvent is the store's tenant rule: lease events are their lease's
// tenant's; every other event (nodes, profiles) is everyone's.
func isLeaseEvent(ev api.Event) bool { return strings.HasPrefix(strings.ToLower(ev.Type), "lease.") }

// leaseTenants returns the tenants of the leases evs's lease events name,
// from a cache or the store. A lease the store does not have gets no
// tenant (only the admin and nodes see its events, as with GET).
func (h *eventHub) leaseTenants(ctx context.Context, st store.Store, evs []api.Event) (map[string]string, error) {
	out := map[string]string{}
	var missing []string
	h.mu.Lock()
	for _, ev := range evs {
		if !isLeaseEvent(ev) {
			continue
		}
		if t, ok := h.tenants[ev.Subject]; ok {
			out[ev.Subject] = t
		} else if _, dup := out[ev.Subject]; !dup {
			out[ev.Subject] = ""
			missing = append(missing, ev.Subject)
		}
	}
	h.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	ls, err := st.Leases(ctx, store.LeaseFilter{IDs: missing})
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tenants == nil || len(h.tenants) > 100000 {
		h.tenants = map[string]string{}
	}
	for _, l := range ls {
		out[l.ID] = l.Tenant
		h.tenants[l.ID] = l.Tenant
	}
	return out, nil
}

// read returns the events after cursor that tenant ("" for all) may see,
// the cursor to continue from, and, when there was nothing to read, a
// channel closed when there may be more.
func (h *eventHub) read(ctx context.Context, st store.Store, cursor int64, tenant string) ([]api.Event, int64, <-chan struct{}, error) {
	h.mu.Lock()
	base, last, changed := h.base, h.last, h.changed
	if cursor >= base {
		i := sort.Search(len(h.ring), func(i int) bool { return h.ring[i].ID > cursor })
		var out []api.Event
		for _, e := range h.ring[i:] {
			if tenant == "" || !isLeaseEvent(e.Event) || e.tenant == tenant {
				out = append(out, e.Event)
			}
		}
		h.mu.Unlock()
		next := max(cursor, last)
		if len(out) > 0 || next > cursor {
			return out, next, nil, nil
		}
		return nil, cursor, changed, nil
	}
	h.mu.Unlock()
	// Behind the ring: the store has it (and every event up to last,
	// which the hub has seen committed).
	evs, err := st.Events(ctx, cursor, streamPage, tenant)
	if err != nil {
		return nil, cursor, nil, err
	}
	next := cursor
	if len(evs) > 0 {
		next = evs[len(evs)-1].ID
	}
	if len(evs) < streamPage {
		next = max(next, last)
	}
	return evs, next, nil, nil
}

// sinceEnd (since=end) starts a stream with the next event appended.
const sinceEnd = -1

// streamFormat is how a follower gets its events.
type streamFormat int

const (
	formatNDJSON streamFormat = iota // one JSON event per line; blank lines are keep-alives
	formatSSE                        // Server-Sent Events: id: and data: lines; comments are keep-alives
)

// followParams reads a follow request's format and starting ID. A
// Last-Event-ID header (an EventSource reconnecting) wins over since.
func followParams(r *http.Request) (streamFormat, int64, error) {
	q := r.URL.Query()
	f := formatNDJSON
	switch q.Get("format") {
	case "ndjson", "jsonl":
	case "sse":
		f = formatSSE
	case "":
		if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			f = formatSSE
		}
	default:
		return 0, 0, fmt.Errorf("%w: format must be sse or ndjson", ErrInvalid)
	}
	var since int64
	for _, v := range []string{q.Get("since"), r.Header.Get("Last-Event-ID")} {
		if v == "" {
			continue
		}
		if v == "end" {
			since = sinceEnd
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 {
			return 0, 0, fmt.Errorf("%w: since and Last-Event-ID must be non-negative integers", ErrInvalid)
		}
		since = n
	}
	return f, since, nil
}

// streamWriter writes events in a format and flushes them.
type streamWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	f   streamFormat
	buf bytes.Buffer
}

// streamWriteTimeout drops a follower that does not read.
const streamWriteTimeout = 30 * time.Second

func (sw *streamWriter) events(evs []api.Event) error {
	sw.buf.Reset()
	for _, ev := range evs {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if sw.f == formatSSE {
			fmt.Fprintf(&sw.buf, "id: %d\ndata: %s\n\n", ev.ID, b)
		} else {
			sw.buf.Write(b)
			sw.buf.WriteByte('\n')
		}
	}
	return sw.flush()
}

func (sw *streamWriter) keepalive() error {
	sw.buf.Reset()
	if sw.f == formatSSE {
		sw.buf.WriteString(": keep-alive\n\n")
	} else {
		sw.buf.WriteByte('\n')
	}
	return sw.flush()
}

func (sw *streamWriter) flush() error {
	sw.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	if _, err := sw.w.Write(sw.buf.Bytes()); err != nil {
		return err
	}
	return sw.rc.Flush()
}

// streamTenant is the tenant whose view p has ("" for everything): nodes
// and the admin see every event, a tenant its own leases' and the
// cluster's (the rule of GET /v1/events).
func streamTenant(p principal) string {
	if p.role == roleTenant && !p.admin {
		return p.tenant
	}
	return ""
}

// hFollow serves GET /v1/events?follow=1: the events after since (or
// Last-Event-ID), then every new one as it is appended, until the client
// goes or the server shuts down.
func (s *Server) hFollow(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	format, since, err := followParams(r)
	if err != nil {
		return 0, nil, err
	}
	if err := s.follow(ctx, followerKey(p), streamTenant(p), since, w, format, s.stillCaller(r, p)); err != nil {
		return 0, nil, err
	}
	return 0, streamed{}, nil
}

// streamRecheck is how often an open stream checks its caller again
// when nothing told it to (a token taken out by another replica's reload,
// a certificate revoked by another process sharing the CA directory):
// the token cache's least lifetime, the bound of those changes on the
// other calls.
const streamRecheck = authCacheTTL

// stillCaller returns the check an open stream of p's request r makes
// when the token cache drops entries (a reload, a node's rejoin or
// removal, a revocation on another replica) and every streamRecheck:
// r's credentials must still authenticate, as the same principal (a
// token made a tenant's instead of an admin's would see less). An error
// ends the stream; the client's reconnection gets the answer.
func (s *Server) stillCaller(r *http.Request, p principal) func(context.Context) error {
	return func(ctx context.Context) error {
		q, err := s.authenticate(ctx, r)
		if err != nil {
			return err
		}
		if q.role != p.role || q.nodeID != p.nodeID || q.tenant != p.tenant || q.admin != p.admin {
			return fmt.Errorf("%w: this token is %s now", ErrUnauthorized, withArticle(q.role.String()))
		}
		return nil
	}
}

// follow writes tenant's view of the event log after since to w in
// format, as a follower of caller (followerKey), until ctx ends, the
// server closes its streams or recheck fails (run when the token cache
// drops entries, and every streamRecheck: a revoked token's stream ends
// before it writes any event appended after the revocation). Errors
// before the first byte is written are returned (the caller answers
// them); later ones end the stream.
func (s *Server) follow(ctx context.Context, caller, tenant string, since int64, w http.ResponseWriter, format streamFormat, recheck func(context.Context) error) error {
	if err := s.checkCursor(ctx, since); err != nil {
		return err // 410: the events after since were pruned
	}
	unsub, err := s.events.subscribe(ctx, caller, s.st, s.clock, s.log)
	if err != nil {
		return err
	}
	defer unsub()
	s.events.mu.Lock()
	closing := s.events.closing
	if since == sinceEnd {
		since = s.events.last
	}
	s.events.mu.Unlock()
	sw := &streamWriter{w: w, rc: http.NewResponseController(w), f: format}
	h := w.Header()
	if format == formatSSE {
		h.Set("Content-Type", "text/event-stream")
	} else {
		h.Set("Content-Type", "application/x-ndjson")
	}
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if format == formatSSE {
		sw.buf.Reset()
		sw.buf.WriteString("retry: 1000\n\n")
		if sw.flush() != nil {
			return nil
		}
	} else if sw.rc.Flush() != nil {
		return nil
	}
	idle := s.clock.NewTimer(s.events.keepaliveInterval())
	defer idle.Stop()
	again := s.clock.NewTimer(streamRecheck)
	defer again.Stop()
	// A drop between the request's authentication and here: the first
	// turn checks the caller (from the cache, normally).
	var changed <-chan struct{} = closedChan
	// still checks the caller again when the cache dropped entries since
	// the last check (or force), and reports whether the stream goes on.
	still := func(force bool) bool {
		select {
		case <-changed:
		default:
			if !force {
				return true
			}
		}
		changed = s.auth.changes() // before the check: a drop during it is seen next time
		if err := recheck(ctx); err != nil {
			if ctx.Err() == nil {
				s.log.Info("event stream ended: its caller no longer authenticates as it did", "caller", caller, "err", err)
			}
			return false
		}
		again.Reset(streamRecheck)
		return true
	}
	cursor := since
	for {
		if !still(false) {
			return nil
		}
		evs, next, wait, err := s.events.read(ctx, s.st, cursor, tenant)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("event stream: read", "err", err)
			}
			return nil // the client resumes from the last ID it got
		}
		if len(evs) > 0 && evs[0].ID > cursor+1 && cursor > 0 {
			// A gap: another tenant's events, or pruned ones (history
			// retention). For the latter the stream ends, and the
			// client's resumption gets 410.
			if s.checkCursor(ctx, cursor) != nil {
				return nil
			}
		}
		if len(evs) > 0 {
			if !still(false) {
				return nil // what was read may be after a revocation
			}
			if sw.events(evs) != nil {
				return nil
			}
			idle.Reset(s.events.keepaliveInterval())
		}
		cursor = next
		if wait == nil {
			if ctx.Err() != nil {
				return nil
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-closing:
			return nil
		case <-wait:
		case <-changed:
		case <-again.C():
			if !still(true) {
				return nil
			}
		case <-idle.C():
			if sw.keepalive() != nil {
				return nil
			}
			idle.Reset(s.events.keepaliveInterval())
		}
	}
}

// closedChan is a closed channel.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// CloseStreams ends every event stream and refuses new ones; call it when
// the HTTP server shuts down (http.Server.RegisterOnShutdown), which
// otherwise waits for streams that never go idle.
func (s *Server) CloseStreams() { s.events.closeAll() }
