package nbd

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// rawSock is a TCP or Unix connection's socket in the transmission phase,
// served by raw system calls on a descriptor of its own that Go's netpoller
// does not watch while requests come one at a time. Over TLS, crypto/tls
// reads it through the connection's fastReader and writes it through
// Write, so a TLS connection waits the same way.
//
// Why: the netpoller registers a socket with epoll for input and output,
// edge-triggered, for as long as it is open. When a process has nothing to
// run, one of its threads sleeps in epoll_pwait, and every request arriving
// and every reply the client consumes wakes that thread (measured: 1.7
// epoll_pwait per request at queue depth 1), although the request is read
// by the connection's reader, which waits in poll(2) (fastReader). Those
// wakeups are paid by the client's send and receive system calls (a wakeup
// of an idle vCPU costs 5–11 µs in the nested VMs of the bench) and cost
// the server a context switch per request; nbdkit, whose threads wait in
// recv(2), has none of them. See docs/nbd.md, "Queue depth 1".
//
// So the socket lives on a duplicate descriptor that is not registered
// ("raw mode"): short waits are poll(2) on it, as before. A wait that poll
// does not end within pollWaitMillis, or one at depth (fastReader.noPoll),
// or one while the process has other connections, goes to the netpoller
// through a registered duplicate ("polled mode"), so that idle connections
// and busy servers do not hold threads; the reader drops the duplicate (and
// so the registration) when it next waits the queue-depth-1 way.
//
// The calls that cannot block (read and writev on the non-blocking
// descriptor, zero-timeout polls) are raw system calls (rawcall.go), which
// do not wake sysmon; waits with a timeout keep the ordinary path.
//
// Close shuts the socket down (waking every wait); the descriptor itself is
// closed by release, once nothing uses it, so that no system call ever
// reaches a descriptor number reused for another file.
type rawSock struct {
	fd           int
	tcp          bool
	laddr, raddr net.Addr

	closed atomic.Bool
	mu     sync.Mutex
	gone   bool            // released: fd is closed
	pc     *os.File        // registered duplicate (polled mode), or nil
	pcrc   syscall.RawConn // pc's
	users  int             // waits using pc
	drops  atomic.Int64    // times rawMode left the netpoller (for tests)

	// The read under way (Read's and readPolled's state, for the
	// callbacks built once in newRawSock: made per call, they escaped to
	// the heap on every read). One goroutine reads at a time (the
	// owner of the connection's reader).
	rp           []byte
	rn           int
	rerr         error
	rf           func(fd uintptr) bool // readPolled's f
	rdone        bool
	readFn, rpFn func(fd uintptr) bool
}

// newRawSock duplicates nc's descriptor and closes nc, which takes the
// socket out of the netpoller. nc must be a *net.TCPConn or *net.UnixConn.
func newRawSock(nc net.Conn) (*rawSock, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, errors.New("nbd: not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) {
		fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, fmt.Errorf("nbd: dup: %w", derr)
	}
	// The raw calls (rawcall.go) must never block. The netpoller's
	// sockets are non-blocking already; make sure of it.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("nbd: nonblock: %w", err)
	}
	_, tcp := nc.(*net.TCPConn)
	s := &rawSock{fd: fd, tcp: tcp, laddr: nc.LocalAddr(), raddr: nc.RemoteAddr()}
	s.readFn, s.rpFn = s.readNow, s.polledRead
	// The duplicate shares the open file (non-blocking). Closing nc
	// removes the original from epoll; the socket stays open through fd.
	nc.Close()
	return s, nil
}

// sockRC is a rawSock's syscall.RawConn.
type sockRC struct{ s *rawSock }

// SyscallConn implements syscall.Conn.
func (s *rawSock) SyscallConn() (syscall.RawConn, error) { return sockRC{s}, nil }

// Control implements syscall.RawConn.
func (r sockRC) Control(f func(fd uintptr)) error {
	if r.s.closed.Load() {
		return net.ErrClosed
	}
	f(uintptr(r.s.fd))
	return nil
}

// Read implements syscall.RawConn: f reads; false means it would block.
func (r sockRC) Read(f func(fd uintptr) bool) error { return r.s.do(f, unix.POLLIN) }

// Write implements syscall.RawConn.
func (r sockRC) Write(f func(fd uintptr) bool) error { return r.s.do(f, unix.POLLOUT) }

