package donor

import (
	"bytes"
	"net"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// TestQueueWindowsDroppedWithTheirConnections: a queue connection's
// credit window goes when its connection does. A client re-establishing
// its queue connection N times (each new one naming the one it replaces)
// leaves the session one window, at the moment the new connection's
// HELLO is answered; a queue connection that just ends leaves none once
// its handler has returned. The donor kept one window per queue
// connection the session ever had.
func TestQueueWindowsDroppedWithTheirConnections(t *testing.T) {
	d, addr := startDonor(t, 1<<20, 0)
	ctrl, sess := dialHello(t, addr, protocol.KindControl, 0, testCred)
	defer ctrl.Close()
	c, st, id := helloReplacing(t, addr, protocol.KindQueue, sess, 0)
	if st != protocol.StatusOK {
		t.Fatalf("the first queue connection: status %d", st)
	}
	const rejoins = 20
	for i := range rejoins {
		// A request served on it, so that its window has moved.
		if st, _ := request(t, c, protocol.Header{Op: protocol.OpRead, Seq: 1, Offset: 0, Length: 4096}, nil); st != protocol.StatusOK {
			t.Fatalf("round %d: READ: status %d", i, st)
		}
		next, st, nid := helloReplacing(t, addr, protocol.KindQueue, sess, id)
		if st != protocol.StatusOK {
			t.Fatalf("round %d: the queue connection replacing %d: status %d", i, id, st)
		}
		if w := d.QueueWindows(testCred); w != 1 {
			t.Fatalf("after %d re-established queue connection(s), %d credit windows, want 1", i+1, w)
		}
		c.Close()
		c, id = next, nid
	}
	c.Close()
	poll(t, "the ended queue connection's window to go", func() bool { return d.QueueWindows(testCred) == 0 })
}

// deafConn stands for a connection whose handler is slow to see its
// close (as one busy copying a payload that had arrived is): closing it
// does nothing, and it offers no descriptor to shut down.
type deafConn struct{ net.Conn }

func (deafConn) Close() error { return nil }

// TestNextSessionWaitsForEndedSessionsWrites: when a session ends (its
// control connection closed) while one of its data connections' handlers
// still takes in a WRITE's payload, a data connection of the region's
// next session is answered its HELLO only once that handler has
// returned: a write the next session has acknowledged is never
// overwritten by the ended session's. The ended session's connection is
// kept from closing (its close does nothing, standing for a handler slow
// to see it), and the rest of its write's payload arrives after the next
// session opened. The next session's data connection was admitted at
// once, and the ended session's write landed over its acknowledged one.
func TestNextSessionWaitsForEndedSessionsWrites(t *testing.T) {
	for _, k := range dataKinds {
		t.Run(k.name, func(t *testing.T) {
			d, addr, ctrl, c, _, _ := withheldWrite(t, stallSize, k.kind, stallOff, stallLen, stallSent, nil)
			d.mu.Lock()
			r := d.regions[credKey(testCred)]
			s := r.sess
			var data []net.Conn
			for sc := range s.conns {
				if sc != s.ctrl {
					data = append(data, sc)
				}
			}
			for _, sc := range data {
				delete(s.conns, sc)
				s.conns[deafConn{sc}] = struct{}{}
			}
			d.mu.Unlock()
			ctrl.Close()
			poll(t, "the session to end", func() bool {
				d.mu.Lock()
				defer d.mu.Unlock()
				return r.sess == nil
			})

			ctrl2, sess2 := dialHello(t, addr, protocol.KindControl, 0, testCred)
			defer ctrl2.Close()
			type joined struct {
				c   net.Conn
				st  uint16
				err error
			}
			res := make(chan joined, 1)
			go func() {
				c2, st, err := helloStatus(addr, k.kind, sess2)
				res <- joined{c2, st, err}
			}()
			var j joined
			admitted := false
			poll(t, "the next session's HELLO to be answered or to wait", func() bool {
				select {
				case j = <-res:
					admitted = true
					return true
				default:
				}
				return d.fenceWaits.Load() == 1
			})
			later := bytes.Repeat([]byte{0xEE}, stallLen)
			if admitted {
				// The next session writes the range first.
				if j.err != nil || j.st != protocol.StatusOK {
					t.Fatalf("the next session's HELLO: status %d, %v", j.st, j.err)
				}
				defer j.c.Close()
				if st, _ := request(t, j.c, protocol.Header{Op: protocol.OpWrite, Seq: 1, Offset: stallOff, Length: stallLen}, later); st != protocol.StatusOK {
					t.Fatalf("the next session's WRITE: status %d", st)
				}
			}
			// The rest of the ended session's write arrives; its
			// handler takes it in.
			if _, err := c.Write(bytes.Repeat([]byte{0xCD}, stallLen-stallSent)); err != nil {
				t.Fatal(err)
			}
			if st, _, err := answer(c); err != nil || st != protocol.StatusOK {
				t.Fatalf("the ended session's write: status %d, %v", st, err)
			}
			if !admitted {
				select {
				case j = <-res:
				case <-t.Context().Done():
					t.Fatal("the next session's HELLO was not answered once the ended session's handler returned")
				}
				if j.err != nil || j.st != protocol.StatusOK {
					t.Fatalf("the next session's HELLO: status %d, %v", j.st, j.err)
				}
				defer j.c.Close()
				if st, _ := request(t, j.c, protocol.Header{Op: protocol.OpWrite, Seq: 1, Offset: stallOff, Length: stallLen}, later); st != protocol.StatusOK {
					t.Fatalf("the next session's WRITE: status %d", st)
				}
			}
			got := make([]byte, stallLen)
			if _, err := d.ReadRegion(testCred, got, stallOff); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, later) {
				t.Fatalf("the next session's acknowledged write was overwritten by the ended session's (first 0xCD at %d)", bytes.IndexByte(got, 0xCD))
			}
		})
	}
}
