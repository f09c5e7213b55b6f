package nbd

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// pairedReads is a MemBackend whose reads each wait, up to a deadline, until
// two reads have been in the backend at the same time: it records whether
// the server ever serves reads concurrently.
type pairedReads struct {
	*MemBackend
	mu      sync.Mutex
	cond    sync.Cond
	in, max int
	calls   int
	expired bool
}

func (p *pairedReads) ReadAt(b []byte, off int64) (int, error) {
	p.mu.Lock()
	p.calls++
	p.in++
	p.max = max(p.max, p.in)
	p.cond.Broadcast()
	for p.max < 2 && !p.expired {
		p.cond.Wait()
	}
	p.mu.Unlock()
	n, err := p.MemBackend.ReadAt(b, off)
	p.mu.Lock()
	p.in--
	p.mu.Unlock()
	return n, err
}

// TestReadsAtDepthServedConcurrently pipelines reads (queue depth 8, all in
// one segment) and checks that they reach the backend concurrently, through
// the worker pool, rather than one after another in the connection's reader
// (which once served every read it could take from memory itself, so that a
// whole queue depth ran on one thread).
func TestReadsAtDepthServedConcurrently(t *testing.T) {
	const depth, bs = 8, 4096
	mem := NewMemBackend(depth * bs)
	for i := range mem.Bytes() {
		mem.Bytes()[i] = byte(i / bs)
	}
	be := &pairedReads{MemBackend: mem}
	be.cond.L = &be.mu
	// The deadline only ends a wait that would otherwise last forever
	// (reads served one at a time); the assertion is on what happened.
	stop := time.AfterFunc(15*time.Second, func() {
		be.mu.Lock()
		be.expired = true
		be.mu.Unlock()
		be.cond.Broadcast()
	})
	defer stop.Stop()
	_, addr := startServer(t, Export{Name: "d", Backend: be})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission("d", false, false)

	var batch []byte
	for i := 0; i < depth; i++ {
		b := make([]byte, requestHeaderLen)
		putRequest(b, Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i * bs), Length: bs})
		batch = append(batch, b...)
	}
	rc.write(batch) // one write: the server finds the requests queued together
	seen := map[uint64]bool{}
	for i := 0; i < depth; i++ {
		r, err := rc.reply(bs)
		if err != nil {
			t.Fatal(err)
		}
		if r.errno != 0 || r.handle >= depth || seen[r.handle] {
			t.Fatalf("reply %d: handle %d errno %d", i, r.handle, r.errno)
		}
		seen[r.handle] = true
		if !bytes.Equal(r.data, bytes.Repeat([]byte{byte(r.handle)}, bs)) {
			t.Fatalf("read %d returned the wrong data", r.handle)
		}
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.max < 2 {
		t.Fatalf("%d of %d pipelined reads reached the backend, at most %d at a time; want them served concurrently", be.calls, depth, be.max)
	}
}
