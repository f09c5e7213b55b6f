package donor_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"golang.org/x/sys/unix"
)

// dialDeaf is dialConn for a peer that will not read: its receive buffer
// is 4 KiB, so that the donor's writes soon wait for it.
func dialDeaf(t *testing.T, addr string, cfg *tls.Config, kind uint8, session uint64) (*conn, uint64) {
	t.Helper()
	dl := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	return dialConnWith(t, dl, addr, cfg, kind, session, nil)
}

// smallSendBuffer is a loopback listener whose connections' send
// buffers are 4 KiB (the kernel doubles it), not grown by the kernel:
// the donor's replies wait for its peer once the peer's receive window
// and those few KiB are full.
func smallSendBuffer(t *testing.T) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// flood sends requests h (1024 at a time, numbered 1 to 1024) on c from
// a goroutine of its own, and never reads a reply, until a write fails
// (the donor ended the connection, or the test half-closed or closed it);
// the channel returned is closed then. The test's end closes c and waits
// for the goroutine.
//
// The first batch (32 KiB of PINGs) reaches the donor whole, in the
// receive window it opens with, and its answers alone fill the peer's
// window and the donor's send buffer: the donor's wait for its peer
// never depends on the peer's later requests getting through. With 64
// at a time, a peer whose receive buffer was full had its kernel drop
// the donor's segments and the acknowledgements they carried; its
// requests were then retransmitted with exponential backoff (RTO 6.5 s)
// and the donor, having answered all it had, waited for more rather
// than for its peer (1 run of TestDeafPeerEndsItsConnection in 60 side
// by side).
func flood(t *testing.T, c *conn, h protocol.Header) <-chan struct{} {
	t.Helper()
	var batch []byte
	for i := range 1024 {
		h.Seq = uint32(i + 1)
		b := make([]byte, protocol.HeaderSize)
		h.Encode(b)
		batch = append(batch, b...)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := c.Write(batch); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		c.sock.Close()
		<-done
	})
	return done
}

// writeBlocked reports whether one of the donor's handlers waits for its
// peer to take a write (a reply): in rawconn's wait for output (a raw
// connection's: sync, bulk, fault, and under TLS every kind), or in a
// write on the netpoller (a plaintext control or queue connection's).
func writeBlocked(buf []byte) bool {
	n := runtime.Stack(buf, true)
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		if !strings.Contains(g, "donor.(*Donor).serve") || strings.Contains(g, "donor_test.") {
			continue
		}
		if strings.Contains(g, "rawconn.(*Conn).waitOutput") ||
			(strings.Contains(g, "net.(*conn).Write") && strings.Contains(g, "[IO wait")) {
			return true
		}
	}
	return false
}

