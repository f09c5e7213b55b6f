package controlplane

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// appendEvents appends n cluster events (everyone's) and returns them.
func (e *env) appendEvents(n int, typ string) []api.Event {
	e.t.Helper()
	out := make([]api.Event, 0, n)
	for i := range n {
		ev, err := e.srv.st.AppendEvent(e.ctx(), api.Event{At: time.Now(), Type: typ, Subject: "test", Message: strconv.Itoa(i), State: "ok"})
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// collector gathers what a follower receives.
type collector struct {
	mu   sync.Mutex
	evs  []api.Event
	more chan struct{}
}

func newCollector() *collector { return &collector{more: make(chan struct{}, 1)} }

func (c *collector) add(ev api.Event) error {
	c.mu.Lock()
	c.evs = append(c.evs, ev)
	c.mu.Unlock()
	select {
	case c.more <- struct{}{}:
	default:
	}
	return nil
}

func (c *collector) got() []api.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]api.Event(nil), c.evs...)
}

// waitFor polls until the collector holds an event with ID id.
func (c *collector) waitFor(t *testing.T, id int64, within time.Duration) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		evs := c.got()
		if len(evs) > 0 && evs[len(evs)-1].ID >= id {
			return
		}
		select {
		case <-c.more:
		case <-deadline.C:
			t.Fatalf("event %d not delivered within %v; got %d events", id, within, len(evs))
		}
	}
}

// follow runs c.FollowEvents in a goroutine owned by the test.
func follow(t *testing.T, c *api.Client, since int64, opt api.FollowOptions) *collector {
	t.Helper()
	col := newCollector()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.FollowEvents(ctx, since, opt, col.add) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("FollowEvents: %v", err)
		}
	})
	return col
}

// sameEvents checks that got is exactly want: same IDs, in order, once.
func sameEvents(t *testing.T, who string, got, want []api.Event) {
	t.Helper()
	ids := func(evs []api.Event) string {
		var b strings.Builder
		for _, ev := range evs {
			fmt.Fprintf(&b, "%d ", ev.ID)
		}
		return b.String()
	}
	if ids(got) != ids(want) {
		t.Fatalf("%s: stream delivered\n  %s\nthe log has\n  %s", who, ids(got), ids(want))
	}
	for i := range got {
		if got[i].Type != want[i].Type || got[i].Subject != want[i].Subject || got[i].Message != want[i].Message {
			t.Fatalf("%s: event %d differs: %+v vs %+v", who, got[i].ID, got[i], want[i])
		}
	}
}

// allEvents reads c's whole view of the log with GET /v1/events.
func allEvents(t *testing.T, ctx context.Context, c *api.Client) []api.Event {
	t.Helper()
	var out []api.Event
	var since int64
	for {
		evs, err := c.Events(ctx, since)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			return out
		}
		out = append(out, evs...)
		since = evs[len(evs)-1].ID
	}
}

// An event is delivered to a follower soon after it is appended: within
// the hub's poll interval plus scheduling. The bound asserted is loose
// (a loaded machine); the measured worst case is logged.
func TestStreamLatency(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.events.interval = 20 * time.Millisecond
	col := follow(t, e.admin, 0, api.FollowOptions{})
	var worst time.Duration
	for range 20 {
		start := time.Now()
		ev := e.appendEvents(1, "test.latency")[0]
		col.waitFor(t, ev.ID, 5*time.Second)
		worst = max(worst, time.Since(start))
	}
	t.Logf("worst delivery latency over 20 events: %v (poll interval 20ms)", worst)
	if worst > 2*time.Second {
		t.Errorf("worst delivery latency %v is over the 2s bound", worst)
	}
	sameEvents(t, "admin", col.got(), allEvents(t, e.ctx(), e.admin))
}

// cutProxy forwards TCP to a server and can cut every connection open
// through it, as a network failure would.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); io.Copy(s, c); s.Close() }()
			go func() { defer p.wg.Done(); io.Copy(c, s); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns) / 2
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	return n
}

// A follower whose connection drops resumes from the last event it got:
// the events appended while it was away arrive, none twice, none missing.
func TestStreamResumeAfterDrop(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.events.interval = 20 * time.Millisecond
	proxy := newCutProxy(t, e.ts.Listener.Addr().String())
	var mu sync.Mutex
	var reconnects []error
	c := api.NewClient(proxy.url(), adminTok, nil)
	before := e.appendEvents(5, "test.before")
	col := follow(t, c, before[1].ID, api.FollowOptions{Backoff: 50 * time.Millisecond, Reconnected: func(err error) {
		mu.Lock()
		reconnects = append(reconnects, err)
		mu.Unlock()
	}})
	col.waitFor(t, before[4].ID, 10*time.Second)
	for round := range 3 {
		if n := proxy.cut(); n == 0 {
			t.Fatalf("round %d: no connection to cut", round)
		}
		evs := e.appendEvents(7, "test.during")
		col.waitFor(t, evs[len(evs)-1].ID, 10*time.Second)
	}
	all := allEvents(t, e.ctx(), e.admin)
	var want []api.Event
	for _, ev := range all {
		if ev.ID > before[1].ID {
			want = append(want, ev)
		}
	}
	sameEvents(t, "resumed follower", col.got(), want)
	mu.Lock()
	defer mu.Unlock()
	if len(reconnects) < 3 {
		t.Errorf("%d reconnections after 3 cuts", len(reconnects))
	}
}

