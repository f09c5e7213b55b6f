package nbd

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
)

// offsetHeld holds the reads and writes at the offsets given to holdRead
// and holdWrite, and flushes after holdFlush, until their gate is
// released; it records the offsets of the writes that reach it.
type offsetHeld struct {
	*MemBackend
	mu            sync.Mutex
	reads, writes map[int64]*gate
	flush         *gate
	offs          []int64
}

// gate is a held request's: entered is closed when the request reaches
// the backend, which holds it until release is closed.
type gate struct{ entered, release chan struct{} }

func newGate() *gate { return &gate{entered: make(chan struct{}), release: make(chan struct{})} }

// pass closes g.entered and waits for g's release; a nil g passes.
func (g *gate) pass() {
	if g != nil {
		close(g.entered)
		<-g.release
	}
}

func newOffsetHeld(size int64) *offsetHeld {
	return &offsetHeld{MemBackend: NewMemBackend(size), reads: map[int64]*gate{}, writes: map[int64]*gate{}}
}

// holdWrite makes the write at off wait for its gate's release.
func (b *offsetHeld) holdWrite(off int64) *gate {
	g := newGate()
	b.mu.Lock()
	b.writes[off] = g
	b.mu.Unlock()
	return g
}

// holdRead makes the read at off wait for its gate's release.
func (b *offsetHeld) holdRead(off int64) *gate {
	g := newGate()
	b.mu.Lock()
	b.reads[off] = g
	b.mu.Unlock()
	return g
}

// holdFlush makes the next flush wait for its gate's release.
func (b *offsetHeld) holdFlush() *gate {
	g := newGate()
	b.mu.Lock()
	b.flush = g
	b.mu.Unlock()
	return g
}

func (b *offsetHeld) WriteAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	b.offs = append(b.offs, off)
	g := b.writes[off]
	delete(b.writes, off)
	b.mu.Unlock()
	g.pass()
	return b.MemBackend.WriteAt(p, off)
}

func (b *offsetHeld) ReadAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	g := b.reads[off]
	delete(b.reads, off)
	b.mu.Unlock()
	g.pass()
	return b.MemBackend.ReadAt(p, off)
}

func (b *offsetHeld) Flush() error {
	b.mu.Lock()
	g := b.flush
	b.flush = nil
	b.mu.Unlock()
	g.pass()
	return nil
}

// written returns the offsets of the writes that reached the backend,
// sorted.
func (b *offsetHeld) written() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Sorted(slices.Values(b.offs))
}

// readStarting is offsetHeld whose reads at depth the reader starts
// (ReadStarter), as it does those of `rialto attach`'s volume.
type readStarting struct{ *offsetHeld }

func (b readStarting) StartReadAt(p []byte, off int64, done func(error)) bool {
	_, err := b.ReadAt(p, off)
	done(err)
	return true
}

// writeStarting is offsetHeld whose writes without FUA at depth the
// reader starts (WriteStarter).
type writeStarting struct{ *offsetHeld }

func (b writeStarting) StartWriteAt(p []byte, off int64, done func(error)) bool {
	_, err := b.WriteAt(p, off)
	done(err)
	return true
}

// release closes the gates' release channels.
func release(gs ...*gate) {
	for _, g := range gs {
		close(g.release)
	}
}

// abandonNets are the transports the abandoned-connection tests run over:
// TCP, a Unix socket, and TLS (X.509, over TCP).
var abandonNets = []string{"tcp", "unix", "tls"}

// abandonEnds are the ways a client ends its connection in those tests
// (endClient): a Unix socket has no reset of its own.
func abandonEnds(network string) []string {
	if network == "unix" {
		return []string{"closed", "disconnect"}
	}
	return []string{"reset", "closed", "disconnect"}
}

// waitEnded waits until c's socket shows the end of the client's stream
// or of the connection, or the server has closed it (a failed send).
func waitEnded(t *testing.T, c *conn) {
	t.Helper()
	if err := pollPeerEnd(c); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Fatalf("waiting for the client's end on the server's socket: %v", err)
	}
}

// idleBlocked returns a testHookBlocked that hands over, once, the
// connection whose reader waits with nothing to hand over (c.pending
// nil): for payload budget or for the socket, the waits without a group.
func idleBlocked() (hook func(*conn), blocked <-chan *conn) {
	ch := make(chan *conn, 1)
	return func(c *conn) {
		if c.pending == nil {
			select {
			case ch <- c:
			default:
			}
		}
	}, ch
}