// TestDeafPeerEndsItsConnection: a peer that sends requests (PINGs, or
// READs) on a connection and never reads the replies has the donor's
// handler wait for it to take one; once it has taken none for SendWait
// the connection ends, whether the peer then half-closes it or keeps it
// open: a control connection's session ends with it (a new session on
// the region is accepted), a data connection's handler returns (the
// connection no longer counts against MaxConns) and its session goes on.
// The handler waited in the write for ever, without a look at the
// connection's end: the session (the region's subscription: a new
// session was BUSY) or the connection lived until the region was
// removed.
func TestDeafPeerEndsItsConnection(t *testing.T) {
	ca := memorytest.NewCA(t)
	cases := []struct {
		name      string
		kind, op  uint8
		halfClose bool
	}{
		{"control PING half-closed", protocol.KindControl, protocol.OpPing, true},
		{"control PING open", protocol.KindControl, protocol.OpPing, false},
		{"queue PING half-closed", protocol.KindQueue, protocol.OpPing, true},
		{"queue READ open", protocol.KindQueue, protocol.OpRead, false},
		{"sync PING half-closed", protocol.KindSync, protocol.OpPing, true},
		{"sync READ open", protocol.KindSync, protocol.OpRead, false},
	}
	for _, withTLS := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/tls=%v", tc.name, withTLS), func(t *testing.T) {
				set := func(d *donor.Donor) { d.SendWait = 200 * time.Millisecond }
				serverTLS, cfg := (*tls.Config)(nil), (*tls.Config)(nil)
				if withTLS {
					serverTLS, cfg = memorytest.ServerTLS(t, ca), memorytest.ClientTLS(t, ca)
				}
				// The donor's send buffer is small (not grown to 4 MiB by
				// the kernel): its writes wait once a few KiB of answers
				// are queued, whatever the kernel does with its peer's
				// full receive buffer (see flood).
				td := memorytest.StartOn(t, smallSendBuffer(t), serverTLS, 1<<20, 0, set)
				var deaf *conn
				if tc.kind == protocol.KindControl {
					deaf, _ = dialDeaf(t, td.Addr, cfg, protocol.KindControl, 0)
				} else {
					ctl, sess := dialConn(t, td.Addr, cfg, protocol.KindControl, 0, nil)
					go func() { _, _ = io.Copy(io.Discard, ctl) }() // credit updates; ends with the donor
					deaf, _ = dialDeaf(t, td.Addr, cfg, tc.kind, sess)
				}
				conns := td.D.DataConns()
				h := protocol.Header{Op: tc.op}
				if tc.op == protocol.OpRead {
					h.Length = 64 << 10
				}
				flooded := flood(t, deaf, h)

				// Until the donor's handler waits for the peer to take a
				// reply, or (its wait over already) ended the connection.
				buf := make([]byte, 1<<20)
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
			blocked:
				for !writeBlocked(buf) {
					select {
					case <-flooded:
						break blocked
					case <-time.After(time.Millisecond):
					case <-ctx.Done():
						t.Fatal("the donor's handler never waited for its peer to take a reply")
					}
				}
				if tc.halfClose {
					if err := deaf.sock.(*net.TCPConn).CloseWrite(); err != nil {
						t.Fatal(err)
					}
				}

				if tc.kind == protocol.KindControl {
					waitFor(t, "the session's end", func() bool { return !td.D.Subscribed(testCred) })
					c, _ := dialConn(t, td.Addr, cfg, protocol.KindControl, 0, nil) // accepted: not BUSY
					c.ping(t, 1)
					return
				}
				waitFor(t, "the deaf connection's end", func() bool { return td.D.DataConns() == conns-1 })
				if !td.D.Subscribed(testCred) {
					t.Fatal("the session ended with a data connection")
				}
			})
		}
	}
}

// TestWriteBlockedConnectionHoldsNoThread: a connection whose reply waits
// on the netpoller for a peer that does not read gives back the thread it
// held for poll(2) while it waits there — MaxPollThreads counts it as
// parked, not as holding one — and a connection in use takes that thread:
// at MaxPollThreads 1, with one connection blocked so, another's requests
// are answered from poll(2). Its thread was counted as held (its
// goroutine waits on the netpoller, holding none) until the peer read or
// the connection ended, and the other connections' waits stayed on the
// netpoller (each request paying a netpoller wake-up), as if the donor
// had no thread left.
func TestWriteBlockedConnectionHoldsNoThread(t *testing.T) {
	ca := memorytest.NewCA(t)
	for _, withTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", withTLS), func(t *testing.T) {
			moved := make(chan struct{}, 1)
			// port is the busy connection's peer's; back counts its
			// moves back to poll(2).
			var port, back atomic.Int32
			td, cfg := startIdle(t, ca, withTLS, func(d *donor.Donor) {
				d.MaxPollThreads = 1
				d.SendWait = time.Hour // the deaf connection's reply waits on
				d.SetMoved(func(fd int, parked bool) {
					if p := port.Load(); !parked && p != 0 && int32(peerPort(fd)) == p {
						back.Add(1)
					}
					select {
					case moved <- struct{}{}:
					default:
					}
				})
			})
			_, sess := dialConn(t, td.Addr, cfg, protocol.KindControl, 0, nil)
			deaf, _ := dialDeaf(t, td.Addr, cfg, protocol.KindSync, sess)
			flood(t, deaf, protocol.Header{Op: protocol.OpRead, Length: 64 << 10})
			if state, stack := goroutineState(t, "rawconn.(*Conn).waitOutput"); state != "IO wait" {
				t.Fatalf("the deaf connection's reply waits in state %q, want on the netpoller (IO wait):\n%s", state, stack)
			}

			busy, _ := dialConn(t, td.Addr, cfg, protocol.KindSync, sess, func(nc net.Conn) {
				port.Store(int32(nc.LocalAddr().(*net.TCPAddr).Port))
			})
			want := 2 // the deaf connection, waiting for output, and the busy one, idle
			if withTLS {
				want++ // the control connection is a raw one too
			}
			awaitParked(t, td, moved, want)
			if _, polling := td.D.ParkedConns(); polling != 0 {
				t.Fatalf("%d threads held for poll(2) with every connection on the netpoller", polling)
			}
			busy.ping(t, 1)
			if back.Load() == 0 {
				t.Fatal("the busy connection's request was not served from poll(2): the deaf one's thread was counted")
			}
		})
	}
}