func (s *rawSock) do(f func(fd uintptr) bool, ev int16) error {
	for {
		if s.closed.Load() {
			return net.ErrClosed
		}
		if f(uintptr(s.fd)) {
			return nil
		}
		if err := s.wait(ev); err != nil {
			return err
		}
	}
}

// wait waits in the netpoller until the socket may be ready for ev (or has
// been shut down); a spurious return is allowed. Short waits are the
// callers' (fastReader polls before it gets here).
func (s *rawSock) wait(ev int16) error {
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		return net.ErrClosed
	}
	if s.pc == nil {
		dup, err := unix.FcntlInt(uintptr(s.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("nbd: dup: %w", err)
		}
		// Non-blocking, so os.NewFile registers it with the netpoller.
		pc := os.NewFile(uintptr(dup), "nbd-socket")
		rc, err := pc.SyscallConn()
		if err != nil {
			pc.Close()
			s.mu.Unlock()
			return err
		}
		s.pc, s.pcrc = pc, rc
	}
	rc := s.pcrc
	s.users++
	s.mu.Unlock()
	first := true
	check := func(fd uintptr) bool {
		if first {
			// The netpoller only reports what happens from here on:
			// look first (edge-triggered epoll reports readiness at
			// registration, but not readiness older than this wait).
			first = false
			return s.closed.Load() || pollNow(s.fd, ev)
		}
		return true
	}
	var err error
	if ev == unix.POLLIN {
		err = rc.Read(check)
	} else {
		err = rc.Write(check)
	}
	s.mu.Lock()
	s.users--
	s.mu.Unlock()
	if err != nil && !s.closed.Load() {
		return fmt.Errorf("nbd: wait: %w", err)
	}
	return nil
}

// directWaits counts the reads readPolled made on the registered
// duplicate (for tests).
var directWaits atomic.Int64

// readPolled is do(f, POLLIN) for a reader that will not poll: when the
// socket is registered with the netpoller already (polled mode), f runs
// inside the registered duplicate's RawConn.Read, which clears the
// readiness the netpoller holds before f first runs, so an f that finds
// nothing (EAGAIN) parks at once and no readiness can be missed: no
// zero-timeout ppoll per wait as wait needs (measured under nbdfuse and
// PostgreSQL: one ppoll per request). In raw mode it is do.
func (s *rawSock) readPolled(f func(fd uintptr) bool) error {
	s.mu.Lock()
	rc := s.pcrc
	if rc != nil {
		s.users++
	}
	s.mu.Unlock()
	if rc == nil {
		return s.do(f, unix.POLLIN)
	}
	directWaits.Add(1)
	s.rf, s.rdone = f, false
	err := rc.Read(s.rpFn)
	done := s.rdone
	s.rf = nil
	s.mu.Lock()
	s.users--
	s.mu.Unlock()
	switch {
	case done:
		return nil
	case s.closed.Load():
		return net.ErrClosed
	case err != nil:
		return fmt.Errorf("nbd: wait: %w", err)
	}
	return net.ErrClosed // not reached: Read returns once f is done or on an error
}

// polledRead is readPolled's callback on the registered duplicate: it runs
// s.rf on the raw descriptor.
func (s *rawSock) polledRead(uintptr) bool {
	if s.closed.Load() {
		return true
	}
	s.rdone = s.rf(uintptr(s.fd))
	return s.rdone
}

// readNow reads the socket into s.rp once; false means nothing is there
// yet (EAGAIN).
func (s *rawSock) readNow(fd uintptr) bool {
	s.rn, s.rerr = rawRead(int(fd), s.rp)
	return s.rerr != unix.EAGAIN
}

// poll waits up to ms milliseconds in poll(2); true means ready (or hung
// up, or failed: the caller's next system call reports it).
func (s *rawSock) poll(ev int16, ms int) bool {
	fds := [1]unix.PollFd{{Fd: int32(s.fd), Events: ev}}
	for {
		k, err := unix.Poll(fds[:], ms)
		if err == unix.EINTR {
			continue
		}
		return err != nil || k > 0
	}
}

// rawMode drops the registered duplicate unless a wait is using it: the
// socket leaves the netpoller until a wait needs it again. The reader calls
// it before it waits for a request the queue-depth-1 way.
func (s *rawSock) rawMode() {
	s.mu.Lock()
	if s.pc != nil && s.users == 0 {
		s.pc.Close()
		s.pc, s.pcrc = nil, nil
		s.drops.Add(1)
	}
	s.mu.Unlock()
}

