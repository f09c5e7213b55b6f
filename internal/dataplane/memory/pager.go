package memory

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// pager is a synchronous connection driven with raw syscalls, so the fault
// handler's thread never waits on the Go scheduler's netpoller. The socket is
// non-blocking: a receive first spins (re-trying the read) for up to spin,
// which keeps the round trip free of a sleep and wake-up when the donor
// answers quickly, then blocks in poll(2) for at most timeout.
//
// The descriptor is not registered with Go's netpoller (see detachFd): an
// idle runtime thread sleeping in epoll_wait would otherwise be woken by
// every segment that arrives, and on a 2-vCPU VM that wake-up sat in every
// round trip (loopback p50 24–29 µs registered, 15–18 µs detached;
// docs/memory-protocol.md).
type pager struct {
	fd      int
	seq     uint32
	hdr     [HeaderSize]byte
	iov     [2][]byte
	spin    time.Duration
	timeout time.Duration

	life   sync.Mutex // orders shutdown against close: fd is never reused under shutdown
	closed bool
}

func (c *Client) newPager(ctx context.Context) (*pager, error) {
	return c.newPagerKind(ctx, KindSync)
}

func (c *Client) newPagerKind(ctx context.Context, kind uint8) (*pager, error) {
	conn, _, err := c.handshake(ctx, kind)
	if err != nil {
		return nil, err
	}
	fd, err := detachFd(conn)
	_ = conn.Close()
	if err != nil {
		return nil, err
	}
	return &pager{fd: fd, spin: c.opts.Spin, timeout: c.opts.Timeout}, nil
}

// detachFd returns a non-blocking, close-on-exec duplicate of a TCP
// connection's descriptor that Go's netpoller does not know (unlike
// TCPConn.File's). The caller closes conn, which takes the original off the
// netpoller; the socket lives on in the duplicate.
func detachFd(conn net.Conn) (int, error) {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return -1, fmt.Errorf("memory: raw channel needs a TCP connection")
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

// shutdown wakes any goroutine blocked on the socket; safe concurrently,
// and a no-op once the pager is closed.
func (p *pager) shutdown() {
	p.life.Lock()
	if !p.closed {
		_ = unix.Shutdown(p.fd, unix.SHUT_RDWR)
	}
	p.life.Unlock()
}

// close closes the descriptor; nothing may use the pager afterwards but
// shutdown and close.
func (p *pager) close() {
	p.life.Lock()
	if !p.closed {
		p.closed = true
		_ = unix.Close(p.fd)
	}
	p.life.Unlock()
}

// wait blocks until the socket is ready for events or the timeout passes.
func (p *pager) wait(events int16) error {
	ms := -1
	if p.timeout > 0 {
		ms = int(p.timeout.Milliseconds()) + 1
	}
	for {
		fds := [1]unix.PollFd{{Fd: int32(p.fd), Events: events}}
		n, err := unix.Poll(fds[:], ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: poll: %v", ErrDonorLost, err)
		}
		if n == 0 {
			return fmt.Errorf("%w: no reply within %v", ErrDonorLost, p.timeout)
		}
		return nil
	}
}

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

func (p *pager) sendv(bufs [][]byte) error {
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
			return fmt.Errorf("%w: write: %v", ErrDonorLost, err)
		}
		bufs = advance(bufs, n)
	}
	return nil
}

func (p *pager) recvv(bufs [][]byte) error {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	_, err := p.recvAtLeast(bufs, total)
	return err
}

// recvAtLeast reads into bufs until at least least bytes arrived and returns
// how many did (at most the bufs' total length).
func (p *pager) recvAtLeast(bufs [][]byte, least int) (int, error) {
	if least <= 0 {
		return 0, nil
	}
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
					schedYield()
					continue
				}
			}
			if err := p.wait(unix.POLLIN); err != nil {
				return got, err
			}
			continue
		}
		if err != nil {
			return got, fmt.Errorf("%w: read: %v", ErrDonorLost, err)
		}
		if n == 0 {
			return got, fmt.Errorf("%w: read: EOF", ErrDonorLost)
		}
		got += n
		bufs = advance(bufs, n)
	}
	return got, nil
}

func schedYield() { _, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

func (p *pager) do(op uint8, buf []byte, off int64) error {
	if err := p.send(op, buf, off); err != nil {
		return err
	}
	return p.reply(p.hdr[:], p.seq, op, buf)
}

// send sends request p.seq+1 (a read of len(buf) bytes, or a write of buf)
// without waiting for its reply: p.reply(p.hdr[:], p.seq, op, buf) gets it.
func (p *pager) send(op uint8, buf []byte, off int64) error {
	p.seq++
	h := Header{Op: op, Seq: p.seq, Offset: uint64(off), Length: uint32(len(buf))}
	bufs := append(p.iov[:0], p.hdr[:])
	if op == OpWrite {
		h.Payload = h.Length
		bufs = append(bufs, buf)
	}
	h.Encode(p.hdr[:])
	return p.sendv(bufs)
}

// sendPageReads sends a READ of one page (ps bytes) for each of pages,
// requests p.seq+1 onwards, in one writev (hdrs holds the headers: at least
// len(pages)*HeaderSize bytes).
func (p *pager) sendPageReads(pages []int, ps int, hdrs []byte) error {
	for k, i := range pages {
		p.seq++
		h := Header{Op: OpRead, Seq: p.seq, Offset: uint64(i * ps), Length: uint32(ps)}
		h.Encode(hdrs[k*HeaderSize:])
	}
	return p.sendv(append(p.iov[:0], hdrs[:len(pages)*HeaderSize]))
}

// reply receives the reply to request seq: one readv for the header and, for
// reads, the data behind it (into buf, whose length is the request's).
func (p *pager) reply(hdr []byte, seq uint32, op uint8, buf []byte) error {
	extra, err := p.replyHead(hdr, seq, op, buf)
	if err != nil || op != OpRead {
		return err
	}
	return p.recvv([][]byte{buf[extra:]})
}

// replyHead receives the header of the reply to request seq and, for a read,
// whatever of the data arrived with it (into buf), and returns how many
// bytes of buf it filled; the rest of the data follows on the connection.
func (p *pager) replyHead(hdr []byte, seq uint32, op uint8, buf []byte) (int, error) {
	var in [][]byte
	if op == OpRead {
		in = [][]byte{hdr[:HeaderSize], buf}
	} else {
		in = [][]byte{hdr[:HeaderSize]}
	}
	got, err := p.recvAtLeast(in, HeaderSize)
	if err != nil {
		return 0, err
	}
	rh, err := DecodeHeader(hdr[:HeaderSize])
	if err != nil {
		return 0, err
	}
	if rh.Seq != seq || rh.Op != op || !rh.IsResponse() {
		return 0, fmt.Errorf("%w: reply seq %d op %d for seq %d op %d", ErrBadFrame, rh.Seq, rh.Op, seq, op)
	}
	extra := got - HeaderSize // payload bytes already in buf
	if rh.Status != StatusOK {
		msg := make([]byte, rh.Payload)
		k := copy(msg, buf[:min(extra, len(buf))])
		if err := p.recvv([][]byte{msg[k:]}); err != nil {
			return 0, err
		}
		return 0, statusError(rh.Status, msg)
	}
	if op == OpRead && int(rh.Length) != len(buf) {
		return 0, fmt.Errorf("%w: read reply of %d bytes for %d", ErrBadFrame, rh.Length, len(buf))
	}
	return extra, nil
}
