package nbd

import (
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// pollWaitMillis is how long a connection's reader waits for the next request
// in a blocking poll(2) before handing the wait to Go's netpoller.
const pollWaitMillis = 2

// transmitting counts the NBD connections of this process in the
// transmission phase, served (every Server's) and dialled (every Client's).
// The only one may block in poll(2) freely; beside others, a server's
// reader blocks in poll(2) only with a poll slot (headroom).
var transmitting atomic.Int32

// polls counts the waits that began in poll(2) (for tests).
var polls atomic.Int64

// maxHeadroom bounds the Ps added for readers asleep in poll(2): beyond
// that many connections the others wait in the netpoller.
const maxHeadroom = 4

// headroom lets several connections' readers sleep in poll(2) without
// starving the rest of the process. A goroutine in a system call keeps its
// P (Go's right to run code) until sysmon takes it back, which takes from
// 20 µs to 10 ms (sysmon sleeps longer the less it finds to do): with
// readers of several connections asleep in poll(2) on a machine of two
// CPUs, they held both Ps, and goroutines made runnable meanwhile (workers,
// writers, the readers themselves when their poll returned without a P)
// waited milliseconds. So while raw readers run beside other connections,
// GOMAXPROCS is raised by as many Ps as readers may poll at once (one per
// raw connection, at most maxHeadroom), and a reader polls only when it
// holds one of those slots: the sleeping readers hold at most the added
// Ps, the rest of the process keeps the Ps it had, and a reader woken by
// its request usually finds its P still its own (sysmon leaves a P in a
// system call alone while another is idle).
//
// GOMAXPROCS goes back to what it was when the last such connection ends.
// Changing it stops the world for a moment: it happens when connections
// begin or end, never per request.
var headroom struct {
	mu     sync.Mutex
	raw    int          // raw (server, polling-capable) connections in transmission
	extra  int          // Ps added (0: base not recorded)
	base   int          // GOMAXPROCS before any were added
	slots  atomic.Int32 // = extra, for readers
	inPoll atomic.Int32 // readers asleep in poll(2) on a slot
}

// rawBegin and rawEnd bracket a raw-socket connection's transmission
// phase.
func rawBegin() { adjustHeadroom(1) }

func rawEnd() { adjustHeadroom(-1) }

// adjustHeadroom counts d more raw connections and sets the added Ps to
// what they now need: none for a single one (alone, it polls without a
// slot; beside Clients only, it waits in the netpoller), one per raw
// connection (at most maxHeadroom) for several.
func adjustHeadroom(d int) {
	headroom.mu.Lock()
	defer headroom.mu.Unlock()
	headroom.raw += d
	want := 0
	if headroom.raw > 1 {
		want = min(headroom.raw, maxHeadroom)
	}
	if want == headroom.extra {
		return
	}
	if headroom.extra == 0 {
		headroom.base = runtime.GOMAXPROCS(0)
	}
	if want < headroom.extra {
		headroom.slots.Store(int32(want)) // fewer readers poll from now on
	}
	runtime.GOMAXPROCS(headroom.base + want)
	headroom.extra = want
	headroom.slots.Store(int32(want))
}

// pollSlot takes a slot for a blocking poll(2) beside other connections;
// false means wait in the netpoller.
func pollSlot() bool {
	for {
		n := headroom.inPoll.Load()
		if n >= headroom.slots.Load() {
			return false
		}
		if headroom.inPoll.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// fastReader reads a socket with raw system calls. When the socket is
// drained it first waits in a short blocking poll(2), like a thread-per-
// connection C server would: at queue depth 1 this saves the netpoller's
// extra EAGAIN read, epoll wait and goroutine hand-offs per request. Idle
// connections still park in the netpoller, and deadlines still apply.
//
// Beside other NBD connections (nbdfuse opens four; a database behind it
// spreads writes and flushes over them) a reader polls only with a slot of
// the GOMAXPROCS head-room (headroom): without it the sleeping readers
// held every P between them until sysmon took them back, milliseconds
// later, and PostgreSQL on a lease ran at half of nbdkit's TPS
// (docs/bench/pgbench.md). Client connections count as others: a process
// that re-exports remote parts (rialto attach) serves each request by
// waiting on a Client's reply, which the Client's reader goroutine must get
// a P to deliver.
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
	var (
		n    int
		rerr error
	)
	polled := false
	err := f.rc.Read(func(fd uintptr) bool {
		for {
			if f.drained && !polled && !f.noPoll {
				polled = true
				// Alone, the reader polls; beside other connections
				// only a raw socket's, with a slot of the head-room.
				alone := transmitting.Load() == 1
				slot := !alone && f.rs != nil && pollSlot()
				if alone || slot {
					polls.Add(1)
					if f.rs != nil {
						f.rs.rawMode()
					}
					fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
					k, perr := unix.Poll(fds[:], pollWaitMillis)
					if slot {
						headroom.inPoll.Add(-1)
					}
					if perr == unix.EINTR {
						polled = false
						continue
					}
					if perr != nil || k == 0 {
						return false // let the netpoller wait
					}
				}
			}
			n, rerr = unix.Read(int(fd), p)
			if rerr == unix.EINTR {
				continue
			}
			if rerr == unix.EAGAIN {
				f.drained, polled = true, true
				return false
			}
			return true
		}
	})
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