// TestWriteBlockedEpisodesLeaveNoCount: the threads and parked
// connections MaxPollThreads counts come back to none once the
// connections end, after many replies that waited for their peer to
// read (each wait moving to the netpoller and back), one that its peer
// never read (ended by SendWait), and a TLS control connection's
// credit updates (written through Sender while its reading goroutine
// reads): no episode leaves a count behind.
func TestWriteBlockedEpisodesLeaveNoCount(t *testing.T) {
	ca := memorytest.NewCA(t)
	for _, withTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", withTLS), func(t *testing.T) {
			td, cfg := startIdle(t, ca, withTLS, func(d *donor.Donor) {
				d.MaxPollThreads = 2
				d.SendWait = 300 * time.Millisecond
			})
			ctl, sess := dialConn(t, td.Addr, cfg, protocol.KindControl, 0, nil)
			go func() { _, _ = io.Copy(io.Discard, ctl) }() // credit updates
			q, _ := dialConn(t, td.Addr, cfg, protocol.KindQueue, sess, nil)
			slow, _ := dialDeaf(t, td.Addr, cfg, protocol.KindSync, sess)
			const batch = 64
			buf := make([]byte, 1<<20)
			for ep := range 5 {
				for i := range batch {
					slow.send(t, protocol.Header{Op: protocol.OpRead, Seq: uint32(ep*batch + i + 1), Length: 64 << 10}, nil)
				}
				waitFor(t, "a reply waiting for its peer to read", func() bool { return writeBlocked(buf) })
				// The queue's replies (and credit updates) meanwhile.
				for i := range 4 {
					q.send(t, protocol.Header{Op: protocol.OpRead, Seq: uint32(ep*4 + i + 1), Length: 4096}, nil)
					q.reply(t, uint32(ep*4+i+1), protocol.OpRead)
				}
				for i := range batch {
					slow.reply(t, uint32(ep*batch+i+1), protocol.OpRead)
				}
			}
			deaf, _ := dialDeaf(t, td.Addr, cfg, protocol.KindSync, sess)
			conns := td.D.DataConns()
			flood(t, deaf, protocol.Header{Op: protocol.OpRead, Length: 64 << 10})
			waitFor(t, "the deaf connection's end", func() bool { return td.D.DataConns() == conns-1 })
			for _, c := range []*conn{slow, q, ctl} {
				_ = c.sock.Close()
			}
			waitFor(t, "the session's end", func() bool { return !td.D.Subscribed(testCred) && td.D.DataConns() == 0 })
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
				parked, polling := td.D.ParkedConns()
				if parked == 0 && polling == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("with no connection left, %d counted as parked and %d threads as held", parked, polling)
				}
			}
		})
	}
}
