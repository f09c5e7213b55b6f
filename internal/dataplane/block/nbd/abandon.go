package nbd

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A connection whose client goes away without NBD_CMD_DISC abandons the
// requests it has not started (docs/nbd.md, "Concurrency and
// performance"): a client that lost the connection may already have sent a
// write again on another one and written the range since. The reader sees
// the client's end when it reads it; while it is held elsewhere (waiting
// for a worker, for payload budget, or for the socket to take replies) it
// cannot, so the workers look at the socket before each write they start
// (conn.watch), and the reader looks once when the wait is over. A reply
// whose send fails is an end observed too. An end found on the socket is
// not yet a verdict: the
// stream may still hold an NBD_CMD_DISC (a client that sends it and closes
// at once), and only the reader, reading on, can tell. Until it has, the
// writes are held (conn.held), not executed.

// conn.watch values.
const (
	// The reader reads the socket (or parses what it read): it sees the
	// client's end itself.
	watchNone int32 = iota
	// The reader waits for a worker, for payload budget or for the
	// socket to take its replies: a worker looks at the socket (one
	// poll(2)) before it starts a write.
	watchBlocked
	// The client's end was found on the socket before the reader read
	// it, or a reply's send failed: writes are held until the reader
	// has read the rest of the stream (serve decides), and the reader
	// serves none itself.
	watchEnded
)

// blockBegin is called by the reader before it may wait for something
// other than the socket.
func (c *conn) blockBegin() {
	c.watch.CompareAndSwap(watchNone, watchBlocked)
	if h := c.s.testHookBlocked; h != nil {
		h(c)
	}
}

// blockEnd is called by the reader once that wait is over. The client may
// have gone meanwhile with no worker looking (none started a write): the
// reader looks at the socket (one poll(2)) before the workers stop looking,
// so that a worker taking a queued write right after the wait, before the
// reader has read the end, does not execute it
// (TestAbandonedAfterReaderWaitedForBudget).
func (c *conn) blockEnd() {
	if c.watch.Load() == watchBlocked && c.peerEnded() {
		c.markEnded()
		return
	}
	c.watch.CompareAndSwap(watchBlocked, watchNone)
}

// writable reports whether the reader may serve a write itself (from its
// buffer, spliced, inline at queue depth 1, or started on a
// WriteStarter): not once the client's end has been found on the socket.
func (c *conn) writable() bool {
	return c.watch.Load() == watchNone
}

// hold is called by a worker about to start a write while c.watch was w
// (not watchNone): it reports whether ops (that write and those after it
// in its group) were held for serve to decide on, rather than executed
// now.
func (c *conn) hold(w int32, ops []*op) bool {
	if w == watchBlocked {
		if !c.peerEnded() {
			return false
		}
		c.markEnded()
	}
	c.hmu.Lock()
	defer c.hmu.Unlock()
	if c.decided {
		return false // execute refuses them if the connection was abandoned
	}
	c.held = append(c.held, ops...)
	return true
}

// markEnded records that the client's end was found on the socket, or
// that a reply's send failed (sendQueued). The
// payload budget no longer bounds the reader: held writes keep theirs
// until serve decides, and what the reader still has to read is what the
// socket holds (the client sends no more).
func (c *conn) markEnded() {
	for {
		w := c.watch.Load()
		if w == watchEnded {
			return
		}
		if c.watch.CompareAndSwap(w, watchEnded) {
			c.bud.lift()
			return
		}
	}
}

// decide is called by serve once the reader has ended: abandoned is set
// already if it ended without NBD_CMD_DISC. It returns the requests held
// meanwhile; none is held after it.
func (c *conn) decide() []*op {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	c.decided = true
	held := c.held
	c.held = nil
	return held
}

// peerEnded reports whether the socket shows the client's end: its
// sending side shut (FIN), the connection reset, or the socket shut down
// by this server (a failed send). A connection that is not a socket never
// shows one.
func (c *conn) peerEnded() bool {
	if c.peer == nil {
		return false
	}
	ended := false
	if err := c.peer.Control(func(fd uintptr) { ended = hungUp(int(fd)) }); err != nil {
		return true // closed by this server
	}
	return ended
}

// hungUp polls fd without waiting for the end of the peer's stream or of
// the connection (POLLRDHUP, POLLHUP, POLLERR), not for input: requests
// may still be queued in the socket before the end.
func hungUp(fd int) bool {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	var ts unix.Timespec
	for {
		k, _, e := syscall.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		switch e {
		case 0:
			return k > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
		case unix.EINTR:
			continue
		}
		return true
	}
}

// peerConn returns the raw connection of nc's socket for peerEnded, or
// nil.
func peerConn(nc any) syscall.RawConn {
	switch t := nc.(type) {
	case *rawSock:
		return sockRC{t}
	case syscall.Conn:
		if rc, err := t.SyscallConn(); err == nil {
			return rc
		}
	}
	return nil
}