// TestAbandonedWhileReaderWaitsForBudget: a client sends writes of 64 MiB
// of payload in all, and more, and goes away without NBD_CMD_DISC while
// the reader waits for payload budget (conn.acquire) and cannot read the
// socket. Of the two workers one executes write 0 (32 MiB) and the other
// write 1 (4 KiB), write 2 (32 MiB - 8 KiB) is queued, and the reader waits
// for budget for write 3 (12 KiB). Write 1 then completes: its 4 KiB of
// budget do not let the reader go on, and its worker, which takes write 2
// while the reader still waits, must find the client's end on the socket
// and hold write 2 rather than execute it. Held writes no longer count
// against the budget (the reader reads on to the end with write 0 still
// executing); neither write 2 nor write 3 reaches the backend. After
// NBD_CMD_DISC, sent before the client shut its side, all four do.
func TestAbandonedWhileReaderWaitsForBudget(t *testing.T) {
	const (
		big  = 32 << 20
		off0 = 0                // write 0, big, executing
		off1 = big              // write 1, 4 KiB, executing
		off2 = big + 4096       // write 2, big - 8 KiB, queued
		off3 = 2 * big          // write 3, 12 KiB: the reader waits for its budget
		len3 = 12 << 10         // 64 MiB - 8 KiB in flight + len3 > 64 MiB
		size = off3 + 1<<20     // the export
		wait = 2 * (big - 4096) // in flight without write 1, when the reader still waits
	)
	if wait+len3 <= maxInflightBytes || big+4096+big-8192 > maxInflightBytes {
		t.Fatalf("the writes do not fit the budget of %d bytes", maxInflightBytes)
	}
	for _, network := range abandonNets {
		for _, how := range abandonEnds(network) {
			t.Run(network+"/"+how, func(t *testing.T) {
				disc := how == "disconnect"
				b := newOffsetHeld(size)
				g0, g1 := b.holdWrite(off0), b.holdWrite(off1)
				// Waiting with nothing to hand over: for budget, the
				// only wait here without a group.
				hook, blocked := idleBlocked()
				ended := make(chan struct{})
				s := &Server{Workers: 2, testHookBlocked: hook, testHookEnded: func() { close(ended) }}
				if err := s.AddExport(Export{Name: testName, Backend: b}); err != nil {
					t.Fatal(err)
				}
				rc := dialAbandon(t, s, network, 0)
				// Write 1 first: with a request in flight, write 0
				// is not served at queue depth 1 by the reader.
				seg := writeReq(nil, 1, off1, 4096, 0)
				seg = writeReq(seg, 0, off0, big, 0)
				seg = writeReq(seg, 2, off2, big-8192, 0)
				seg = writeReq(seg, 3, off3, len3, 0)
				if disc {
					seg = plainReq(seg, Request{Type: CmdDisc})
				}
				rc.write(seg)
				<-g0.entered
				<-g1.entered
				c := <-blocked
				endClient(rc, how)
				waitPeerEnd(t, c)
				release(g1)
				// The reader ends only once the budget no longer
				// stops it: write 0 still holds 32 MiB.
				<-ended
				release(g0)
				if disc {
					for range 4 {
						r, err := rc.reply(0)
						if err != nil || r.errno != 0 {
							t.Fatalf("write %d after a disconnect: errno %d, %v", r.handle, r.errno, err)
						}
					}
					<-c.done
					if got, want := b.written(), []int64{off0, off1, off2, off3}; !slices.Equal(got, want) {
						t.Fatalf("writes that reached the backend: %v, want %v", got, want)
					}
					return
				}
				<-c.done
				if got, want := b.written(), []int64{off0, off1}; !slices.Equal(got, want) {
					t.Fatalf("writes that reached the backend after the client went away: %v, want only the two executing %v", got, want)
				}
			})
		}
	}
}

