package donor

import (
	"context"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"golang.org/x/sys/unix"
)

// creditSenderBlocked reports whether the control connection's credit
// sender is blocked in a write (its peer's receive buffer and the
// donor's send buffer full): a write on the netpoller waits only then.
func creditSenderBlocked(buf []byte) bool {
	n := runtime.Stack(buf, true)
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		if strings.Contains(g, "donor.(*Donor).serveControl.func") && strings.Contains(g, "net.(*conn).Write") &&
			strings.Contains(g, "[IO wait") {
			return true
		}
	}
	return false
}

// TestDeafControlConnectionEndsItsSession: a control connection whose
// peer stopped reading (its receive buffer tiny, never read), with the
// credit sender blocked writing the credit updates of its queue pair's
// completions, ends its session once the peer half-closes it or sends a
// frame the donor refuses: the writes under way are waited for for
// controlGrace (a new session is BUSY meanwhile), then the connection is
// shut down under them and the session ends (a new session on the region
// is accepted). The donor waited for the blocked sender for ever, and the
// session, with the region's subscription, lived until the region was
// removed.
func TestDeafControlConnectionEndsItsSession(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, c *net.TCPConn)
	}{
		{"half-close", func(t *testing.T, c *net.TCPConn) {
			if err := c.CloseWrite(); err != nil {
				t.Fatal(err)
			}
		}},
		{"refused frame", func(t *testing.T, c *net.TCPConn) {
			send(t, c, protocol.Header{Op: protocol.OpRead, Seq: 1, Length: 1}, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := clock.NewFake(time.Unix(1e9, 0))
			d, addr := startDonorWith(t, 1<<20, 0, func(d *Donor) { d.Clock = fc })
			dl := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if err := rc.Control(func(fd uintptr) {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096)
				}); err != nil {
					return err
				}
				return serr
			}}
			nc, err := dl.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			ctrl := nc.(*net.TCPConn)
			defer ctrl.Close()
			sess := helloRaw(t, ctrl, protocol.Hello{Kind: protocol.KindControl, Credential: testCred})
			q, _ := dialHello(t, addr, protocol.KindQueue, sess, testCred)
			defer q.Close()

			// Queue requests, one at a time: each completion has the
			// sender write a credit update, which the control
			// connection's peer never reads.
			buf := make([]byte, 1<<20)
			blocked := false
			for i := 1; i <= 1<<20 && !blocked; i++ {
				if st, _ := request(t, q, protocol.Header{Op: protocol.OpRead, Seq: uint32(i), Length: 1}, nil); st != protocol.StatusOK {
					t.Fatalf("queue READ %d: status %d", i, st)
				}
				if i%64 == 0 {
					blocked = creditSenderBlocked(buf)
				}
			}
			if !blocked {
				t.Fatal("the credit sender never blocked in a write")
			}

			tc.end(t, ctrl)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if err := fc.BlockUntil(ctx, 1); err != nil {
				t.Fatalf("the session's end did not come to wait for the blocked writes (%v): the session lives on", err)
			}
			// The grace: the sender stays blocked, the session lives.
			if c, st, err := helloStatus(addr, protocol.KindControl, 0); err != nil || st != protocol.StatusBusy {
				t.Fatalf("a new session during the grace: status %d, %v; want BUSY", st, err)
			} else {
				c.Close()
			}
			fc.Advance(controlGrace)

			d.mu.Lock()
			r := d.regions[credKey(testCred)]
			d.mu.Unlock()
			for {
				d.mu.Lock()
				ended := r.sess == nil
				d.mu.Unlock()
				if ended {
					break
				}
				select {
				case <-time.After(time.Millisecond):
				case <-ctx.Done():
					t.Fatal("the session did not end once the grace was over")
				}
			}
			c, st, err := helloStatus(addr, protocol.KindControl, 0)
			if err != nil || st != protocol.StatusOK {
				t.Fatalf("a new session once the old one ended: status %d, %v", st, err)
			}
			c.Close()
		})
	}
}
