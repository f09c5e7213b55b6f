package nbd

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// firstWriteHeld holds the first write until release is closed and
// records the offsets of the writes that reach it.
type firstWriteHeld struct {
	*MemBackend
	entered, release chan struct{}
	mu               sync.Mutex
	offs             []int64
}

func (b *firstWriteHeld) WriteAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	first := len(b.offs) == 0
	b.offs = append(b.offs, off)
	b.mu.Unlock()
	if first {
		close(b.entered)
		<-b.release
	}
	return b.MemBackend.WriteAt(p, off)
}

func (b *firstWriteHeld) written() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int64(nil), b.offs...)
}

// TestAbandonedQueuedWritesDropped: a client sends writes and goes away
// without NBD_CMD_DISC (its connection broke) while the first is being
// executed and the others wait for a worker. The writes still queued must
// not reach the backend afterwards: the client (a composed volume's part,
// `rialto attach`) may have sent them again on a new connection and
// written the range since, and a stale copy landing late would undo that.
// The write being executed completes. With a disconnect, every queued
// request is served.
func TestAbandonedQueuedWritesDropped(t *testing.T) {
	for _, disc := range []bool{false, true} {
		name := "broken"
		if disc {
			name = "disconnect"
		}
		t.Run(name, func(t *testing.T) {
			b := &firstWriteHeld{MemBackend: NewMemBackend(1 << 20), entered: make(chan struct{}), release: make(chan struct{})}
			abandoned := make(chan struct{})
			s := &Server{Workers: 1, testHookAbandoned: func() { close(abandoned) }}
			if err := s.AddExport(Export{Name: testName, Backend: b}); err != nil {
				t.Fatal(err)
			}
			rc := rawDial(t, serveOn(t, s), clientFlagFixedNewstyle|clientFlagNoZeroes)
			rc.goTransmission(testName, false, false)
			stale := bytes.Repeat([]byte{0xee}, 4096)
			// One write executing, one queued for the only worker (the
			// queue holds one: a third would hold the reader until a
			// worker is free). Both in one segment, so that the reader
			// sees the second buffered behind the first and hands the
			// first to the worker rather than executing it itself (and
			// stopping, held, before it reads the client's end).
			var both []byte
			for i := range 2 {
				h := make([]byte, requestHeaderLen)
				putRequest(h, Request{Type: CmdWrite, Handle: uint64(i), Offset: uint64(i) * 4096, Length: 4096})
				both = append(append(both, h...), stale...)
			}
			rc.write(both)
			<-b.entered
			if disc {
				rc.request(Request{Type: CmdDisc}, nil)
				rc.c.(*net.TCPConn).CloseWrite()
				close(b.release)
				for range 2 {
					r, err := rc.reply(0)
					if err != nil || r.errno != 0 {
						t.Fatalf("write %d after a disconnect: errno %d, %v", r.handle, r.errno, err)
					}
				}
				if got := b.written(); len(got) != 2 {
					t.Fatalf("writes that reached the backend: %v, want both", got)
				}
				return
			}
			rc.c.(*net.TCPConn).SetLinger(0)
			rc.c.Close()
			<-abandoned
			close(b.release)
			waitFor(t, "the connection to end", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return len(s.exports[testName].conns) == 0
			})
			if got := b.written(); len(got) != 1 || got[0] != 0 {
				t.Fatalf("writes that reached the backend after the client went away: %v, want only the one executing (0)", got)
			}
		})
	}
}

// memWriteHeld is firstWriteHeld at memory speed: the reader groups
// requests for the workers and writes without FUA from its buffer itself.
type memWriteHeld struct{ *firstWriteHeld }

func (memWriteHeld) memorySpeed() bool { return true }

// writeReq appends a write request of n bytes of 0xee at off.
func writeReq(b []byte, handle, off uint64, n int, flags uint16) []byte {
	h := make([]byte, requestHeaderLen)
	putRequest(h, Request{Type: CmdWrite, Flags: flags, Handle: handle, Offset: off, Length: uint32(n)})
	return append(append(b, h...), bytes.Repeat([]byte{0xee}, n)...)
}

// waitPeerEnd waits until c's socket shows the end of the client's
// stream or of the connection (the server has not read it yet).
func waitPeerEnd(t *testing.T, c *conn) {
	t.Helper()
	if err := pollPeerEnd(c); err != nil {
		t.Fatalf("waiting for the client's end on the server's socket: %v", err)
	}
}

// pollPeerEnd waits up to 20 s until c's socket shows the end of the
// client's stream or of the connection; its error wraps net.ErrClosed if
// the server has closed the socket.
func pollPeerEnd(c *conn) error {
	var perr error
	err := c.peer.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		for {
			k, err := unix.Poll(fds, 20000)
			if err == unix.EINTR {
				continue
			}
			if err == nil && k == 0 {
				err = errors.New("timed out")
			}
			perr = err
			return
		}
	})
	return errors.Join(err, perr)
}