// TestAbandonedWhileReaderWaitsForSocket: a client that does not read its
// replies goes away without NBD_CMD_DISC while the reader waits for the
// socket to take the replies it queued beyond maxQueuedReplies. A worker
// sends the reply of a 16 MiB read, which the client (its receive buffer
// small) stops taking after the header; the other worker executes write
// 1; write 2 is queued. The client then sends requests the reader answers
// itself (reads beyond the end, refused) until more than maxQueuedReplies
// replies wait, and the reader waits for the socket. When the client goes,
// the send fails; write 2, not started, must not reach the backend. After
// NBD_CMD_DISC, sent before the client shut its side (it then reads its
// replies), both writes do.
func TestAbandonedWhileReaderWaitsForSocket(t *testing.T) {
	const (
		size    = 16 << 20 // the read, and the export
		off1    = size     // write 1, executing
		off2    = size + 4096
		refused = maxQueuedReplies + 4*readerBatch
	)
	for _, network := range abandonNets {
		for _, how := range abandonEnds(network) {
			t.Run(network+"/"+how, func(t *testing.T) {
				disc := how == "disconnect"
				b := newOffsetHeld(size + 1<<20)
				g1 := b.holdWrite(off1)
				// Waiting with nothing to hand over: for the socket,
				// the only wait here without a group.
				hook, blocked := idleBlocked()
				s := &Server{Workers: 2, testHookBlocked: hook}
				if err := s.AddExport(Export{Name: testName, Backend: b}); err != nil {
					t.Fatal(err)
				}
				rc := dialAbandon(t, s, network, 64<<10)
				seg := readReq(nil, 0, 0, size)
				seg = writeReq(seg, 1, off1, 4096, 0)
				seg = writeReq(seg, 2, off2, 4096, 0)
				rc.write(seg)
				<-g1.entered
				// The read's reply is being sent (the worker holds the
				// socket) and cannot be sent whole: the client takes
				// no more than its header.
				readOK(t, rc, 0)
				seg = nil
				for i := range refused {
					seg = readReq(seg, uint64(3+i), size+1<<20, 4096) // beyond the end: EINVAL
				}
				if disc {
					seg = plainReq(seg, Request{Type: CmdDisc})
				}
				rc.write(seg)
				c := <-blocked
				endClient(rc, how)
				waitEnded(t, c)
				release(g1)
				if disc {
					if _, err := io.CopyN(io.Discard, rc.r, size); err != nil {
						t.Fatal(err)
					}
					for range 2 + refused {
						r, err := rc.reply(0)
						if err != nil {
							t.Fatal(err)
						}
						want := uint32(0) // the writes
						if r.handle >= 3 {
							want = EINVAL
						}
						if r.errno != want {
							t.Fatalf("request %d after a disconnect: errno %d, want %d", r.handle, r.errno, want)
						}
					}
					<-c.done
					if got, want := b.written(), []int64{off1, off2}; !slices.Equal(got, want) {
						t.Fatalf("writes that reached the backend: %v, want %v", got, want)
					}
					return
				}
				<-c.done
				if got, want := b.written(), []int64{off1}; !slices.Equal(got, want) {
					t.Fatalf("writes that reached the backend after the client went away: %v, want only the one executing %v", got, want)
				}
			})
		}
	}
}

// readOK reads the header of a simple reply without error to request
// handle (a read's data follows it).
func readOK(t *testing.T, rc *rawConn, handle uint64) {
	t.Helper()
	var rh [simpleReplyLen]byte
	if _, err := io.ReadFull(rc.r, rh[:]); err != nil {
		t.Fatal(err)
	}
	if binary.BigEndian.Uint32(rh[:]) != simpleReplyMagic || binary.BigEndian.Uint32(rh[4:]) != 0 || binary.BigEndian.Uint64(rh[8:]) != handle {
		t.Fatalf("reply header %x, want a simple reply without error to request %d", rh, handle)
	}
}

