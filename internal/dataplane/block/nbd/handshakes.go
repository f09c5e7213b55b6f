package nbd

import (
	"container/list"
	"context"
	"net"
	"net/netip"
	"sync"
)

// DefaultMaxHandshakes is Server.MaxHandshakes's default. A connection in
// its option phase holds a few tens of KiB at most (its 4 KiB read
// buffer, the option data, at most maxOptionData, its goroutine, TLS
// state), so this many hold some MiB; legitimate clients are in that
// phase for a few round trips, so that a burst of them (a borrower's
// redials, a multi-conn client's connections) is far below it.
const DefaultMaxHandshakes = 256

// DefaultMaxHandshakesPerSource is Server.MaxHandshakesPerSource's
// default: as many as one export may have connections
// (DefaultMaxExportConns), so that a multi-conn client opening all of
// them at once from one host is never cut short, and a quarter of
// DefaultMaxHandshakes, so that one source holds at most that share.
const DefaultMaxHandshakesPerSource = 64

func (s *Server) maxHandshakes() int {
	switch {
	case s.MaxHandshakes > 0:
		return s.MaxHandshakes
	case s.MaxHandshakes < 0:
		return 0 // no bound
	}
	return DefaultMaxHandshakes
}

func (s *Server) maxHandshakesPerSource() int {
	switch {
	case s.MaxHandshakesPerSource > 0:
		return s.MaxHandshakesPerSource
	case s.MaxHandshakesPerSource < 0:
		return 0 // no bound
	}
	return DefaultMaxHandshakesPerSource
}

// handshakeSource names the source of a connection for
// Server.MaxHandshakesPerSource: its IPv4 address, or the /64 of its IPv6
// one (a host is commonly given a whole /64). ok is false for a peer
// without an IP address (a Unix socket's, whose peers are local and
// gated by the socket's permissions): those are not bounded per source.
func handshakeSource(a net.Addr) (key string, ok bool) {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		if a == nil {
			return "", false
		}
		p, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return "", false
		}
		ap = p
	}
	ip := ap.Addr().Unmap()
	if !ip.IsValid() {
		return "", false
	}
	if ip.Is6() {
		p, _ := ip.WithZone("").Prefix(64)
		return p.String(), true
	}
	return ip.String(), true
}

// handshakes tracks a server's connections in their option phase
// (Server.MaxHandshakes, Server.MaxHandshakesPerSource).
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
	// srcs holds, by source (handshakeSource; "" for peers without one),
	// the slots each holds and its connections still open.
	srcs map[string]*hsSource
	seq  uint64 // hsConn.seq of the last one started
}

// hsSource is one source's share of handshakes.
type hsSource struct {
	key     string
	bounded bool // an IP source, bounded by Server.MaxHandshakesPerSource
	// open lists the source's connections in their option phase, oldest
	// first (the *list.Element of each in handshakes.l).
	open list.List
	n    int // slots held, as handshakes.n
}

// hsConn is a connection in handshakes.l.
type hsConn struct {
	nc  net.Conn
	src *hsSource
	sel *list.Element // in src.open
	seq uint64        // arrival order
}

// start takes a slot for nc's option phase. If nc's source holds
// perSource slots (0: no bound) it first closes that source's connection
// longest in its phase and waits for its slot; if the server holds limit
// (0: no bound), it closes the connection longest in its phase of the
// source that holds the most (the oldest of those that hold as many) and
// waits for its slot. It returns false, holding nothing, if ctx ends
// first. end gives the slot back.
func (h *handshakes) start(ctx context.Context, limit, perSource int, nc net.Conn) (*list.Element, bool) {
	key, bounded := handshakeSource(nc.RemoteAddr())
	h.mu.Lock()
	for {
		src := h.srcs[key]
		switch {
		case bounded && perSource > 0 && src != nil && src.n >= perSource:
			if f := src.open.Front(); f != nil {
				h.evictLocked(f.Value.(*list.Element))
			}
		case limit > 0 && h.n >= limit:
			if el := h.greediestLocked(); el != nil {
				h.evictLocked(el)
			}
		default:
			if src == nil {
				if h.srcs == nil {
					h.srcs = map[string]*hsSource{}
				}
				src = &hsSource{key: key, bounded: bounded}
				h.srcs[key] = src
			}
			h.n++
			src.n++
			h.peak = max(h.peak, h.n)
			h.seq++
			hc := &hsConn{nc: nc, src: src, seq: h.seq}
			el := h.l.PushBack(hc)
			hc.sel = src.open.PushBack(el)
			h.mu.Unlock()
			return el, true
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
}

// greediestLocked returns the element in l of the oldest open connection
// of the source with the most open connections (nil: none open); h.mu is
// held. Of sources that hold as many, the one whose oldest connection
// came first: with one source this is l's front.
func (h *handshakes) greediestLocked() *list.Element {
	var best *hsSource
	for _, src := range h.srcs {
		if src.open.Len() == 0 {
			continue
		}
		if best == nil || src.open.Len() > best.open.Len() ||
			src.open.Len() == best.open.Len() && oldest(src).seq < oldest(best).seq {
			best = src
		}
	}
	if best == nil {
		return nil
	}
	return best.open.Front().Value.(*list.Element)
}

// oldest is src's connection longest in its option phase (src.open is
// not empty).
func oldest(src *hsSource) *hsConn {
	return src.open.Front().Value.(*list.Element).Value.(*hsConn)
}

// evictLocked closes el's connection to make room; its slot is given
// back by end, once its goroutine has seen it closed. h.mu is held.
func (h *handshakes) evictLocked(el *list.Element) {
	hc := el.Value.(*hsConn)
	h.l.Remove(el)
	hc.src.open.Remove(hc.sel)
	hc.nc.Close()
	h.evicted++
}

// end gives back the slot start took for el's connection, once its
// option phase has ended (or the connection has).
func (h *handshakes) end(el *list.Element) {
	h.mu.Lock()
	hc := el.Value.(*hsConn)
	// Nothing if start closed it to make room.
	h.l.Remove(el)
	hc.src.open.Remove(hc.sel)
	h.n--
	if hc.src.n--; hc.src.n == 0 {
		delete(h.srcs, hc.src.key)
	}
	if h.freed != nil {
		close(h.freed)
		h.freed = nil
	}
	h.mu.Unlock()
}

// HandshakeStats reports the connections in their option phase now, the
// most there have been at once, and how many were closed to make room
// for newer ones (Server.MaxHandshakes, Server.MaxHandshakesPerSource).
type HandshakeStats struct {
	Active, Peak int
	Evicted      int64
	// Sources is the number of sources (handshakeSource) with
	// connections in their option phase now.
	Sources int
}

// Handshakes reports the server's connections in their option phase.
func (s *Server) Handshakes() HandshakeStats {
	s.hs.mu.Lock()
	defer s.hs.mu.Unlock()
	return HandshakeStats{Active: s.hs.n, Peak: s.hs.peak, Evicted: s.hs.evicted, Sources: len(s.hs.srcs)}
}
