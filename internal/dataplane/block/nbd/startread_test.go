package nbd

import (
	"bytes"
	"errors"
	"net"
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
	writes        atomic.Int64 // writes started
	wg            sync.WaitGroup
}

func (b *startingBackend) StartReadAt(p []byte, off int64, done func(error)) bool {
	return b.start(off, &b.started, done, func() error { _, err := b.MemBackend.ReadAt(p, off); return err })
}

func (b *startingBackend) StartWriteAt(p []byte, off int64, done func(error)) bool {
	return b.start(off, &b.writes, done, func() error { _, err := b.MemBackend.WriteAt(p, off); return err })
}

// start answers a request at off (counted in n) from a goroutine once
// release is closed: with io's outcome, or a failure for block fail; false
// for block refuse.
func (b *startingBackend) start(off int64, n *atomic.Int64, done func(error), io func() error) bool {
	if int(off)/b.bs == b.refuse {
		return false
	}
	// wg.Add before the count: a test that loads the count (an atomic,
	// which the race detector sees) before wg.Wait is ordered after every
	// Add it counts; the replies it read came over a socket, which the
	// race detector does not see.
	b.wg.Add(1)
	n.Add(1)
	go func() {
		defer b.wg.Done()
		<-b.release
		if int(off)/b.bs == b.fail {
			done(errors.New("part failed"))
			return
		}
		done(io())
	}()
	return true
}

func (b *startingBackend) ReadAt(p []byte, off int64) (int, error) {
	b.sync.Add(1)
	return b.MemBackend.ReadAt(p, off)
}

// pipelineReads serves be as export "s" and sends n reads of bs bytes, block
// i's with handle i, in one write, so that the server finds them queued at
// depth.
func pipelineReads(t *testing.T, be Backend, n, bs int) *rawConn {
	_, addr := startServer(t, Export{Name: "s", Backend: be})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission("s", false, false)
	var batch []byte
	for i := 0; i < n; i++ {
		h := make([]byte, requestHeaderLen)
		putRequest(h, Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i * bs), Length: uint32(bs)})
		batch = append(batch, h...)
	}
	rc.write(batch)
	return rc
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
	rc := pipelineReads(t, be, n, bs)
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
	rc := pipelineReads(t, be, n, bs)
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
	// startServer's cleanup checks that Serve returns: the connection
	// waits for every started read's done before it ends.
}

// TestReadStarterRepliesNotTaken: a client that pipelines 1-byte reads
// (which hold almost no budget) to a backend that starts them, and never
// takes the replies, makes the server stop reading once replies back up,
// as TestRepliesNotTakenStopReading checks for the workers: the started
// reads not yet sent are bounded, and beyond that reads go to the workers,
// whose queue is.
func TestReadStarterRepliesNotTaken(t *testing.T) {
	const n = 1 << 20
	release := make(chan struct{})
	close(release) // answered at once
	be := &startingBackend{MemBackend: NewMemBackend(1 << 20), bs: 1 << 30, fail: -1, refuse: -1, release: release}
	_, addr := startServer(t, Export{Name: "s", Backend: be})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission("s", false, false)
	rc.c.(*net.TCPConn).SetReadBuffer(64 << 10)
	reqs := make([]byte, n*requestHeaderLen)
	for i := 0; i < n; i++ {
		putRequest(reqs[i*requestHeaderLen:], Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i % (1 << 20)), Length: 1})
	}
	go rc.c.Write(reqs) // ends with an error when the test closes the connection
	last, since := int64(-1), time.Now()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := be.started.Load() + be.sync.Load()
		if got == n {
			t.Fatalf("the server executed all %d reads while their replies were not taken", n)
		}
		if got != last {
			last, since = got, time.Now()
		} else if time.Since(since) > time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server still executes reads after 60 s (%d of %d)", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if be.started.Load() == 0 {
		t.Fatal("no read was started")
	}
	t.Logf("the server stopped after %d of %d reads (%d started)", last, n, be.started.Load())
}

// TestWriteStarter: writes pipelined at depth to a backend that forwards
// them are started from the reader once their payload is in, and answered
// as they complete: every reply comes once, the writes land, the failed one
// gets EIO; a FUA write and one the backend does not start go the usual
// way (WriteAt, through a worker).
func TestWriteStarter(t *testing.T) {
	const n, bs = 16, 4096
	be := &startingBackend{MemBackend: NewMemBackend(n * bs), bs: bs, fail: 5, refuse: 9, release: make(chan struct{})}
	_, addr := startServer(t, Export{Name: "s", Backend: be})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission("s", false, false)
	const fua = 12
	var batch []byte
	for i := 0; i < n; i++ {
		h := make([]byte, requestHeaderLen)
		r := Request{Type: CmdWrite, Handle: uint64(i), Offset: uint64(i * bs), Length: bs}
		if i == fua {
			r.Flags = CmdFlagFUA
		}
		putRequest(h, r)
		batch = append(append(batch, h...), pattern(i, bs)...)
	}
	rc.write(batch)
	// The writes not started are answered while the others wait.
	early := map[uint64]bool{}
	for range 2 {
		r, err := rc.replyAny(n, bs)
		if err != nil {
			t.Fatal(err)
		}
		if r.errno != 0 || (r.handle != uint64(be.refuse) && r.handle != fua) {
			t.Fatalf("early reply: handle %d errno %d, want the refused and the FUA write", r.handle, r.errno)
		}
		early[r.handle] = true
	}
	close(be.release)
	seen := early
	for k := 2; k < n; k++ {
		r, err := rc.replyAny(n, bs)
		if err != nil {
			t.Fatal(err)
		}
		if r.handle >= n || seen[r.handle] {
			t.Fatalf("reply %d: handle %d (again?)", k, r.handle)
		}
		seen[r.handle] = true
		if want := map[bool]uint32{true: EIO, false: 0}[r.handle == uint64(be.fail)]; r.errno != want {
			t.Fatalf("write of block %d: errno %d, want %d", r.handle, r.errno, want)
		}
	}
	if w := be.writes.Load(); w < n-3 {
		t.Fatalf("%d writes started, want at least %d", w, n-3)
	}
	be.wg.Wait() // the backend's goroutines wrote be.Bytes()
	for i := 0; i < n; i++ {
		if i != be.fail && !bytes.Equal(be.Bytes()[i*bs:(i+1)*bs], pattern(i, bs)) {
			t.Fatalf("block %d: the write did not land", i)
		}
	}
}
