package donor

import (
	"bytes"
	"net"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// helloReplacing opens a connection of kind joining session sess that
// replaces the session's connection whose id is replaces (0: none), and
// returns it with the status of the HELLO's answer and its id.
func helloReplacing(t *testing.T, addr string, kind uint8, sess uint64, replaces uint32) (net.Conn, uint16, uint32) {
	t.Helper()
	c, st, id, _ := helloAs(t, addr, kind, testCred, sess, replaces)
	return c, st, id
}

// helloAs is helloReplacing under the credential cred; it returns the
// refusal's message too.
func helloAs(t *testing.T, addr string, kind uint8, cred string, sess uint64, replaces uint32) (net.Conn, uint16, uint32, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := (&protocol.Hello{Kind: kind, Session: sess, Credential: cred}).Encode(nil)
	b := make([]byte, protocol.HeaderSize, protocol.HeaderSize+len(p))
	(&protocol.Header{Op: protocol.OpHello, Payload: uint32(len(p)), Offset: uint64(replaces)}).Encode(b)
	if _, err := c.Write(append(b, p...)); err != nil {
		t.Fatal(err)
	}
	st, data, err := answer(c)
	if err != nil {
		t.Fatalf("the HELLO's answer: %v", err)
	}
	if st != protocol.StatusOK {
		return c, st, 0, string(data)
	}
	rep, err := protocol.DecodeHelloReply(data)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Queue == 0 {
		t.Fatal("a data connection's HELLO reply carries no connection id")
	}
	return c, st, rep.Queue, ""
}

// TestHelloReplacesConnection: a data connection's HELLO that names
// another connection of its session it replaces (a client
// re-establishing a connection it gave up: a request on it timed out or
// was cancelled) is answered once that connection is closed and its
// handler has returned: nothing it still receives lands afterwards — a
// WRITE whose payload was late on its way (withheld), or one a move's
// pause held (held: it gives up at once, rather than landing when the
// writes resume). The new connection serves. The old connection served
// on, unknown to the donor as given up, and its write landed after the
// new connection was admitted.
func TestHelloReplacesConnection(t *testing.T) {
	for _, k := range dataKinds {
		for _, held := range []bool{false, true} {
			name := k.name + "/withheld"
			if held {
				name = k.name + "/held"
			}
			t.Run(name, func(t *testing.T) {
				ctx := t.Context()
				d, addr := startDonor(t, stallSize, 0)
				ctrl, sess := dialHello(t, addr, protocol.KindControl, 0, testCred)
				defer ctrl.Close()
				c1, st, id := helloReplacing(t, addr, k.kind, sess, 0)
				if st != protocol.StatusOK {
					t.Fatalf("the first connection: status %d", st)
				}
				h := protocol.Header{Op: protocol.OpWrite, Seq: 1, Offset: stallOff, Length: stallLen, Payload: stallLen}
				if held {
					if err := d.PauseWrites(ctx, testCred); err != nil {
						t.Fatal(err)
					}
					send(t, c1, h, bytes.Repeat([]byte{0xAB}, stallLen))
					poll(t, "the write to be held", func() bool { return d.Waiting(testCred) == 1 })
				} else {
					frame := make([]byte, protocol.HeaderSize+stallSent)
					h.Encode(frame)
					copy(frame[protocol.HeaderSize:], bytes.Repeat([]byte{0xAB}, stallSent))
					if _, err := c1.Write(frame); err != nil { // the rest is late
						t.Fatal(err)
					}
					got := make([]byte, stallSent)
					poll(t, "the write's first bytes in the region", func() bool {
						_, err := d.ReadRegion(testCred, got, stallOff)
						return err == nil && got[stallSent-1] == 0xAB
					})
				}

				c2, st, id2 := helloReplacing(t, addr, k.kind, sess, id)
				if st != protocol.StatusOK || id2 == id {
					t.Fatalf("the connection replacing it: status %d, id %d (the old one's %d)", st, id2, id)
				}
				if held {
					if err := d.ResumeWrites(testCred); err != nil {
						t.Fatal(err)
					}
					// Given up, the held write fails: unanswered (its
					// connection closed) or answered with an error
					// (StatusGone, if the answer was written before the
					// close), never acknowledged; that it did not land is
					// checked below.
					if st, _, err := answer(c1); err == nil && st == protocol.StatusOK {
						t.Fatal("the replaced connection's held write was acknowledged once the writes resumed")
					}
				} else {
					sendRestUnanswered(t, c1, stallLen-stallSent)
				}
				got := make([]byte, stallLen)
				if _, err := d.ReadRegion(testCred, got, stallOff); err != nil {
					t.Fatal(err)
				}
				if held && bytes.IndexByte(got, 0xAB) >= 0 {
					t.Error("the replaced connection's held write landed")
				}
				if !held && !bytes.Equal(got[stallSent:], make([]byte, stallLen-stallSent)) {
					t.Error("the rest of the replaced connection's write landed")
				}
				// The new connection serves.
				p := bytes.Repeat([]byte{0x5A}, stallLen)
				if st, _ := request(t, c2, protocol.Header{Op: protocol.OpWrite, Seq: 1, Offset: stallOff, Length: stallLen}, p); st != protocol.StatusOK {
					t.Fatalf("WRITE on the new connection: status %d", st)
				}
				if st, data := request(t, c2, protocol.Header{Op: protocol.OpRead, Seq: 2, Offset: stallOff, Length: stallLen}, nil); st != protocol.StatusOK || !bytes.Equal(data, p) {
					t.Fatalf("READ on the new connection: status %d", st)
				}
			})
		}
	}
}

// TestHelloReplacesOnlyItsSession: a HELLO names a connection of its
// own session only; an id that names none (or a connection that has
// ended) replaces nothing, and the session's other connections serve on.
func TestHelloReplacesOnlyItsSession(t *testing.T) {
	_, addr := startDonor(t, stallSize, 0)
	ctrl, sess := dialHello(t, addr, protocol.KindControl, 0, testCred)
	defer ctrl.Close()
	c1, _, id := helloReplacing(t, addr, protocol.KindSync, sess, 0)
	if _, st, _ := helloReplacing(t, addr, protocol.KindSync, sess, id+100); st != protocol.StatusOK {
		t.Fatalf("a HELLO naming no connection: status %d", st)
	}
	if st, _ := request(t, c1, protocol.Header{Op: protocol.OpPing, Seq: 1}, nil); st != protocol.StatusOK {
		t.Fatalf("the session's connection after a HELLO that replaced nothing: status %d", st)
	}
}
