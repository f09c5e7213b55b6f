package appliance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// UDPClient calls a slot over its UDP message path, one request at a time
// (a load generator drives the socket itself with AppendUDP and DecodeUDP).
type UDPClient struct {
	c       *net.UDPConn
	session uint64
	mu      sync.Mutex
	seq     uint32
	buf     []byte
}

// DialUDP opens a session on the slot at addr for entry, presenting the
// lease credential; the HELLO is sent up to three times (datagrams may be
// lost).
func DialUDP(ctx context.Context, addr string, credential []byte, entry string) (*UDPClient, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "udp4", addr)
	if err != nil {
		return nil, fmt.Errorf("appliance: udp dial: %w", err)
	}
	c := &UDPClient{c: nc.(*net.UDPConn), buf: make([]byte, 65536)}
	hello := AppendUDP(nil, UDPHeader{Op: UDPHello, Seq: 1}, HelloPayload(entry, credential))
	for try := 0; ; try++ {
		h, p, err := c.roundTrip(ctx, hello, 1, 500*time.Millisecond)
		if err == nil {
			if h.Op != UDPWelcome {
				c.c.Close()
				return nil, fmt.Errorf("appliance: udp hello refused: %s", p)
			}
			c.session = h.Session
			c.seq = 1
			return c, nil
		}
		if try == 2 || ctx.Err() != nil {
			c.c.Close()
			return nil, err
		}
	}
}

var errTimeout = errors.New("appliance: no udp reply")

func (c *UDPClient) roundTrip(ctx context.Context, d []byte, seq uint32, timeout time.Duration) (UDPHeader, []byte, error) {
	if _, err := c.c.Write(d); err != nil {
		return UDPHeader{}, nil, fmt.Errorf("appliance: udp send: %w", err)
	}
	deadline := time.Now().Add(timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = c.c.SetReadDeadline(deadline)
	for {
		n, err := c.c.Read(c.buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return UDPHeader{}, nil, errTimeout
			}
			return UDPHeader{}, nil, fmt.Errorf("appliance: udp receive: %w", err)
		}
		h, p, err := DecodeUDP(c.buf[:n])
		if err != nil || h.Seq != seq {
			continue // a late reply to an earlier request
		}
		return h, append([]byte(nil), p...), nil
	}
}

// Call sends one request and waits (up to timeout) for its reply.
func (c *UDPClient) Call(ctx context.Context, in []byte, timeout time.Duration) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	h, p, err := c.roundTrip(ctx, AppendUDP(nil, UDPHeader{Op: UDPReq, Seq: c.seq, Session: c.session}, in), c.seq, timeout)
	if err != nil {
		return nil, err
	}
	if h.Op != UDPResp {
		return nil, fmt.Errorf("appliance: udp call: %s", p)
	}
	return p, nil
}

// Session is the session id the slot gave.
func (c *UDPClient) Session() uint64 { return c.session }

// Conn is the client's socket (connected to the slot).
func (c *UDPClient) Conn() *net.UDPConn { return c.c }

// Close closes the socket.
func (c *UDPClient) Close() error { return c.c.Close() }