// polled reports whether the socket is registered with the netpoller (for
// tests).
func (s *rawSock) polled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pc != nil
}

// Read implements net.Conn.
func (s *rawSock) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	// Through readPolled: while the socket is registered with the
	// netpoller (a Client's connection whose callers do not wait in
	// poll(2), as under nbdfuse's four connections to `rialto attach`),
	// a read that finds nothing parks at once, without the zero-timeout
	// ppoll a wait begun after the read needs.
	s.rp = p
	err := s.readPolled(s.readFn)
	n, rerr := s.rn, s.rerr
	s.rp, s.rerr = nil, nil
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write implements net.Conn.
func (s *rawSock) Write(p []byte) (int, error) {
	v := net.Buffers{p}
	n, err := s.writev(&v)
	return int(n), err
}

// maxIov bounds the buffers one writev passes (the conn's batches hold at
// most 2*maxBatch).
const maxIov = 2 * maxBatch

// writev writes every buffer of v, consuming v as net.Buffers.WriteTo does.
// Callers serialise their writes.
func (s *rawSock) writev(v *net.Buffers) (int64, error) {
	var (
		total int64
		iov   [maxIov]unix.Iovec
	)
	for len(*v) > 0 {
		k := 0
		for _, b := range *v {
			if k == maxIov {
				break
			}
			if len(b) == 0 {
				continue
			}
			iov[k].Base = &b[0]
			iov[k].SetLen(len(b))
			k++
		}
		if k == 0 {
			*v = (*v)[:0]
			break
		}
		var (
			n    int
			werr error
		)
		err := s.do(func(fd uintptr) bool {
			n, werr = rawWritev(int(fd), iov[:k])
			return werr != unix.EAGAIN
		}, unix.POLLOUT)
		if err == nil {
			err = werr
		}
		if err != nil {
			return total, err
		}
		total += int64(n)
		consume(v, int64(n))
	}
	return total, nil
}

// consume drops the first n bytes of v.
func consume(v *net.Buffers, n int64) {
	for len(*v) > 0 {
		l := int64(len((*v)[0]))
		if l > n {
			(*v)[0] = (*v)[0][n:]
			return
		}
		n -= l
		(*v)[0] = nil
		*v = (*v)[1:]
	}
}

// Close implements net.Conn: it shuts the socket down, which wakes every
// wait; the descriptor stays open until release.
func (s *rawSock) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Swap(true) || s.gone {
		return nil
	}
	unix.Shutdown(s.fd, unix.SHUT_RDWR)
	return nil
}

// CloseRead shuts the reading side down (as net.TCPConn.CloseRead does):
// the reader sees the end of the stream; replies still go out.
func (s *rawSock) CloseRead() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() || s.gone {
		return net.ErrClosed
	}
	if err := unix.Shutdown(s.fd, unix.SHUT_RD); err != nil {
		return fmt.Errorf("nbd: shutdown: %w", err)
	}
	return nil
}

// abort makes release reset a TCP connection instead of closing it
// gracefully (SO_LINGER with a zero timeout): what is still queued in the
// socket, unsent or unacknowledged, is dropped rather than sent.
func (s *rawSock) abort() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone || !s.tcp {
		return
	}
	unix.SetsockoptLinger(s.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
}

// release closes the descriptors. Call it once, when no goroutine uses
// the socket any more; later Close calls do nothing.
func (s *rawSock) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return
	}
	s.gone = true
	s.closed.Store(true)
	if s.pc != nil {
		s.pc.Close()
		s.pc, s.pcrc = nil, nil
	}
	unix.Close(s.fd)
}

// LocalAddr implements net.Conn.
func (s *rawSock) LocalAddr() net.Addr { return s.laddr }

// RemoteAddr implements net.Conn.
func (s *rawSock) RemoteAddr() net.Addr { return s.raddr }

// errNoDeadline: deadlines apply in the handshake, before the socket
// leaves the netpoller; the transmission phase has none.
var errNoDeadline = errors.New("nbd: no deadlines in the transmission phase")

// SetDeadline implements net.Conn; it is not supported.
func (s *rawSock) SetDeadline(time.Time) error { return errNoDeadline }

// SetReadDeadline implements net.Conn; it is not supported.
func (s *rawSock) SetReadDeadline(time.Time) error { return errNoDeadline }

// SetWriteDeadline implements net.Conn; it is not supported.
func (s *rawSock) SetWriteDeadline(time.Time) error { return errNoDeadline }
