package nbd

import (
	"sync/atomic"
	"testing"
)

// TestForgottenCallEndsOnce: a started request whose send failed is
// forgotten and its caller told at once (startDone); the request may have
// reached the server whole all the same, and the reader may have looked
// its call up already. Completing it then must not call its done again
// (the caller has retried, and the local export would answer, and free,
// the request twice), nor count it again; and a call whose reply is being
// read into its buffer is not forgotten (the buffer is still written).
func TestForgottenCallEndsOnce(t *testing.T) {
	_, addr := startServer(t, Export{Name: "x", Backend: NewMemBackend(1 << 20)})
	c := dial(t, addr, "x")
	var dones atomic.Int32
	register := func() (uint64, *call) {
		cl := &call{typ: CmdRead, buf: make([]byte, 512), done: make(chan struct{}), onDone: func(error) { dones.Add(1) }}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.handle++
		c.pending[c.handle] = cl
		clientCalls.Add(1)
		return c.handle, cl
	}
	before := clientCalls.Load()

	h, cl := register()
	seen := c.lookup(h) // the reader has the reply's header
	if !c.forget(h) {
		t.Fatal("forget refused a live call")
	}
	if cl.state.Load() != callAbandoned {
		t.Fatalf("a forgotten call's state is %d, want abandoned (the reader discards its payload)", cl.state.Load())
	}
	c.complete(h, seen)
	if n := dones.Load(); n != 0 {
		t.Fatalf("done called %d times for a call forgotten before its reply was read", n)
	}

	h, cl = register()
	cl.state.Store(callReceiving) // the reader is filling its buffer
	if c.forget(h) {
		t.Fatal("forgot a call whose reply is being read into its buffer")
	}
	cl.state.Store(callLive)
	c.complete(h, cl)
	if n := dones.Load(); n != 1 {
		t.Fatalf("done called %d times for a call completed the usual way, want 1", n)
	}
	if after := clientCalls.Load(); after != before {
		t.Fatalf("the process's count of calls in flight went from %d to %d", before, after)
	}
}