// TestAbandonedWhileReaderWaits: with the only worker executing a write
// and the queue to it full, the reader waits to hand over the next write
// and cannot read the socket. The client then goes away without
// NBD_CMD_DISC. The worker that frees the queue must not execute the
// queued write (nor the one the reader was handing over): it finds the
// client's end on the socket and holds it until the reader has read to
// the end. After NBD_CMD_DISC, sent before the client shut its side, all
// three are served. Over TCP, a Unix socket and TLS (abandonNets).
func TestAbandonedWhileReaderWaits(t *testing.T) {
	for _, network := range abandonNets {
		for _, how := range abandonEnds(network) {
			t.Run(network+"/"+how, func(t *testing.T) {
				b := &firstWriteHeld{MemBackend: NewMemBackend(1 << 20), entered: make(chan struct{}), release: make(chan struct{})}
				blocked := make(chan *conn, 1)
				s := &Server{Workers: 1, testHookBlocked: func(c *conn) {
					// The reader waits to hand over write 2: write 0 is
					// with the worker, write 1 in the queue.
					if c.pending != nil && (*c.pending)[0].req.Handle == 2 {
						blocked <- c
					}
				}}
				if err := s.AddExport(Export{Name: testName, Backend: b}); err != nil {
					t.Fatal(err)
				}
				rc := dialAbandon(t, s, network, 0)
				var seg []byte
				for i := range 3 {
					seg = writeReq(seg, uint64(i), uint64(i)*4096, 4096, 0)
				}
				if how == "disconnect" {
					h := make([]byte, requestHeaderLen)
					putRequest(h, Request{Type: CmdDisc})
					seg = append(seg, h...)
				}
				rc.write(seg)
				<-b.entered
				c := <-blocked
				endClient(rc, how)
				waitPeerEnd(t, c)
				close(b.release)
				if how == "disconnect" {
					for range 3 {
						r, err := rc.reply(0)
						if err != nil || r.errno != 0 {
							t.Fatalf("write %d after a disconnect: errno %d, %v", r.handle, r.errno, err)
						}
					}
					<-c.done
					if got := b.written(); len(got) != 3 {
						t.Fatalf("writes that reached the backend: %v, want all three", got)
					}
					return
				}
				<-c.done
				if got := b.written(); len(got) != 1 || got[0] != 0 {
					t.Fatalf("writes that reached the backend after the client went away: %v, want only the one executing (0)", got)
				}
			})
		}
	}
}

// TestAbandonedReaderServesNoWrite: on a memory-speed backend the reader
// writes a write without FUA from its buffer itself. Here it waits to
// hand a group of requests to the only worker (busy with a write, a
// group queued) when the client goes away without NBD_CMD_DISC. The write
// behind that group, which the reader would have written itself, must not
// reach the backend: whether the worker that frees the queue found the
// client's end (it looks before a write) or not (the queued requests are
// reads, which it starts without looking; the reader then looks itself
// before it serves a write).
func TestAbandonedReaderServesNoWrite(t *testing.T) {
	for _, queued := range []string{"writes", "reads"} {
		t.Run(queued, func(t *testing.T) {
			b := &firstWriteHeld{MemBackend: NewMemBackend(1 << 20), entered: make(chan struct{}), release: make(chan struct{})}
			const size = 512
			blocked := make(chan *conn, 1)
			last := uint64(3 * maxGroup)
			s := &Server{Workers: 1, testHookBlocked: func(c *conn) {
				if c.pending != nil && (*c.pending)[0].req.Handle == 2*maxGroup {
					blocked <- c
				}
			}}
			if err := s.AddExport(Export{Name: testName, Backend: memWriteHeld{b}}); err != nil {
				t.Fatal(err)
			}
			rc := rawDial(t, serveOn(t, s), clientFlagFixedNewstyle|clientFlagNoZeroes)
			rc.goTransmission(testName, false, false)
			// Three groups for the workers, the first with the worker
			// (its first request a write with FUA, held), the second
			// queued, the reader waiting to hand over the third: writes
			// with FUA (which go to the workers) or reads. Then a write
			// the reader serves itself.
			seg := writeReq(nil, 0, 0, size, CmdFlagFUA)
			for i := uint64(1); i < last; i++ {
				if queued == "writes" {
					seg = writeReq(seg, i, i*size, size, CmdFlagFUA)
					continue
				}
				h := make([]byte, requestHeaderLen)
				putRequest(h, Request{Type: CmdRead, Handle: i, Offset: i * size, Length: size})
				seg = append(seg, h...)
			}
			seg = writeReq(seg, last, last*size, size, 0)
			rc.write(seg)
			<-b.entered
			c := <-blocked
			endClient(rc, "closed")
			waitPeerEnd(t, c)
			close(b.release)
			<-c.done
			if got := b.written(); len(got) != 1 || got[0] != 0 {
				t.Fatalf("writes that reached the backend after the client went away: %v, want only the one executing (0)", got)
			}
		})
	}
}

