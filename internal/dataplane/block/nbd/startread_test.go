package nbd

import (
	"bytes"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// startingBackend is a MemBackend whose reads can be started (ReadStarter)
// and are answered later, from another goroutine, once release is closed:
// a backend that forwards reads, as `rialto attach`'s volume does. Reads
// of block fail fail with an error; reads of block refuse are not
// started (StartReadAt returns false).
type startingBackend struct {
	*MemBackend
	bs            int
	fail, refuse  int
	release       chan struct{}
	started, sync atomic.Int64
	wg            sync.WaitGroup
}

func (b *startingBackend) StartReadAt(p []byte, off int64, done func(error)) bool {
	if int(off)/b.bs == b.refuse {
		return false
	}
	b.started.Add(1)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		<-b.release
		if int(off)/b.bs == b.fail {
			done(errors.New("part failed"))
			return
		}
		_, err := b.MemBackend.ReadAt(p, off)
		done(err)
	}()
	return true
}

func (b *startingBackend) ReadAt(p []byte, off int64) (int, error) {
	b.sync.Add(1)
	return b.MemBackend.ReadAt(p, off)
}

// TestReadStarter: reads pipelined at depth to a backend that forwards
// them are started from the reader and answered as they complete, out of
// order and from other goroutines: every reply comes once, with its data or
// the failed read's EIO; a read the backend does not start is served by
// ReadAt.
func TestReadStarter(t *testing.T) {
	const n, bs = 16, 4096
	be := &startingBackend{MemBackend: NewMemBackend(n * bs), bs: bs, fail: 5, refuse: 9, release: make(chan struct{})}
	for i := 0; i < n; i++ {
		copy(be.Bytes()[i*bs:], pattern(i, bs))
	}
	_, addr := startServer(t, Export{Name: "s", Backend: be})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission("s", false, false)
	var batch []byte
	for i := 0; i < n; i++ {
		h := make([]byte, requestHeaderLen)
		putRequest(h, Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i * bs), Length: bs})
		batch = append(batch, h...)
	}
	rc.write(batch)
	// The refused read is served (by a worker) while the others wait.
	r, err := rc.replyAny(0, bs)
	if err != nil {
		t.Fatal(err)
	}
	if r.handle != uint64(be.refuse) || r.errno != 0 || !bytes.Equal(r.data, pattern(be.refuse, bs)) {
		t.Fatalf("first reply: handle %d errno %d, want the refused read %d served", r.handle, r.errno, be.refuse)
	}
	close(be.release)
	seen := map[uint64]bool{r.handle: true}
	for k := 1; k < n; k++ {
		r, err := rc.replyAny(0, bs)
		if err != nil {
			t.Fatal(err)
		}
		if r.handle >= n || seen[r.handle] {
			t.Fatalf("reply %d: handle %d (again?)", k, r.handle)
		}
		seen[r.handle] = true
		switch {
		case r.handle == uint64(be.fail):
			if r.errno != EIO {
				t.Fatalf("failed read: errno %d, want EIO", r.errno)
			}
		case r.errno != 0 || !bytes.Equal(r.data, pattern(int(r.handle), bs)):
			t.Fatalf("read of block %d: errno %d or wrong data", r.handle, r.errno)
		}
	}
	// The first request may be served inline (nothing in flight yet).
	if s := be.started.Load(); s < n-2 {
		t.Fatalf("%d reads started, want at least %d", s, n-2)
	}
	be.wg.Wait()
}

// TestReadStarterDisconnect: a client that goes away while its reads are
// started ends the connection only once they have answered; Serve returns
// (startServer's cleanup checks it) and nothing is sent on the gone socket.
func TestReadStarterDisconnect(t *testing.T) {
	const n, bs = 8, 4096
	be := &startingBackend{MemBackend: NewMemBackend(n * bs), bs: bs, fail: -1, refuse: -1, release: make(chan struct{})}
	_, addr := startServer(t, Export{Name: "s", Backend: be})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission("s", false, false)
	var batch []byte
	for i := 0; i < n; i++ {
		h := make([]byte, requestHeaderLen)
		putRequest(h, Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i * bs), Length: bs})
		batch = append(batch, h...)
	}
	rc.write(batch)
	deadline := time.Now().Add(10 * time.Second)
	for be.started.Load() < n-1 {
		// Poll until the reader has started them (the first may be
		// served inline).
		if time.Now().After(deadline) {
			t.Fatalf("%d reads started, want %d", be.started.Load(), n-1)
		}
		runtime.Gosched()
	}
	rc.c.Close()
	close(be.release)
	be.wg.Wait()
}