// sseEvent is one event of a Server-Sent Events stream.
type sseEvent struct {
	id   string
	data string
}

// readSSE reads n events (skipping retry lines and comments) from r.
func readSSE(t *testing.T, br *bufio.Reader, n int) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	for len(out) < n {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("SSE stream after %d events: %v", len(out), err)
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "":
			if cur.data != "" {
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"), strings.HasPrefix(line, "retry:"):
		case strings.HasPrefix(line, "id: "):
			cur.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	return out
}

// openStream opens GET /v1/events?follow=1 with the given headers.
func openStream(t *testing.T, ctx context.Context, url, token string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// SSE: an EventSource-style client gets id: lines and, reconnecting with
// Last-Event-ID (which wins over the URL's since), resumes after it.
func TestStreamSSELastEventID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.events.interval = 20 * time.Millisecond
	evs := e.appendEvents(6, "test.sse")
	ctx, cancel := context.WithCancel(e.ctx())
	resp := openStream(t, ctx, e.ts.URL+"/v1/events?follow=1&since=0", adminTok, "Accept", "text/event-stream")
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
	}
	got := readSSE(t, bufio.NewReader(resp.Body), 3)
	cancel()
	resp.Body.Close()
	for i, ev := range got {
		var a api.Event
		if err := json.Unmarshal([]byte(ev.data), &a); err != nil {
			t.Fatal(err)
		}
		if ev.id != strconv.FormatInt(evs[i].ID, 10) || a.ID != evs[i].ID {
			t.Fatalf("SSE event %d: id %q data %s, want %d", i, ev.id, ev.data, evs[i].ID)
		}
	}
	ctx, cancel = context.WithCancel(e.ctx())
	defer cancel()
	resp = openStream(t, ctx, e.ts.URL+"/v1/events?follow=1&since=0&format=sse", adminTok, "Last-Event-ID", got[2].id)
	defer resp.Body.Close()
	rest := readSSE(t, bufio.NewReader(resp.Body), 3)
	for i, ev := range rest {
		if ev.id != strconv.FormatInt(evs[3+i].ID, 10) {
			t.Fatalf("after Last-Event-ID %s: event %d has id %s, want %d", got[2].id, i, ev.id, evs[3+i].ID)
		}
	}
}

// Many followers at once, admins and tenants, some from the start of the
// log (reading behind the ring) and some live: each sees exactly what GET
// /v1/events shows it, in order, once.
func TestStreamManyFollowers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.events.interval = 20 * time.Millisecond
	e.srv.events.ringSize = 16 // most of the history is behind the ring
	e.join("n1", 1<<30)
	type follower struct {
		name string
		c    *api.Client
		col  *collector
	}
	var fs []follower
	for i := range 60 {
		c := []*api.Client{e.admin, e.alice, e.bob}[i%3]
		name := []string{"admin", "alice", "bob"}[i%3]
		fs = append(fs, follower{fmt.Sprintf("%s#%d", name, i), c, follow(t, c, 0, api.FollowOptions{})})
	}
	// Leases of both tenants, released, with cluster events between.
	var last int64
	for i := range 6 {
		c := []*api.Client{e.alice, e.bob}[i%2]
		l, err := c.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.ReleaseLease(e.ctx(), l.ID); err != nil {
			t.Fatal(err)
		}
		evs := e.appendEvents(10, "test.many")
		last = evs[len(evs)-1].ID
	}
	// Cluster events are everyone's, so every follower ends on last.
	for _, f := range fs {
		f.col.waitFor(t, last, 20*time.Second)
	}
	want := map[string][]api.Event{}
	for _, f := range fs {
		kind := strings.Split(f.name, "#")[0]
		if want[kind] == nil {
			want[kind] = allEvents(t, e.ctx(), f.c)
		}
		sameEvents(t, f.name, f.col.got(), want[kind])
	}
	if len(want["alice"]) >= len(want["admin"]) || len(want["bob"]) >= len(want["admin"]) {
		t.Fatalf("tenants see as much as the admin: alice %d, bob %d, admin %d", len(want["alice"]), len(want["bob"]), len(want["admin"]))
	}
}

// Bad follow requests are refused before the stream starts; a missing
// token is 401.
func TestStreamRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, tc := range []struct {
		url, token string
		status     int
	}{
		{"/v1/events?follow=maybe", adminTok, 400},
		{"/v1/events?follow=1&format=xml", adminTok, 400},
		{"/v1/events?follow=1&since=-1", adminTok, 400},
		{"/v1/events?follow=1", "", 401},
		{"/v1/events?follow=1", bootTok, 403},
	} {
		resp := openStream(t, e.ctx(), e.ts.URL+tc.url, tc.token)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d", tc.url, resp.StatusCode, tc.status)
		}
	}
}

// CloseStreams (the HTTP server's shutdown) ends open streams, and the
// last follower's end stops the hub's tailer.
func TestStreamCloseStreams(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	resp := openStream(t, e.ctx(), e.ts.URL+"/v1/events?follow=1", adminTok)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	e.srv.CloseStreams()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("stream did not end cleanly: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		e.srv.events.startMu.Lock()
		stopped := e.srv.events.done == nil
		e.srv.events.startMu.Unlock()
		if stopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("tailer still running after its last follower ended")
		}
		<-tick.C
	}
	resp2 := openStream(t, e.ctx(), e.ts.URL+"/v1/events?follow=1", adminTok)
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("follow after CloseStreams: %d", resp2.StatusCode)
	}
}
