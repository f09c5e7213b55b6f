package nbd

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// heldReads is a MemBackend whose reads wait while the backend is held
// (or until a bound passes); entered reports each read as it reaches the
// backend.
type heldReads struct {
	*MemBackend
	entered chan uint64
	mu      sync.Mutex
	gate    chan struct{} // closed: reads go through
}

func (h *heldReads) hold() {
	h.mu.Lock()
	h.gate = make(chan struct{})
	h.mu.Unlock()
}

func (h *heldReads) let() {
	h.mu.Lock()
	close(h.gate)
	h.mu.Unlock()
}

func (h *heldReads) ReadAt(b []byte, off int64) (int, error) {
	h.mu.Lock()
	g := h.gate
	h.mu.Unlock()
	h.entered <- uint64(off)
	select {
	case <-g:
	case <-time.After(10 * time.Second): // ends a test that failed elsewhere
	}
	return h.MemBackend.ReadAt(b, off)
}

// TestTLSDepthNoPoll: over TLS, a reader that waits for the next request
// while requests are in flight (queue depth above 1) waits in the
// netpoller, not in poll(2), even when it read only one request since its
// last wait. libnbd (fio, nbdcopy) sends each request in a TLS record of its
// own, so at queue depth 32 the reader often found one request per wait; it
// then blocked in poll(2) while the workers served and sent, and 4 KiB
// random reads at queue depth 32 ran at 0.9–1.0× nbdkit --tls=require
// (docs/bench/tls.md). Each round holds two reads (sent together) in the
// backend, then sends a third and a fourth one at a time: the reader waits
// for the fourth with three requests in flight, and for the next round
// with four. The first round shows that the connection does poll when a
// request comes alone with nothing in flight.
func TestTLSDepthNoPoll(t *testing.T) {
	waitTransmitting(t, 0)
	pk := newTestPKI(t)
	const bs = 4096
	mem := NewMemBackend(16 * bs)
	for i := range mem.Bytes() {
		mem.Bytes()[i] = byte(i / bs)
	}
	be := &heldReads{MemBackend: mem, entered: make(chan uint64, 16), gate: make(chan struct{})}
	close(be.gate)
	_, addr := startTLSServer(t, pk.server, false, Export{Name: "x", Backend: be})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.starttls(pk.clientConfig())
	rc.goTransmission("x", false, false)
	waitTransmitting(t, 1)
	req := func(h uint64) []byte {
		b := make([]byte, requestHeaderLen)
		putRequest(b, Request{Type: CmdRead, Handle: h, Offset: h % 16 * bs, Length: bs})
		return b
	}
	entered := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-be.entered:
			case <-time.After(10 * time.Second):
				t.Fatal("a read never reached the backend")
			}
		}
	}
	replies := func(n int) {
		t.Helper()
		for range n {
			r, err := rc.reply(bs)
			if err != nil {
				t.Fatal(err)
			}
			if r.errno != 0 || !bytes.Equal(r.data, bytes.Repeat([]byte{byte(r.handle % 16)}, bs)) {
				t.Fatalf("read %d: errno %d or wrong data", r.handle, r.errno)
			}
		}
	}

	// Queue depth 1: one read at a time, nothing in flight between them.
	p0 := polls.Load()
	h := uint64(0)
	for range 5 {
		rc.write(req(h))
		entered(1)
		replies(1)
		h++
	}
	if polls.Load() == p0 {
		t.Fatal("reads one at a time over TLS never waited in poll(2)")
	}

	held := false
	t.Cleanup(func() {
		if held {
			be.let()
		}
	})
	const rounds = 10
	for round := range rounds {
		// The wait before this round's first requests may still be the
		// queue-depth-1 kind (the first round) or have begun before the
		// previous round's reads were let go.
		be.hold()
		held = true
		rc.write(append(req(h), req(h+1)...)) // one TLS record
		entered(2)
		p1 := polls.Load()
		rc.write(req(h + 2))
		entered(1)
		rc.write(req(h + 3))
		entered(1) // the reader's wait for it has ended
		if got := polls.Load() - p1; got != 0 {
			t.Fatalf("round %d: the reader waited %d time(s) in poll(2) with requests in flight", round, got)
		}
		be.let()
		held = false
		replies(4)
		h += 4
	}
}
