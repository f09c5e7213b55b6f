package rawconn

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"golang.org/x/sys/unix"
)

// ErrPeerClosed is wrapped (with protocol.ErrDonorLost) by a receive
// that found the connection closed by its peer (end of stream). A receive
// or send the peer reset wraps the errno (ECONNRESET, EPIPE) instead.
// Not io.EOF: a lost donor must never read as a region's end.
var ErrPeerClosed = errors.New("EOF")

// ErrStalled is wrapped (with protocol.ErrDonorLost) by a send that
// waited longer than the Conn's send wait (SetSendWait) for its socket
// to take more of it: the peer stopped reading.
var ErrStalled = errors.New("the peer took none of it")

// Conn is a synchronous connection driven with raw syscalls, so the thread
// driving it (a client's caller, a donor's serving thread, a mapping's
// fault handler) never waits on the Go scheduler's netpoller. The socket is
// non-blocking: a receive first spins (re-trying the read) for up to spin,
// which keeps the round trip free of a sleep and wake-up when the donor
// answers quickly, then blocks in poll(2) for at most timeout.
//
// The descriptor is not registered with Go's netpoller (see Detach; a
// server's idle Conn registers a duplicate while it waits, see Idle): an
// idle runtime thread sleeping in epoll_wait would otherwise be woken by
// every segment that arrives, and on a 2-vCPU VM that wake-up sat in every
// round trip (loopback p50 24–29 µs registered, 15–18 µs detached;
// docs/memory-protocol.md).
type Conn struct {
	fd int
	// Seq is the sequence number of the last request sent; requests are
	// numbered from Seq+1 on. A caller that sends requests of its own with
	// SendV numbers them from Seq+1 and adds their count to Seq.
	Seq     uint32
	hdr     [protocol.HeaderSize]byte
	iov     [2][]byte
	spin    time.Duration
	timeout time.Duration
	// sendWait, if set, bounds each wait of a send for its socket to
	// take more bytes (SetSendWait), in place of timeout.
	sendWait time.Duration
	// senders counts the sends under way through Sender (goroutines
	// other than the reading one's): their waits for output leave the
	// reading goroutine's thread alone (see Idle).
	senders atomic.Int32

	life   sync.Mutex // orders shutdown against close: fd is never reused under shutdown
	closed bool
	// onClose, if set (OnClose), is called once by the first Close,
	// after the descriptor is closed (life).
	onClose func()

	// tc, once StartTLS has run, carries every byte: records are read and
	// written through fdConn, on the same raw syscalls.
	tc   *tls.Conn
	wbuf []byte // SendV's record buffer over TLS

	// idle, if set (SetIdle), moves the Conn's waits to Go's netpoller
	// once the connection is idle (idle.go). held and park are the
	// reading goroutine's: held, its waits for input sleep in poll(2)
	// (it holds one of idle's threads); else they wait on the netpoller,
	// through park (a duplicate of fd the netpoller knows, nil until the
	// first such wait).
	idle *Idle
	held bool
	park *os.File
	// netpolled is the reading goroutine's too: it came from a wait on
	// Go's netpoller (the HELLO read before New, a wait of Idle's) and
	// has not slept in poll(2) for input since; its next such sleep
	// hands the netpoller to another thread first (kickNetpoller).
	netpolled bool
}

// New returns a Conn on fd, a non-blocking socket descriptor the netpoller
// does not know (see Detach), that spins for up to spin before sleeping in
// poll(2) for a reply and fails a wait longer than timeout (0: none).
func New(fd int, spin, timeout time.Duration) *Conn {
	return &Conn{fd: fd, spin: spin, timeout: timeout, netpolled: true}
}

// Fd is the descriptor.
func (p *Conn) Fd() int { return p.fd }

// Detach returns a non-blocking, close-on-exec duplicate of a TCP
// connection's descriptor that Go's netpoller does not know (unlike
// TCPConn.File's). The caller closes conn, which takes the original off the
// netpoller; the socket lives on in the duplicate.
func Detach(conn net.Conn) (int, error) {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return -1, errors.New("memory: raw channel needs a TCP connection")
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("memory: connection descriptor: %w", err)
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, fmt.Errorf("memory: connection descriptor: %w", err)
	}
	if derr != nil {
		return -1, fmt.Errorf("memory: duplicate connection descriptor: %w", derr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("memory: connection descriptor: %w", err)
	}
	return fd, nil
}

