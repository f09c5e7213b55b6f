package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// apiStopTimeout bounds how long a stopping agent lets the requests its
// API is serving finish (their context is cancelled as the agent stops;
// a prepare or a teardown under way ends its wipe or gives it up).
const apiStopTimeout = 2 * time.Second

// apiConns tracks which connections of the agent API are serving a
// request (http.Server.ConnState, which HTTP/2 connections report too, per
// stream: active while one is open, idle when none is). The API stops by
// waiting for them, not for its clients to close their connections:
// http.Server.Shutdown waits for every connection to close, and an HTTP/2
// client (the control plane, a peer's round-trip probe, a Prometheus
// scraper) keeps its idle connection open after the server's GOAWAY, which
// the server closes only a second later.
type apiConns struct {
	mu     sync.Mutex
	active map[net.Conn]bool
	idle   chan struct{} // closed while no connection is active (nil: none was yet)
}

// track is the server's ConnState hook.
func (c *apiConns) track(nc net.Conn, st http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.active == nil {
		c.active = map[net.Conn]bool{}
	}
	was := len(c.active)
	if st == http.StateActive {
		c.active[nc] = true
	} else {
		delete(c.active, nc)
	}
	switch {
	case was == 0 && len(c.active) > 0:
		c.idle = make(chan struct{})
	case was > 0 && len(c.active) == 0:
		close(c.idle)
	}
}

// busy returns the number of connections serving a request and a channel
// closed once none is (at once if none is).
func (c *apiConns) busy() (int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.active) == 0 {
		ch := make(chan struct{})
		close(ch)
		return 0, ch
	}
	return len(c.active), c.idle
}

// stopAPI stops the agent API's server: it takes no new connection or
// request (Shutdown: listener closed, idle HTTP/1 connections closed,
// GOAWAY on HTTP/2 ones), lets the requests under way finish and answer
// for up to apiStopTimeout, then closes every connection left, idle or
// not, without waiting for clients to hang up. serving is closed when
// srv's Serve has returned.
//
// An HTTP/1 connection turns idle once its response is written out; an
// HTTP/2 one once its last stream's final frame is written, which may
// still sit in the connection's buffer, unflushed, when it is closed. The
// requests under way as the agent stops have their context cancelled
// already: their callers must expect the call to fail.
func (a *Agent) stopAPI(srv *http.Server, conns *apiConns, serving <-chan struct{}) {
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(sctx) }() // waited for below
	n, idle := conns.busy()
	if n > 0 {
		a.log.Info("agent API: waiting for the requests under way", "connections", n, "at_most", apiStopTimeout)
	}
	t := time.NewTimer(apiStopTimeout)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
		n, _ := conns.busy()
		a.log.Warn("agent API: requests still under way; closing their connections", "connections", n)
	}
	cancel() // Shutdown stops waiting for clients to close their connections
	if err := <-shut; err != nil && !errors.Is(err, context.Canceled) {
		a.log.Warn("agent API: shutdown", "err", err)
	}
	srv.Close()
	<-serving
	a.log.Debug("agent API stopped")
}