// TestAbandonedAfterReaderWaitedForBudget: the client's end (its sending
// side shut, without NBD_CMD_DISC, while it still reads) arrives while the
// reader waits for payload budget and no worker starts a write, so none
// looks at the socket. The wait ends when the client has taken the reply
// holding the budget (a 32 MiB read started on the backend); the reader
// then starts the next read on the backend (ReadStarter), which holds it,
// and serves no write. Write 1, queued all along, must still not be
// executed by the worker that takes it afterwards: the reader looked at
// the socket when its wait ended. The worker holds it (the flush queued
// behind it reaches the backend first) and it is refused once the reader
// has read to the end. After NBD_CMD_DISC, sent before the end, it is
// executed.
func TestAbandonedAfterReaderWaitedForBudget(t *testing.T) {
	const (
		big    = 32 << 20
		offB   = 0       // a write executing
		off0   = 4096    // the write executing whose worker then takes write 1
		off1   = 8192    // write 1, queued
		offR2  = big     // the read the reader waits for budget for
		size   = 2 * big // the export
		handle = 10      // the big read's
	)
	for _, network := range abandonNets {
		for _, how := range []string{"shut", "disconnect"} {
			t.Run(network+"/"+how, func(t *testing.T) {
				disc := how == "disconnect"
				b := newOffsetHeld(size)
				gB, g0, g1 := b.holdWrite(offB), b.holdWrite(off0), b.holdWrite(off1)
				gR2, gF := b.holdRead(offR2), b.holdFlush()
				hook, blocked := idleBlocked() // budget, the only wait here without a group
				s := &Server{Workers: 2, testHookBlocked: hook}
				if err := s.AddExport(Export{Name: testName, Backend: readStarting{b}}); err != nil {
					t.Fatal(err)
				}
				rc := dialAbandon(t, s, network, 64<<10)
				// Two writes with the two workers, write 1 and a flush
				// queued, a 32 MiB read started (its reply waits for
				// the client), and a 32 MiB read that waits for budget.
				seg := writeReq(nil, 0, offB, 4096, 0)
				seg = writeReq(seg, 1, off0, 4096, 0)
				seg = writeReq(seg, 2, off1, 4096, 0)
				seg = plainReq(seg, Request{Type: CmdFlush, Handle: 3})
				seg = readReq(seg, handle, 0, big)
				seg = readReq(seg, handle+1, offR2, big)
				if disc {
					seg = plainReq(seg, Request{Type: CmdDisc})
				}
				rc.write(seg)
				<-gB.entered
				<-g0.entered
				c := <-blocked
				endClient(rc, how)
				waitPeerEnd(t, c)
				readOK(t, rc, handle)
				if _, err := io.CopyN(io.Discard, rc.r, big); err != nil {
					t.Fatal(err)
				}
				<-gR2.entered // the reader, its wait over, starts the read
				release(g0)
				if !disc {
					select {
					case <-g1.entered:
						t.Error("write 1 reached the backend after the client's end")
					case <-gF.entered:
					}
				}
				release(g1, gF, gB, gR2)
				if _, err := io.Copy(io.Discard, rc.r); err != nil {
					t.Fatal(err)
				}
				<-c.done
				want := []int64{offB, off0}
				if disc {
					want = []int64{offB, off0, off1}
				}
				if got := b.written(); !slices.Equal(got, want) {
					t.Fatalf("writes that reached the backend: %v, want %v", got, want)
				}
			})
		}
	}
}

// TestAbandonedAfterFailedSend: a worker's send of a reply fails because
// the client went away without NBD_CMD_DISC, while the reader is busy
// starting a write on the backend (WriteStarter, which holds it) and
// reads nothing. The server has observed the client's end: write 1, queued
// behind the reply, must not be executed by the worker whose send failed
// (it holds it, and takes the read queued behind it), nor later.
func TestAbandonedAfterFailedSend(t *testing.T) {
	const (
		size = 16 << 20 // the read whose reply fails, and the export
		offB = size     // a write executing (with FUA: not started)
		off1 = size + 4096
		off2 = size + 8192 // a read queued behind write 1
		offS = size + 12288
	)
	for _, network := range abandonNets {
		for _, how := range abandonEnds(network) {
			if how == "disconnect" {
				continue
			}
			t.Run(network+"/"+how, func(t *testing.T) {
				b := newOffsetHeld(size + 1<<20)
				gB, g1, g2, gS := b.holdWrite(offB), b.holdWrite(off1), b.holdRead(off2), b.holdWrite(offS)
				s := &Server{Workers: 2}
				if err := s.AddExport(Export{Name: testName, Backend: writeStarting{b}}); err != nil {
					t.Fatal(err)
				}
				rc := dialAbandon(t, s, network, 64<<10)
				// A 16 MiB read (its reply fills the socket), a write
				// with FUA with the other worker, write 1 (FUA, so not
				// started by the reader) and a read queued, and a
				// write the reader starts.
				seg := readReq(nil, 0, 0, size)
				seg = writeReq(seg, 1, offB, 4096, CmdFlagFUA)
				seg = writeReq(seg, 2, off1, 4096, CmdFlagFUA)
				seg = readReq(seg, 3, off2, 4096)
				seg = writeReq(seg, 4, offS, 4096, 0)
				rc.write(seg)
				<-gB.entered
				<-gS.entered
				c := onlyConn(t, s)
				readOK(t, rc, 0) // the read's reply is being sent
				endClient(rc, how)
				select {
				case <-g1.entered:
					t.Error("write 1 reached the backend after the reply's send failed")
				case <-g2.entered:
				}
				release(gB, g1, g2, gS)
				<-c.done
				if got, want := b.written(), []int64{offB, offS}; !slices.Equal(got, want) {
					t.Fatalf("writes that reached the backend after the client went away: %v, want only the two executing %v", got, want)
				}
			})
		}
	}
}

// onlyConn returns the connection s serves (on export testName).
func onlyConn(t *testing.T, s *Server) *conn {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.exports[testName].conns {
		if len(s.exports[testName].conns) == 1 {
			return c
		}
	}
	t.Fatalf("%d connections, want 1", len(s.exports[testName].conns))
	return nil
}