// Shutdown wakes any goroutine blocked on the socket; safe concurrently,
// and a no-op once the Conn is closed.
func (p *Conn) Shutdown() {
	p.life.Lock()
	if !p.closed {
		_ = unix.Shutdown(p.fd, unix.SHUT_RDWR)
	}
	p.life.Unlock()
}

// Close closes the descriptor (and gives back the thread the Conn held,
// see SetIdle); nothing may use the Conn afterwards but Shutdown and
// Close.
func (p *Conn) Close() {
	p.life.Lock()
	var f func()
	if !p.closed {
		p.closed = true
		p.dropIdle()
		_ = unix.Close(p.fd)
		f, p.onClose = p.onClose, nil
	}
	p.life.Unlock()
	if f != nil {
		f()
	}
}

// OnClose makes the first Close call f, once the descriptor is closed
// (a session's TLS connection taken off a revocation list's tracker);
// at once if the Conn is closed already.
func (p *Conn) OnClose(f func()) {
	p.life.Lock()
	if !p.closed {
		p.onClose = f
		f = nil
	}
	p.life.Unlock()
	if f != nil {
		f()
	}
}

// wait blocks until the socket is ready for events or the timeout (for
// output, the send wait if set) passes.
func (p *Conn) wait(events int16) error {
	bound := p.timeout
	if events == unix.POLLOUT && p.sendWait > 0 {
		bound = p.sendWait
	}
	if p.idle != nil && p.timeout == 0 {
		if events == unix.POLLIN {
			return p.waitInput()
		}
		return p.waitOutput(bound)
	}
	ms := -1
	if bound > 0 {
		ms = int(bound.Milliseconds()) + 1
	}
	q := -1 // the socket's unacknowledged bytes as the wait starts
	if events == unix.POLLOUT && p.sendWait > 0 {
		q = p.unacked()
	}
	if events == unix.POLLIN { // the reading goroutine's
		p.leaveNetpoller()
	}
	for {
		fds := [1]unix.PollFd{{Fd: int32(p.fd), Events: events}}
		n, err := unix.Poll(fds[:], ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: poll: %v", protocol.ErrDonorLost, err)
		}
		if n == 0 {
			if events == unix.POLLOUT && p.sendWait > 0 {
				if p.tookMore(&q) {
					continue // a slow reader's: see tookMore
				}
				return p.stalled()
			}
			return fmt.Errorf("%w: no reply within %v", protocol.ErrDonorLost, p.timeout)
		}
		return nil
	}
}

// leaveNetpoller is called by the reading goroutine as it goes to sleep
// in poll(2) for input: if it came from a wait on the netpoller, its
// thread may be the one that waited there, and another takes its place
// (kickNetpoller).
func (p *Conn) leaveNetpoller() {
	if p.netpolled {
		p.netpolled = false
		kickNetpoller()
	}
}

// kickNetpoller has another thread of the process wait on Go's
// netpoller, for the caller is about to sleep in poll(2) on a thread
// that may be the one waiting there.
//
// The thread that waits in epoll_wait for the netpoller runs the first
// goroutine it wakes: a goroutine that came from the netpoller (a
// connection's HELLO; a parked connection's next request, see Idle)
// often runs on it. A goroutine in a system call keeps its thread and
// its P, and while other Ps are idle the runtime's monitor (sysmon)
// leaves them so for 10 ms; no thread goes to wait on the netpoller
// meanwhile, so the process's goroutines that wait for the network —
// a donor's queue and control connections, its accept loop — are woken
// only when sysmon polls it itself, 10 ms after the last poll. A
// donor's connection that serves a request waits in poll(2) for the
// next one for up to Idle.Wait (20 ms): measured against a donor in
// another process, a queue request right after a sync request that had
// woken the parked sync connection took 10–15 ms instead of 0.1–0.3
// (TestQueueRequestAfterSyncWakeUp), and a Dial, whose connections'
// HELLOs are read on the netpoller, 11–21 ms instead of 1 in 3 to 5
// tries of 8. The memory bench's adaptive chooser on 8 threads sends
// the first request of each round (35 ms) to the sync connection,
// parked since its last round: the donor then served none of the
// round's queue requests for most of 10 ms.
//
// Starting a goroutine has the runtime wake a thread for an idle P (its
// wakep), which runs it and, finding nothing else to do, waits on the
// netpoller. If no P is idle, the others' threads look at the netpoller
// as they run out of work.
func kickNetpoller() {
	go func() {}()
}

