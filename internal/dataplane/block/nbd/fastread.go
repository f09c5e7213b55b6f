package nbd

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// pollWaitMillis is how long a connection's reader waits for the next request
// in a blocking poll(2) before handing the wait to Go's netpoller.
const pollWaitMillis = 2

// transmitting counts the NBD connections of this process in the
// transmission phase, served (every Server's) and dialled (every Client's):
// a server's reader may block in poll(2) only while its connection is the
// only one.
var transmitting atomic.Int32

// polls counts the waits that began in poll(2) (for tests).
var polls atomic.Int64

// fastReader reads a socket with raw system calls. When the socket is
// drained it first waits in a short blocking poll(2), like a thread-per-
// connection C server would: at queue depth 1 this saves the netpoller's
// extra EAGAIN read, epoll wait and goroutine hand-offs per request. Idle
// connections still park in the netpoller, and deadlines still apply.
//
// Only the process's sole served NBD connection polls. A thread asleep in poll(2)
// holds its P (Go's right to run code) in the system call, and with several
// busy connections (nbdfuse opens four; a database behind it spreads writes
// and flushes over them) the readers held every P between them, until
// sysmon took them back, milliseconds later: PostgreSQL on a lease ran at
// half of nbdkit's TPS (docs/bench/pgbench.md). Letting one connection of
// several poll did not help either (its 2 ms sleeps held one of the two Ps
// and kept sysmon busy), so with more than one connection every reader
// waits in the netpoller. A process's own Clients do not count (only
// served ones, as in servedAlone): a process that re-exports remote parts
// (rialto attach) serves a request at queue depth 1 on the reader's goroutine, which
// forwards it and reads the part's reply itself (Client.doCall), so the
// reader never sleeps in poll(2) while a reply waits for it. While any
// Client call of the process is in flight (requests at depth, served by
// workers whose replies the Clients' background readers deliver) the
// reader does not poll (clientCalls): without that check, 4 KiB reads at
// queue depth 32 through `rialto attach` fell from 72.2K to 47.6K IOPS in
// an A/B run (nbdkit beside them unchanged; 2026-11-26). Before, the
// attach process's reader
// waited in the netpoller: an EAGAIN read, an epoll_pwait and a thread
// wakeup per request on top of the part's round trip (docs/nbd.md, "Queue
// depth 1").
type fastReader struct {
	rc      syscall.RawConn
	drained bool
	// noPoll skips the blocking poll: the connection's reader sets it
	// while requests arrive several at a time (high queue depth), where
	// sleeping in poll(2) costs the client a wakeup per request and Go's
	// scheduler, which polls briefly before it sleeps, does better.
	noPoll bool
	// rs is the socket once it has left the netpoller (rawsock.go), TLS
	// or not: a blocking poll first takes it out of epoll again. (Polling
	// a socket that stayed registered cost TLS connections more than it
	// saved: every request also woke a thread in epoll_pwait;
	// docs/bench/tls.md.)
	rs *rawSock

	// The read under way (Read's state, for readFn and pollFn).
	p              []byte
	n              int
	rerr           error
	polled         bool
	readFn, pollFn func(fd uintptr) bool
}

// newSocketReader returns a fastReader for TCP and Unix sockets and nc
// itself otherwise.
func newSocketReader(nc net.Conn) io.Reader {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nc
	}
	switch nc.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return nc
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nc
	}
	return &fastReader{rc: rc}
}

func (f *fastReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if f.readFn == nil {
		// Built once: closures made per call would escape (RawConn is
		// an interface) and allocate, with n and rerr, on every read.
		f.readFn, f.pollFn = f.readNow, f.pollRead
	}
	f.p, f.n, f.rerr = p, 0, nil
	var err error
	if f.rs != nil && !(f.drained && !f.noPoll && mayPoll()) {
		// No blocking poll this time: read, and wait in the netpoller
		// if the socket is drained.
		err = f.rs.readPolled(f.readFn)
	} else {
		f.polled = false
		err = f.rc.Read(f.pollFn)
	}
	n, rerr := f.n, f.rerr
	f.p, f.rerr = nil, nil
	return f.done(p, n, rerr, err)
}

// readNow reads the socket into f.p once; false means it is drained.
func (f *fastReader) readNow(fd uintptr) bool {
	for {
		f.n, f.rerr = rawRead(int(fd), f.p)
		if f.rerr == unix.EINTR {
			continue
		}
		if f.rerr == unix.EAGAIN {
			f.drained = true
			return false
		}
		return true
	}
}

// pollRead is readNow after a short blocking poll(2) when the socket was
// drained and this is the process's only connection.
func (f *fastReader) pollRead(fd uintptr) bool {
	for {
		if f.drained && !f.polled && !f.noPoll && mayPoll() {
			f.polled = true
			polls.Add(1)
			if f.rs != nil {
				f.rs.rawMode()
			}
			fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			k, perr := unix.Poll(fds[:], pollWaitMillis)
			if perr == unix.EINTR {
				f.polled = false
				continue
			}
			if perr != nil || k == 0 {
				return false // let the netpoller wait
			}
		}
		if f.readNow(fd) {
			return true
		}
		f.polled = true
		return false
	}
}

// mayPoll reports whether a drained reader may wait in poll(2): its
// connection is the process's only one served, and no Client call waits.
func mayPoll() bool {
	return transmitting.Load()-dialled.Load() == 1 && clientCalls.Load() == 0
}

// done ends a Read: n bytes read into p, rerr the read's error, err the
// wait's.
func (f *fastReader) done(p []byte, n int, rerr, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if n == 0 {
		return 0, io.EOF
	}
	f.drained = n < len(p)
	return n, nil
}
