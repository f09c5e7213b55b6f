package rawconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"golang.org/x/sys/unix"
)

// tlsRecord is the largest TLS record payload; crypto/tls writes each
// record with one system call.
const tlsRecord = 16 << 10

// StartTLS runs a TLS handshake on the connection, as the server if server
// is set, else as the client, and from then on carries every byte inside
// the session: the records are read and written with the same raw
// syscalls (spin, then poll(2)), so the thread still never waits on the
// netpoller. The handshake is bounded by the Conn's timeout (a zero
// timeout waits as long as it takes).
func (p *Conn) StartTLS(cfg *tls.Config, server bool) error {
	if p.tc != nil {
		return errors.New("memory: TLS already started")
	}
	fc := &fdConn{p: p}
	var tc *tls.Conn
	if server {
		tc = tls.Server(fc, cfg)
	} else {
		tc = tls.Client(fc, cfg)
	}
	if err := tc.HandshakeContext(context.Background()); err != nil {
		return fmt.Errorf("memory: TLS handshake: %w", err)
	}
	p.tc = tc
	return nil
}

// TLS reports whether StartTLS has run.
func (p *Conn) TLS() bool { return p.tc != nil }

// ConnectionState is the TLS session's state (zero without TLS).
func (p *Conn) ConnectionState() tls.ConnectionState {
	if p.tc == nil {
		return tls.ConnectionState{}
	}
	return p.tc.ConnectionState()
}

// Read reads what has arrived, at least one byte (io.Reader), inside the
// TLS session if there is one.
func (p *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	return p.RecvAtLeast([][]byte{b}, 1)
}

// Write writes b completely (io.Writer).
func (p *Conn) Write(b []byte) (int, error) {
	if err := p.SendV([][]byte{b}); err != nil {
		return 0, err
	}
	return len(b), nil
}

// NetConn is the connection as a net.Conn, for code written against one
// (the donor's control and queue connections over TLS): reads and writes
// go through the Conn (inside the TLS session), Close shuts the socket
// down (the owner closes the Conn). Deadlines are not supported: the
// Conn's timeout (for writes, its send wait) bounds each wait. Its
// writes are the reading goroutine's, as the Conn's own: a goroutine
// that writes while another reads writes through Sender.
func (p *Conn) NetConn() net.Conn { return &netConn{fdConn{p: p}} }

// Sender writes on the Conn (as Write) for a goroutine other than the
// one that reads it (a TLS control connection's credit updates): its
// waits for output never use, or give back, the poll(2) thread the
// reading goroutine holds (see Idle). Its writes and the Conn's others
// are serialised by the caller, as any writes of one Conn.
func (p *Conn) Sender() io.Writer { return sender{p} }

type sender struct{ p *Conn }

func (s sender) Write(b []byte) (int, error) {
	s.p.senders.Add(1)
	defer s.p.senders.Add(-1)
	return s.p.Write(b)
}

// SetTimeout changes the bound of each wait (0: none).
func (p *Conn) SetTimeout(d time.Duration) { p.timeout = d }

// SetSpin changes how long a receive spins before it sleeps in poll(2).
func (p *Conn) SetSpin(d time.Duration) { p.spin = max(d, 0) }

// sendTLS writes bufs as TLS records: small pieces (a header and its
// payload) are gathered into one record, whole records of a large buffer
// are sealed straight from it.
func (p *Conn) sendTLS(bufs [][]byte) error {
	buf := p.wbuf[:0]
	if cap(buf) < tlsRecord {
		buf = make([]byte, 0, tlsRecord)
	}
	defer func() { p.wbuf = buf[:0] }()
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		_, err := p.tc.Write(buf)
		buf = buf[:0]
		return err
	}
	for _, b := range bufs {
		for len(b) > 0 {
			if len(buf) == 0 && len(b) >= tlsRecord {
				k := len(b) - len(b)%tlsRecord
				if _, err := p.tc.Write(b[:k]); err != nil {
					return tlsErr(err)
				}
				b = b[k:]
				continue
			}
			k := min(len(b), tlsRecord-len(buf))
			buf = append(buf, b[:k]...)
			b = b[k:]
			if len(buf) == tlsRecord {
				if err := flush(); err != nil {
					return tlsErr(err)
				}
			}
		}
	}
	return tlsErr(flush())
}