// stalled is the error of a send whose socket took nothing for the send
// wait.
func (p *Conn) stalled() error {
	return fmt.Errorf("%w: write: %w for %v", protocol.ErrDonorLost, ErrStalled, p.sendWait)
}

// unacked is how many of the bytes written to the socket its peer has
// not acknowledged yet, sent or not (SIOCOUTQ); -1 if the socket does
// not say.
func (p *Conn) unacked() int {
	n, err := unix.IoctlGetInt(p.fd, unix.SIOCOUTQ)
	if err != nil {
		return -1
	}
	return n
}

// tookMore reports whether the socket's peer acknowledged bytes since
// *q was unacked's count (and sets *q to the count now), as a send's
// wait for output reaches the send wait: then the peer reads, only
// slowly, and the wait goes on. A full socket buffer reports room for
// more (POLLOUT) only once a third of it is free again: a peer reading
// over a slow link (a borrower's bulk reads over a shaped link) takes
// the replies' bytes all along, yet may free that third in more than
// the send wait; that wait, taken as the peer's having stopped reading,
// ended its connection.
func (p *Conn) tookMore(q *int) bool {
	n := p.unacked()
	if n < 0 || *q < 0 || n >= *q {
		return false
	}
	*q = n
	return true
}

// SetSendWait bounds how long a send waits for the socket to take more
// of its bytes (a full socket buffer: the peer does not read): past d
// with its peer having acknowledged none of the socket's bytes
// meanwhile the send fails (ErrStalled), whatever the timeout; a peer
// that acknowledged some reads, slowly, and the wait goes on (see
// tookMore). Zero: the timeout
// bounds it (none if zero). A server's Conn, whose reads wait for ever
// (timeout 0), sets it so that a peer that stopped reading its replies
// holds no goroutine for ever.
func (p *Conn) SetSendWait(d time.Duration) { p.sendWait = max(d, 0) }

func advance(bufs [][]byte, n int) [][]byte {
	for n > 0 && len(bufs) > 0 {
		if n >= len(bufs[0]) {
			n -= len(bufs[0])
			bufs = bufs[1:]
		} else {
			bufs[0] = bufs[0][n:]
			n = 0
		}
	}
	for len(bufs) > 0 && len(bufs[0]) == 0 {
		bufs = bufs[1:]
	}
	return bufs
}

// SendV writes bufs completely (writev), waiting in poll(2) while the
// socket buffer is full. Over TLS the bytes leave in as few records as
// their size allows (see sendTLS).
func (p *Conn) SendV(bufs [][]byte) error {
	if p.tc != nil {
		return p.sendTLS(bufs)
	}
	return p.sendRaw(bufs)
}

func (p *Conn) sendRaw(bufs [][]byte) error {
	for len(bufs) > 0 {
		n, err := unix.Writev(p.fd, bufs[:min(len(bufs), 1024)]) // IOV_MAX
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			if err := p.wait(unix.POLLOUT); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: write: %w", protocol.ErrDonorLost, err)
		}
		bufs = advance(bufs, n)
	}
	return nil
}

// RecvV fills bufs completely (readv).
func (p *Conn) RecvV(bufs [][]byte) error {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	_, err := p.RecvAtLeast(bufs, total)
	return err
}

// RecvAtLeast reads into bufs until at least least bytes arrived and returns
// how many did (at most the bufs' total length).
func (p *Conn) RecvAtLeast(bufs [][]byte, least int) (int, error) {
	if least <= 0 {
		return 0, nil
	}
	if p.tc != nil {
		return p.recvTLS(bufs, least)
	}
	return p.recvRaw(bufs, least)
}

func (p *Conn) recvRaw(bufs [][]byte, least int) (int, error) {
	var t0 time.Time
	spins, got := 0, 0
	if p.spin == 0 {
		// A reply is rarely there yet: sleep in poll(2) first rather than
		// paying for a readv that returns EAGAIN.
		if err := p.wait(unix.POLLIN); err != nil {
			return 0, err
		}
	}
	for got < least {
		n, err := unix.Readv(p.fd, bufs)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			if p.spin > 0 {
				if spins == 0 {
					t0 = time.Now()
				}
				spins++
				if spins&15 != 0 || time.Since(t0) < p.spin {
					// Keep the CPU awake, but let a runnable thread
					// (the application, on a small machine) have it.
					Yield()
					continue
				}
			}
			if err := p.wait(unix.POLLIN); err != nil {
				return got, err
			}
			continue
		}
		if err != nil {
			return got, fmt.Errorf("%w: read: %w", protocol.ErrDonorLost, err)
		}
		if n == 0 {
			return got, fmt.Errorf("%w: read: %w", protocol.ErrDonorLost, ErrPeerClosed)
		}
		got += n
		bufs = advance(bufs, n)
	}
	return got, nil
}

