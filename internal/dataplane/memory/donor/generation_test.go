package donor

import (
	"net"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// helloReply sends a control HELLO whose length field is replyLen (the
// largest reply the client reads: 0 from clients that predate the
// region's generation) and returns the reply's payload.
func helloReply(t *testing.T, addr string, replyLen uint32) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	m := protocol.Hello{Kind: protocol.KindControl, Credential: testCred}
	b := m.Encode(make([]byte, protocol.HeaderSize))
	h := protocol.Header{Op: protocol.OpHello, Payload: uint32(len(b) - protocol.HeaderSize), Length: replyLen}
	h.Encode(b)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	var hdr [protocol.HeaderSize]byte
	f, err := protocol.ReadFrame(c, hdr[:], nil)
	if err != nil || f.Status != protocol.StatusOK {
		t.Fatalf("hello: %v %d %s", err, f.Status, f.Data)
	}
	c.Close() // ends the session: the next control HELLO is admitted
	return f.Data
}

// TestHelloReplyGeneration: a client that reads the region's generation
// (its HELLO's length at least HelloReplyGenSize) gets it, the same for
// every session on the region and another once the region is created
// again under the same credential; an older client (length 0) gets the
// reply it knows, without it.
func TestHelloReplyGeneration(t *testing.T) {
	d, addr := startDonor(t, 1<<20, 0)
	gen := func() uint64 {
		t.Helper()
		p := helloReply(t, addr, protocol.HelloReplyGenSize)
		r, err := protocol.DecodeHelloReply(p)
		if err != nil || len(p) != protocol.HelloReplyGenSize || r.Generation == 0 {
			t.Fatalf("reply of %d bytes (%+v, %v), want one with a generation", len(p), r, err)
		}
		return r.Generation
	}
	first := gen()
	waitSessionEnd(t, d)
	if g := gen(); g != first {
		t.Fatalf("a second session on the region sees generation %#x, the first %#x", g, first)
	}
	waitSessionEnd(t, d)
	if p := helloReply(t, addr, 0); len(p) != protocol.HelloReplySize {
		t.Fatalf("an older client got a reply of %d bytes, want %d", len(p), protocol.HelloReplySize)
	}
	if err := d.RemoveRegion(testCred); err != nil {
		t.Fatal(err)
	}
	if err := d.AddRegion(testCred, 1<<20); err != nil {
		t.Fatal(err)
	}
	if g := gen(); g == first {
		t.Fatalf("the region created again has the generation of the first, %#x", g)
	}
}

// waitSessionEnd waits until the region has no session (its control
// connection's close reached the donor).
func waitSessionEnd(t *testing.T, d *Donor) {
	t.Helper()
	d.mu.Lock()
	r := d.regions[credKey(testCred)]
	d.mu.Unlock()
	r.users.Wait()
}
