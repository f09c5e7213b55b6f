package nbd

import (
	"container/list"
	"context"
	"net"
	"sync"
)

// DefaultMaxHandshakes is Server.MaxHandshakes's default. A connection in
// its option phase holds a few tens of KiB at most (its 4 KiB read
// buffer, the option data, at most maxOptionData, its goroutine, TLS
// state), so this many hold some MiB; legitimate clients are in that
// phase for a few round trips, so that a burst of them (a borrower's
// redials, a multi-conn client's connections) is far below it.
const DefaultMaxHandshakes = 256

func (s *Server) maxHandshakes() int {
	switch {
	case s.MaxHandshakes > 0:
		return s.MaxHandshakes
	case s.MaxHandshakes < 0:
		return 0 // no bound
	}
	return DefaultMaxHandshakes
}

// handshakes tracks a server's connections in their option phase
// (Server.MaxHandshakes).
type handshakes struct {
	mu sync.Mutex
	// l lists the connections in their option phase, oldest first; one
	// closed to make room leaves it at once.
	l list.List
	// n counts the slots held: l's connections and those closed to make
	// room whose goroutines have not yet given theirs back.
	n       int
	peak    int
	evicted int64
	freed   chan struct{} // closed (and dropped) when a slot is given back
}

// start takes a slot for nc's option phase, first closing the connection
// longest in its phase and waiting for its slot if there are max
// (0: no bound). It returns false, holding nothing, if ctx ends first.
// end gives the slot back.
func (h *handshakes) start(ctx context.Context, limit int, nc net.Conn) (*list.Element, bool) {
	h.mu.Lock()
	for limit > 0 && h.n >= limit {
		if f := h.l.Front(); f != nil {
			h.l.Remove(f)
			f.Value.(net.Conn).Close()
			h.evicted++
		}
		if h.freed == nil {
			h.freed = make(chan struct{})
		}
		freed := h.freed
		h.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, false
		}
		h.mu.Lock()
	}
	h.n++
	h.peak = max(h.peak, h.n)
	el := h.l.PushBack(nc)
	h.mu.Unlock()
	return el, true
}

// end gives back the slot start took for el's connection, once its
// option phase has ended (or the connection has).
func (h *handshakes) end(el *list.Element) {
	h.mu.Lock()
	h.l.Remove(el) // nothing if start closed it to make room
	h.n--
	if h.freed != nil {
		close(h.freed)
		h.freed = nil
	}
	h.mu.Unlock()
}

// HandshakeStats reports the connections in their option phase now, the
// most there have been at once, and how many were closed to make room
// for newer ones (Server.MaxHandshakes).
type HandshakeStats struct {
	Active, Peak int
	Evicted      int64
}

// Handshakes reports the server's connections in their option phase.
func (s *Server) Handshakes() HandshakeStats {
	s.hs.mu.Lock()
	defer s.hs.mu.Unlock()
	return HandshakeStats{Active: s.hs.n, Peak: s.hs.peak, Evicted: s.hs.evicted}
}
