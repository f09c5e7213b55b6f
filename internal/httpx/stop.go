package httpx

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Conns tracks which connections of an http.Server are serving a request,
// so that Stop waits for those and not for clients to hang up. Set the
// server's ConnState to its Track before serving; the zero Conns is ready.
//
// http.Server.Shutdown waits for every connection to close. An HTTP/2
// client (an agent calling the control plane, the control plane calling
// an agent, a peer's round-trip probe, a Prometheus scraper) keeps its
// idle connection open after the server's GOAWAY, and the server closes
// it itself only a second later: a graceful shutdown of a server that has
// such clients takes over a second even when it serves nothing. HTTP/2
// connections report their state to ConnState per stream (active while a
// stream is open, idle when none is), which is what Conns counts.
type Conns struct {
	mu sync.Mutex
	// busy: the connections serving a request (true: HTTP/2) and, once
	// Stop began, the HTTP/2 ones that served one since, until they close.
	busy     map[net.Conn]bool
	stopping bool
	idle     chan struct{} // closed while none is busy (nil: none was yet)
}

// Track is the server's ConnState hook.
func (c *Conns) Track(nc net.Conn, st http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy == nil {
		c.busy = map[net.Conn]bool{}
	}
	was := len(c.busy)
	switch st {
	case http.StateActive:
		if _, ok := c.busy[nc]; !ok {
			c.busy[nc] = isHTTP2(nc)
		}
	case http.StateIdle:
		// An HTTP/1 connection is idle once its answer is written out.
		// An HTTP/2 one is idle once its last stream's final frame is in
		// the connection's buffer, flushed right after: closing it then
		// may lose the answer. While stopping it is waited for until it
		// closes: its client hangs up once it has its answer after the
		// GOAWAY (Go's do), or the server closes it a second after, its
		// writes done.
		if !c.stopping || !c.busy[nc] {
			delete(c.busy, nc)
		}
	case http.StateClosed, http.StateHijacked:
		delete(c.busy, nc)
	}
	switch {
	case was == 0 && len(c.busy) > 0:
		c.idle = make(chan struct{})
	case was > 0 && len(c.busy) == 0:
		close(c.idle)
	}
}

// isHTTP2 reports whether nc (as ConnState has it) serves HTTP/2.
func isHTTP2(nc net.Conn) bool {
	tc, ok := nc.(*tls.Conn)
	return ok && tc.ConnectionState().NegotiatedProtocol == "h2"
}

// Busy returns the number of connections serving a request (once Stop
// began, also the HTTP/2 ones that did since and are still open) and a
// channel closed once none is (at once if none is).
func (c *Conns) Busy() (int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.busy) == 0 {
		ch := make(chan struct{})
		close(ch)
		return 0, ch
	}
	return len(c.busy), c.idle
}

// Stop stops srv, whose ConnState is c.Track: it takes no new connection
// or request (http.Server.Shutdown: the listeners closed, idle HTTP/1
// connections closed, a GOAWAY on HTTP/2 ones, the functions registered
// with RegisterOnShutdown started), lets the requests under way finish and
// answer until ctx ends, then closes every connection left, idle or not,
// without waiting for clients to hang up. It does not wait for srv's
// Serve to return: its caller does.
//
// It logs at info, each message prefixed with name ("agent API", "control
// plane API"), what it waits for, and a warning if ctx ends first.
//
// An HTTP/2 connection serving a request when Stop begins (or after) is
// waited for until it closes, not only until its requests end: its last
// answer may still sit in its buffer when it turns idle. Its client
// closes it once it has its answers, having had the GOAWAY (Go's clients
// do, and the server closes it itself a second after, its writes done).
// A connection idle when Stop begins is closed at the end at once: an
// answer that ended in the very instant before Stop began (its final
// frame not yet flushed) may be lost.
func (c *Conns) Stop(ctx context.Context, srv *http.Server, log *slog.Logger, name string) {
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	// The hooks of RegisterOnShutdown start once the listeners are
	// closed: what follows is logged when no connection is taken.
	closed := make(chan struct{})
	srv.RegisterOnShutdown(func() { close(closed) })
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(sctx) }() // waited for below
	<-closed
	n, idle := c.Busy()
	if n > 0 {
		attrs := []any{"connections", n}
		if d, ok := ctx.Deadline(); ok {
			attrs = append(attrs, "at_most", time.Until(d).Round(time.Millisecond))
		}
		log.Info(name+": waiting for the requests under way", attrs...)
	}
	select {
	case <-idle:
	case <-ctx.Done():
		n, _ := c.Busy()
		log.Warn(name+": requests still under way; closing their connections", "connections", n)
	}
	cancel() // Shutdown stops waiting for clients to close their connections
	if err := <-shut; err != nil && !errors.Is(err, context.Canceled) {
		log.Warn(name+": shutdown", "err", err)
	}
	srv.Close()
}
