package donor_test

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"golang.org/x/sys/unix"
)

// openFds is the number of the process's open descriptors.
func openFds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

// TestTeardownAtIdleSwitch: the removal of a region whose connection is
// moving to the netpoller (its wait in poll(2) found no request, it has
// not registered yet: the socket is shut down before the registration)
// or back (woken by a request, still registered), plaintext and over
// TLS, ends the connection and returns, leaving no thread held, no
// connection parked and no descriptor behind.
func TestTeardownAtIdleSwitch(t *testing.T) {
	ca := memorytest.NewCA(t)
	for _, withTLS := range []bool{false, true} {
		for _, parking := range []bool{true, false} {
			t.Run(fmt.Sprintf("tls=%v/parking=%v", withTLS, parking), func(t *testing.T) {
				td, cfg, w := startWatched(t, ca, withTLS)
				before := openFds(t)
				ctl, c := w.dial(t, td.Addr, cfg)
				m := w.next(t, true)
				if !parking {
					close(m.release)
					c.send(t, protocol.Header{Op: protocol.OpPing, Seq: 1}, nil)
					m = w.next(t, false)
				}
				removed := make(chan error, 1)
				go func() { removed <- td.D.RemoveRegion(testCred) }()
				// The removal shuts the socket down (then waits for the
				// handler): the connection goes on with its move then.
				for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
					fds := []unix.PollFd{{Fd: int32(m.fd), Events: unix.POLLIN}}
					if _, err := unix.Poll(fds, 0); err == nil && fds[0].Revents&unix.POLLHUP != 0 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("the removal did not shut the connection down")
					}
				}
				close(m.release)
				go func() { // a move back, woken by the shutdown
					for m := range w.moves {
						close(m.release)
					}
				}()
				select {
				case err := <-removed:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the removal did not return")
				}
				if parked, polling := td.D.ParkedConns(); parked != 0 || polling != 0 {
					t.Fatalf("after the removal: %d connections parked, %d threads held", parked, polling)
				}
				ctl.sock.Close()
				c.sock.Close()
				for deadline := time.Now().Add(10 * time.Second); openFds(t) > before; runtime.Gosched() {
					if time.Now().After(deadline) {
						t.Fatalf("%d descriptors open after the removal, %d before", openFds(t), before)
					}
				}
			})
		}
	}
}

// TestIdleSwitchesLeaveNoDescriptors: many moves to the netpoller and
// back, and the ends of the sessions, plaintext and over TLS, leave no
// descriptor open (each move registers a duplicate of the descriptor).
func TestIdleSwitchesLeaveNoDescriptors(t *testing.T) {
	ca := memorytest.NewCA(t)
	for _, withTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", withTLS), func(t *testing.T) {
			const n = 4
			var moved <-chan struct{}
			td, cfg := startIdle(t, ca, withTLS, func(d *donor.Donor) { moved = signalMoves(d) })
			want := n
			if withTLS {
				want++ // the control connection is a raw one too
			}
			before := openFds(t)
			for range 3 {
				ctl, sess := dialConn(t, td.Addr, cfg, protocol.KindControl, 0, nil)
				var cs []*conn
				for range n {
					c, _ := dialConn(t, td.Addr, cfg, protocol.KindSync, sess, nil)
					cs = append(cs, c)
				}
				for k := range 10 {
					awaitParked(t, td, moved, want)
					for _, c := range cs {
						c.ping(t, uint32(k+1))
					}
				}
				for _, c := range cs {
					c.sock.Close()
				}
				ctl.sock.Close() // the session ends
				for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
					parked, polling := td.D.ParkedConns()
					fds := openFds(t)
					if parked == 0 && polling == 0 && fds <= before {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("after the session: %d descriptors open (%d before), %d connections parked, %d threads held", fds, before, parked, polling)
					}
				}
			}
		})
	}
}
