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
	return helloMove(t, addr, testCred, replyLen, 0)
}

// helloMove is helloReply on the region of cred, the HELLO carrying
// moveGen (protocol.MoveGeneration) as a move's source's does.
func helloMove(t *testing.T, addr, cred string, replyLen uint32, moveGen uint64) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	data := helloFrame(t, c, protocol.Hello{Kind: protocol.KindControl, Credential: cred}, protocol.Header{Length: replyLen, Offset: moveGen})
	c.Close() // ends the session: the next control HELLO is admitted
	return data
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
	waitSessionEndOf(t, d, testCred)
}

func waitSessionEndOf(t *testing.T, d *Donor, cred string) {
	t.Helper()
	d.mu.Lock()
	r := d.regions[credKey(cred)]
	d.mu.Unlock()
	r.users.Wait()
}

// TestMovedRegionKeepsGeneration: a region received for a move
// (ReceiveRegion) whose source carried the moved region's generation in
// its control HELLO has that generation once it is served as the
// lease's (ActivateRegion), not one of its own: a session that follows
// it, or comes back to where it was, sees the same region. A source that
// carries none (an older agent) leaves the destination's own. A region
// not received for a move never takes a generation from a client, even
// one holding its credential, and activating it keeps its own.
func TestMovedRegionKeepsGeneration(t *testing.T) {
	const size = 1 << 20
	d, addr := startDonor(t, size, 0)
	gen := func(cred string) uint64 {
		t.Helper()
		r, err := protocol.DecodeHelloReply(helloMove(t, addr, cred, protocol.HelloReplyGenSize, 0))
		if err != nil || r.Generation == 0 {
			t.Fatalf("hello reply %+v, %v", r, err)
		}
		waitSessionEndOf(t, d, cred)
		return r.Generation
	}
	src, err := d.RegionGeneration(testCred)
	if err != nil {
		t.Fatal(err)
	}
	if g := gen(testCred); g != src {
		t.Fatalf("RegionGeneration says %#x, the HELLO reply %#x", src, g)
	}
	move := func(tok, cred string, carry uint64) uint64 {
		t.Helper()
		if err := d.ReceiveRegion(tok, size); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.RemoveRegion(cred) })
		helloMove(t, addr, tok, protocol.HelloReplyGenSize, carry) // the source's session
		waitSessionEndOf(t, d, tok)
		if err := d.ActivateRegion(tok, cred); err != nil {
			t.Fatal(err)
		}
		return gen(cred)
	}
	if g := move("tok-1", "moved-1", src); g != src {
		t.Errorf("the moved region's generation is %#x, its source's %#x", g, src)
	}
	if g := move("tok-2", "moved-2", 0); g == src {
		t.Errorf("a region moved by a source that carried no generation has the source's, %#x", g)
	}

	// A region that receives no move ignores a generation a HELLO
	// carries, also when it is activated (renamed) later.
	if err := d.AddRegion("plain", size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.RemoveRegion("plain-renamed") })
	own := gen("plain")
	helloMove(t, addr, "plain", protocol.HelloReplyGenSize, src)
	waitSessionEndOf(t, d, "plain")
	if g := gen("plain"); g != own {
		t.Errorf("a HELLO set the generation of a region that receives no move: %#x, was %#x", g, own)
	}
	if err := d.ActivateRegion("plain", "plain-renamed"); err != nil {
		t.Fatal(err)
	}
	if g := gen("plain-renamed"); g != own {
		t.Errorf("activating a region that received no move changed its generation: %#x, was %#x", g, own)
	}
}