// Yield gives the CPU to another runnable thread (sched_yield(2)).
func Yield() { _, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// Do sends request Seq+1 (a READ into buf, or a WRITE of buf, at off) and
// receives its reply.
func (p *Conn) Do(op uint8, buf []byte, off int64) error {
	if err := p.Send(op, buf, off); err != nil {
		return err
	}
	return p.Reply(p.hdr[:], p.Seq, op, buf)
}

// Send sends request Seq+1 (a read of len(buf) bytes, or a write of buf)
// without waiting for its reply: Reply(hdr, Seq, op, buf) gets it.
func (p *Conn) Send(op uint8, buf []byte, off int64) error {
	p.Seq++
	h := protocol.Header{Op: op, Seq: p.Seq, Offset: uint64(off), Length: uint32(len(buf))}
	bufs := append(p.iov[:0], p.hdr[:])
	if op == protocol.OpWrite {
		h.Payload = h.Length
		bufs = append(bufs, buf)
	}
	h.Encode(p.hdr[:])
	return p.SendV(bufs)
}

// SendPageReads sends a READ of one page (ps bytes) for each of pages,
// requests Seq+1 onwards, in one writev (hdrs holds the headers: at least
// len(pages)*protocol.HeaderSize bytes).
func (p *Conn) SendPageReads(pages []int, ps int, hdrs []byte) error {
	for k, i := range pages {
		p.Seq++
		h := protocol.Header{Op: protocol.OpRead, Seq: p.Seq, Offset: uint64(i * ps), Length: uint32(ps)}
		h.Encode(hdrs[k*protocol.HeaderSize:])
	}
	return p.SendV(append(p.iov[:0], hdrs[:len(pages)*protocol.HeaderSize]))
}

// Reply receives the reply to request seq: one readv for the header and, for
// reads, the data behind it (into buf, whose length is the request's).
func (p *Conn) Reply(hdr []byte, seq uint32, op uint8, buf []byte) error {
	extra, err := p.ReplyHead(hdr, seq, op, buf)
	if err != nil || op != protocol.OpRead {
		return err
	}
	return p.RecvV([][]byte{buf[extra:]})
}

// ReplyHead receives the header of the reply to request seq and, for a read,
// whatever of the data arrived with it (into buf), and returns how many
// bytes of buf it filled; the rest of the data follows on the connection.
func (p *Conn) ReplyHead(hdr []byte, seq uint32, op uint8, buf []byte) (int, error) {
	var in [][]byte
	if op == protocol.OpRead {
		in = [][]byte{hdr[:protocol.HeaderSize], buf}
	} else {
		in = [][]byte{hdr[:protocol.HeaderSize]}
	}
	got, err := p.RecvAtLeast(in, protocol.HeaderSize)
	if err != nil {
		return 0, err
	}
	rh, err := protocol.DecodeHeader(hdr[:protocol.HeaderSize])
	if err != nil {
		return 0, err
	}
	if rh.Seq != seq || rh.Op != op || !rh.IsResponse() {
		return 0, fmt.Errorf("%w: reply seq %d op %d for seq %d op %d", protocol.ErrBadFrame, rh.Seq, rh.Op, seq, op)
	}
	extra := got - protocol.HeaderSize // payload bytes already in buf
	if rh.Status != protocol.StatusOK {
		msg := make([]byte, rh.Payload)
		k := copy(msg, buf[:min(extra, len(buf))])
		if err := p.RecvV([][]byte{msg[k:]}); err != nil {
			return 0, err
		}
		return 0, protocol.StatusError(rh.Status, msg)
	}
	if op == protocol.OpRead && int(rh.Length) != len(buf) {
		return 0, fmt.Errorf("%w: read reply of %d bytes for %d", protocol.ErrBadFrame, rh.Length, len(buf))
	}
	return extra, nil
}
