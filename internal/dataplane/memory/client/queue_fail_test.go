package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// resendRelay relays a session's connections to a donor, as they come,
// except two queue connections, counted in the order of their HELLOs:
// the dropAt-th carries everything but WRITEs, which it takes in and
// drops (never answered), until cut closes, when the relay ends it; the
// holdAt-th carries its HELLO and the reply, then reads nothing more from
// the session (a donor that does not take requests in), until inject
// closes, when it sends the session a malformed frame.
type resendRelay struct {
	donor          string
	ln             net.Listener
	wg             sync.WaitGroup
	dropAt, holdAt int
	cut, inject    chan struct{}
	done           chan struct{} // the test ended

	mu     sync.Mutex
	queues int
	conns  []net.Conn
}

func startResendRelay(t *testing.T, donor string, dropAt, holdAt int) *resendRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &resendRelay{donor: donor, ln: ln, dropAt: dropAt, holdAt: holdAt, cut: make(chan struct{}), inject: make(chan struct{}),
		done: make(chan struct{})}
	r.wg.Go(func() {
		for {
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Go(func() { r.relay(cc) })
		}
	})
	t.Cleanup(func() {
		close(r.done)
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		for _, ch := range []chan struct{}{r.cut, r.inject} {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
		r.wg.Wait()
	})
	return r
}

func (r *resendRelay) dial(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", r.ln.Addr().String())
}

func (r *resendRelay) relay(cc net.Conn) {
	dc, err := net.Dial("tcp", r.donor)
	if err != nil {
		cc.Close()
		return
	}
	r.mu.Lock()
	r.conns = append(r.conns, cc, dc)
	r.mu.Unlock()
	defer cc.Close()
	defer dc.Close()
	r.wg.Go(func() { // the donor's side, as it comes
		_, _ = io.Copy(cc, dc)
		cc.Close()
	})
	var hdr [protocol.HeaderSize]byte
	frame := func() ([]byte, protocol.Header, error) {
		if _, err := io.ReadFull(cc, hdr[:]); err != nil {
			return nil, protocol.Header{}, err
		}
		h, err := protocol.DecodeHeader(hdr[:])
		if err != nil {
			return nil, h, err
		}
		b := make([]byte, protocol.HeaderSize+int(h.Payload))
		copy(b, hdr[:])
		_, err = io.ReadFull(cc, b[protocol.HeaderSize:])
		return b, h, err
	}
	hello, _, err := frame()
	if err != nil || len(hello) <= protocol.HeaderSize {
		return
	}
	n := 0
	if hello[protocol.HeaderSize] == protocol.KindQueue {
		r.mu.Lock()
		r.queues++
		n = r.queues
		r.mu.Unlock()
	}
	if _, err := dc.Write(hello); err != nil {
		return
	}
	switch n {
	case r.holdAt:
		// Nothing more is read from the session: its writes fill the
		// socket buffers (kept small) and block.
		_ = cc.(*net.TCPConn).SetReadBuffer(64 << 10)
		<-r.inject
		bad := make([]byte, protocol.HeaderSize) // no magic: malformed
		_, _ = cc.Write(bad)
		<-r.done // the connection stays open, silent
		return
	case r.dropAt:
		r.wg.Go(func() {
			<-r.cut
			cc.Close()
			dc.Close()
		})
		for {
			b, h, err := frame()
			if err != nil {
				return
			}
			if h.Op == protocol.OpWrite {
				continue // taken in, never answered
			}
			if _, err := dc.Write(b); err != nil {
				return
			}
		}
	}
	_, _ = io.Copy(dc, cc)
}

// TestQueueFailWaitsForResend: a queue pair whose connection the donor
// ends sends its pending WRITEs again on a new connection from a resend
// goroutine, which reads the callers' buffers as it writes them. If the
// pair fails meanwhile (here a malformed frame on the new connection),
// its requests complete with the failure only once the resend has let
// their buffers go: the pair closes the connection (ending the resend's
// write) and waits for its writer lock before it completes them, so a
// caller may reuse a buffer as soon as its request completes. Here the
// resend cannot finish (the relay reads nothing of the new connection)
// and the completion queue is full (the caller drains it only later).
// The pair completed the requests first and closed the connection only
// after, so it waited on the full queue while the resend went on holding
// the buffers, until its write deadline.
func TestQueueFailWaitsForResend(t *testing.T) {
	const credits, size = 16, 2 << 20
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	td := memorytest.Start(t, size, credits)
	// The session's own queue pair is its first queue connection, the
	// pair below its second, which the pair re-establishes as the third.
	relay := startResendRelay(t, td.Addr, 2, 3)
	c := dial(t, td.Addr, Options{Dialer: relay.dial, Timeout: 5 * time.Minute})
	q, err := c.NewQueuePair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		stop := make(chan struct{})
		go func() { // whatever completes meanwhile, so that Close returns
			for {
				select {
				case <-q.Completions():
				case <-stop:
					return
				}
			}
		}()
		_ = q.Close()
		close(stop)
	}()
	// Completed reads fill the completion queue; the caller leaves them.
	for i := range credits {
		if _, err := q.Post(ctx, Op{Off: int64(i) * 4096, Buf: make([]byte, 4096), Tag: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(ctx, t, "the reads to complete and their credits to come back", func() bool {
		return len(q.Completions()) == credits && q.Credits() == credits
	})
	// A window of WRITEs the donor never gets, then their connection
	// ends: they are sent again on a new one, which takes nothing in.
	for i := range credits {
		buf := bytes.Repeat([]byte{byte(i + 1)}, protocol.MaxPayload)
		if _, err := q.Post(ctx, Op{Write: true, Off: int64(i%2) << 20, Buf: buf, Tag: 100 + uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	close(relay.cut)
	waitUntil(ctx, t, "the connection to be re-established", func() bool { return c.Rejoins() == 1 })
	// The resend holds the writer lock: 16 MiB do not fit in the socket
	// buffers of a connection nothing reads.
	if q.wmu.TryLock() {
		q.wmu.Unlock()
		t.Fatal("the resend is not under way")
	}
	close(relay.inject) // the pair fails
	// (Without the order, the resend holds them until its write
	// deadline, Options.Timeout: 5 minutes.)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	waitUntil(wctx, t, "the failed pair's resend to let the requests' buffers go before they complete", func() bool {
		if q.wmu.TryLock() {
			q.wmu.Unlock()
			return true
		}
		return false
	})
	// Now the caller drains: the reads, then the writes, failed.
	got := map[uint64]error{}
	for len(got) < 2*credits {
		select {
		case cp := <-q.Completions():
			got[cp.Tag] = cp.Err
		case <-ctx.Done():
			t.Fatalf("%d completion(s) of %d", len(got), 2*credits)
		}
	}
	for tag, err := range got {
		if tag < 100 && err != nil {
			t.Errorf("read %d: %v", tag, err)
		}
		if tag >= 100 && !errors.Is(err, protocol.ErrBadFrame) {
			t.Errorf("write %d: %v, want the pair's failure", tag-100, err)
		}
	}
	// The pair's connection was ended at the donor (its WRITEs' fate
	// unknown): the session serves on.
	if err := c.Write(ctx, ChannelSync, make([]byte, 4096), 0); err != nil {
		t.Fatalf("the session after the pair failed: %v", err)
	}
}