// recvTLS reads plaintext into bufs until at least least bytes arrived;
// each Read of the session returns what one record holds.
func (p *Conn) recvTLS(bufs [][]byte, least int) (int, error) {
	got := 0
	for got < least && len(bufs) > 0 {
		n, err := p.tc.Read(bufs[0])
		got += n
		bufs = advance(bufs, n)
		if err != nil && got < least {
			return got, tlsErr(err)
		}
	}
	return got, nil
}

// tlsErr keeps the transport's errors (already ErrDonorLost) and marks the
// session's own as a lost donor.
func tlsErr(err error) error {
	if err == nil || errors.Is(err, protocol.ErrDonorLost) {
		return err
	}
	return fmt.Errorf("%w: TLS: %v", protocol.ErrDonorLost, err)
}

// fdConn is the raw descriptor as the net.Conn crypto/tls runs over: its
// reads and writes are the Conn's raw ones (spin, poll(2), timeout).
type fdConn struct{ p *Conn }

func (c *fdConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	return c.p.recvRaw([][]byte{b}, 1)
}

func (c *fdConn) Write(b []byte) (int, error) {
	if err := c.p.sendRaw([][]byte{b}); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Close shuts the socket down rather than closing the descriptor (its
// owner closes it with Conn.Close): crypto/tls closes the transport to
// interrupt a handshake, and a descriptor closed under a poll(2) could be
// reused.
func (c *fdConn) Close() error {
	c.p.Shutdown()
	return nil
}

func (c *fdConn) LocalAddr() net.Addr {
	sa, err := unix.Getsockname(c.p.fd)
	if err != nil {
		return &net.TCPAddr{}
	}
	return sockaddr(sa)
}

func (c *fdConn) RemoteAddr() net.Addr {
	sa, err := unix.Getpeername(c.p.fd)
	if err != nil {
		return &net.TCPAddr{}
	}
	return sockaddr(sa)
}

func sockaddr(sa unix.Sockaddr) net.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	}
	return &net.TCPAddr{}
}

// Deadlines: crypto/tls sets one before sending close_notify; the Conn's
// timeout bounds every wait instead.
func (c *fdConn) SetDeadline(time.Time) error      { return nil }
func (c *fdConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fdConn) SetWriteDeadline(time.Time) error { return nil }

// netConn is NetConn's connection: fdConn's addresses and Close, the
// session's reads and writes.
type netConn struct{ fdConn }

func (c *netConn) Read(b []byte) (int, error)  { return c.p.Read(b) }
func (c *netConn) Write(b []byte) (int, error) { return c.p.Write(b) }

// Handover is the transport of a TLS session that starts on a connection
// Go's netpoller serves (its handshake, and whatever is read before the
// peer is authenticated, cost a goroutine, not a thread blocked in
// poll(2)) and goes on, once Adopt has run, on a Conn's raw descriptor.
// Its owner uses it from one goroutine at a time.
type Handover struct {
	net.Conn
	p *Conn // set by Adopt
}

// NewHandover returns a Handover on c.
func NewHandover(c net.Conn) *Handover { return &Handover{Conn: c} }

func (h *Handover) Read(b []byte) (int, error) {
	if h.p != nil {
		return (&fdConn{p: h.p}).Read(b)
	}
	return h.Conn.Read(b)
}

func (h *Handover) Write(b []byte) (int, error) {
	if h.p != nil {
		return (&fdConn{p: h.p}).Write(b)
	}
	return h.Conn.Write(b)
}

// Close shuts p's socket down once adopted (see fdConn.Close), else
// closes the connection.
func (h *Handover) Close() error {
	if h.p != nil {
		return (&fdConn{p: h.p}).Close()
	}
	return h.Conn.Close()
}

// Adopt makes tc, a TLS session whose handshake ran over h, p's: from now
// on h's records travel on p's descriptor (a duplicate of h's connection's,
// see Detach) and p's sends and receives go through tc. What tc has
// already read from the socket stays in tc.
func (p *Conn) Adopt(h *Handover, tc *tls.Conn) {
	h.p = p
	p.tc = tc
}
