package donor

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// helloStatus opens a connection of kind joining session sess and
// returns it with the status of the HELLO's answer.
func helloStatus(addr string, kind uint8, sess uint64) (net.Conn, uint16, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, 0, err
	}
	p := (&protocol.Hello{Kind: kind, Session: sess, Credential: testCred}).Encode(nil)
	b := make([]byte, protocol.HeaderSize, protocol.HeaderSize+len(p))
	(&protocol.Header{Op: protocol.OpHello, Payload: uint32(len(p))}).Encode(b)
	if _, err := c.Write(append(b, p...)); err != nil {
		c.Close()
		return nil, 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var hdr [protocol.HeaderSize]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		c.Close()
		return nil, 0, err
	}
	h, err := protocol.DecodeHeader(hdr[:])
	if err == nil {
		_, err = io.CopyN(io.Discard, c, int64(h.Payload))
	}
	_ = c.SetReadDeadline(time.Time{})
	return c, binary.BigEndian.Uint16(hdr[6:]), err
}

// TestJoinWaitsForClosedConnections: a session's new data connection is
// answered its HELLO only once the handler of a connection the donor
// closed itself (a move giving up on a stalled write's payload) has
// returned. A client re-establishes the lost connection and sends on the
// new one the writes the closed one left unanswered; what the closed
// one's handler still takes in (the bytes that had arrived before the
// close) must not land after them. Here the closed connection's handler
// is kept from returning — its close does nothing, standing for a handler
// slow to see it — and takes in the rest of its write's payload: the
// HELLO waits, and is answered once the handler has returned, with that
// write in the region. The HELLO was answered at once.
func TestJoinWaitsForClosedConnections(t *testing.T) {
	for _, k := range dataKinds {
		t.Run(k.name, func(t *testing.T) {
			d, addr, _, c, sess, _ := withheldWrite(t, stallSize, k.kind, stallOff, stallLen, stallSent, nil)
			w := busyWriter(t, d)
			w.stop = func() {}
			w.Stop(dirty.ErrStalled)

			type joined struct {
				c   net.Conn
				st  uint16
				err error
			}
			res := make(chan joined, 1)
			go func() {
				c2, st, err := helloStatus(addr, k.kind, sess)
				res <- joined{c2, st, err}
			}()
			poll(t, "the HELLO to wait for the closed connection's handler", func() bool {
				select {
				case j := <-res:
					t.Fatalf("the HELLO was answered (status %d, %v) while the handler of a connection the donor closed runs", j.st, j.err)
				default:
				}
				return d.fenceWaits.Load() == 1
			})
			// The handler takes in the rest of the payload, and returns
			// without serving another request.
			rest := bytes.Repeat([]byte{0xCD}, stallLen-stallSent)
			if _, err := c.Write(rest); err != nil {
				t.Fatal(err)
			}
			var j joined
			select {
			case j = <-res:
			case <-t.Context().Done():
				t.Fatal("the HELLO was not answered once the closed connection's handler returned")
			}
			if j.err != nil || j.st != protocol.StatusOK {
				t.Fatalf("the HELLO: status %d, %v", j.st, j.err)
			}
			defer j.c.Close()
			got := make([]byte, stallLen)
			if _, err := d.ReadRegion(testCred, got, stallOff); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[stallSent:], rest) {
				t.Error("the closed connection's write is not all in the region once the new connection is admitted")
			}
			// The new connection serves.
			if st, data := request(t, j.c, protocol.Header{Op: protocol.OpRead, Seq: 1, Offset: stallOff, Length: stallLen}, nil); st != protocol.StatusOK || !bytes.Equal(data, got) {
				t.Fatalf("READ on the new connection: status %d", st)
			}
		})
	}
}