// TestDisconnectAfterFailedReply: a client sends writes, a request the
// server refuses and NBD_CMD_DISC, and resets the connection at once
// (it does not read the replies). The refused request's reply, which the
// reader sends when it reads the disconnect, fails. The writes received
// before the disconnect are still served, as NBD_CMD_DISC asks: the
// failed send does not make the connection abandoned.
func TestDisconnectAfterFailedReply(t *testing.T) {
	b := &firstWriteHeld{MemBackend: NewMemBackend(1 << 20), entered: make(chan struct{}), release: make(chan struct{})}
	disc := make(chan *conn, 1)
	proceed := make(chan struct{})
	ended := make(chan struct{})
	s := &Server{Workers: 1,
		testHookDisc:  func(c *conn) { disc <- c; <-proceed },
		testHookEnded: func() { close(ended) },
	}
	if err := s.AddExport(Export{Name: testName, Backend: b}); err != nil {
		t.Fatal(err)
	}
	rc := rawDial(t, serveOn(t, s), clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission(testName, false, false)
	var seg []byte
	for i := range 2 {
		seg = writeReq(seg, uint64(i), uint64(i)*4096, 4096, 0)
	}
	h := make([]byte, 2*requestHeaderLen)
	putRequest(h, Request{Type: CmdRead, Handle: 2, Offset: 2 << 20, Length: 4096}) // beyond the end: EINVAL
	putRequest(h[requestHeaderLen:], Request{Type: CmdDisc})
	rc.write(append(seg, h...))
	c := <-disc
	endClient(rc, "reset")
	waitPeerEnd(t, c)
	close(proceed)
	<-ended
	if c.abandoned.Load() {
		t.Error("the connection counts as abandoned after a disconnect")
	}
	close(b.release)
	<-c.done
	if got := b.written(); len(got) != 2 {
		t.Fatalf("writes that reached the backend: %v, want both", got)
	}
}

// startedWriteHeld is memWriteHeld whose writes without FUA the reader
// starts itself (WriteStarter).
type startedWriteHeld struct{ memWriteHeld }

func (b startedWriteHeld) StartWriteAt(p []byte, off int64, done func(error)) bool {
	_, err := b.WriteAt(p, off)
	done(err)
	return true
}

// TestAbandonedWhileReaderHandsOver: the reader has read the header of a
// write whose payload is not buffered yet and, before it reads the
// payload, hands the group parsed before it to the only worker (busy with
// a write, a group queued). The client goes away without NBD_CMD_DISC
// while the reader waits; the worker that frees the queue serves reads
// and looks at nothing. The write must not reach the backend: the reader
// looks at the socket after its wait, before it serves the write itself
// (inline, or started on the backend's WriteStarter).
func TestAbandonedWhileReaderHandsOver(t *testing.T) {
	b := &firstWriteHeld{MemBackend: NewMemBackend(4 << 20), entered: make(chan struct{}), release: make(chan struct{})}
	const size = 512
	const third = 2 * maxGroup // the first request of the group handed over
	last := uint64(third + 3)  // the write whose payload is not buffered
	blocked := make(chan *conn, 1)
	s := &Server{Workers: 1, testHookBlocked: func(c *conn) {
		if c.pending != nil && (*c.pending)[0].req.Handle == third {
			blocked <- c
		}
	}}
	if err := s.AddExport(Export{Name: testName, Backend: startedWriteHeld{memWriteHeld{b}}}); err != nil {
		t.Fatal(err)
	}
	rc := rawDial(t, serveOn(t, s), clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission(testName, false, false)
	// A write with FUA (held at the worker) and reads: a group with the
	// worker, one queued, one pending (not full) when the last write's
	// header is read. Its payload is larger than the reader's buffer (64
	// KiB), by little: what the reader leaves in the socket must fit the
	// server's receive window, or the client's FIN, queued behind it,
	// would not arrive (a payload of 128 KiB once left it out).
	seg := writeReq(nil, 0, 0, size, CmdFlagFUA)
	for i := uint64(1); i < last; i++ {
		h := make([]byte, requestHeaderLen)
		putRequest(h, Request{Type: CmdRead, Handle: i, Offset: i * size, Length: size})
		seg = append(seg, h...)
	}
	seg = writeReq(seg, last, 1<<20, 64<<10+512, 0)
	rc.write(seg)
	<-b.entered
	c := <-blocked
	// Its sending side shut, not the connection: the replies sent
	// meanwhile find it open (a reset would end the reader before it
	// reads the payload).
	rc.c.(*net.TCPConn).CloseWrite()
	waitPeerEnd(t, c)
	close(b.release)
	<-c.done
	if got := b.written(); len(got) != 1 || got[0] != 0 {
		t.Fatalf("writes that reached the backend after the client went away: %v, want only the one executing (0)", got)
	}
}
