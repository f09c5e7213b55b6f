package nbd

import (
	"bufio"
	"net"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// clientPollMillis is how long a Client's caller waits for its reply in a
// blocking poll(2) before it hands the wait to Go's netpoller.
const clientPollMillis = 2

// maxClientPolls bounds the callers, over every Client of the process, that
// wait for a reply in poll(2) at once.
//
// A goroutine in a system call keeps its P (Go's right to run code) until
// sysmon takes it back, which takes from 20 µs to 10 ms (sysmon sleeps
// longer the less it finds to do); with every P asleep in poll(2), the
// goroutines made runnable meanwhile (the local export's readers, other
// callers whose replies came) would wait that long (docs/nbd.md, "Queue
// depth 1"). One poller at a time leaves a 2-CPU machine one P for the rest
// of the process, and sysmon leaves a P in a system call alone while
// another is idle.
const maxClientPolls = 1

// deepClients counts the Clients of the process with more than one call
// in flight.
//
// A caller alone on its connection waits in poll(2) only while its call is
// the only one of the process, or, for a flush, while no Client has several
// calls in flight (a composed volume's flush goes to every part at once, one
// call each). Otherwise the process is serving requests at depth (the parts
// of a composed `rialto attach` under fio or nbdcopy at QD32, one caller
// alone on its part's connection beside others): the replies of the other
// calls are to be read and delivered by goroutines that need the P the
// sleeping caller would hold. Without that rule 4 KiB reads and writes at
// QD32 on a 3-way composed lease ran about a fifth slower; polling whenever
// no Client had several calls in flight won back only half of that
// (docs/bench/block.md, "Follow-up (2026-11-26, evening)").
var deepClients atomic.Int32

// clientPolls counts the callers asleep in poll(2) (awaitRaw).
var clientPolls atomic.Int32

// dialled counts the Clients' connections in transmission (transmitting
// counts them too, besides the served ones).
var dialled atomic.Int32

// servedAlone reports whether the process serves at most one NBD
// connection: only then do callers wait for replies in poll(2). A
// `rialto attach` under nbdfuse serves four, and PostgreSQL behind them
// spreads writes and flushes over all four; with server readers asleep in
// poll(2) beside each other there, a database on a lease collapsed to a
// quarter of nbdkit's TPS and worse (docs/nbd.md, "Several connections"),
// for reasons not understood, so those callers keep to the netpoller.
func servedAlone() bool { return transmitting.Load()-dialled.Load() <= 1 }

// clientCalls counts the requests of every Client of the process that
// have been sent (or are being sent) and not completed: while one is, a
// served connection's reader does not wait in poll(2) (fastReader), since
// the reply must reach a caller or the background reader, which may need
// the P the sleeping reader would hold.
var clientCalls atomic.Int32

// clientRawWaits counts the waits that began in poll(2) (for tests).
var clientRawWaits atomic.Int64

// leaveNetpoller moves a plaintext TCP or Unix connection onto a rawSock
// (rawsock.go): a descriptor of its own that Go's netpoller does not watch
// while replies are awaited at queue depth 1.
//
// Why: at queue depth 1 (a `rialto attach` serving nbdfuse or fio, the
// caller being the local export's connection goroutine) each request's
// caller reads its own reply (doCall). Through the netpoller that wait cost
// an EAGAIN read, the goroutine's park and an epoll_pwait, and, when the
// process had nothing else to run, the wakeup of sysmon by the next system
// call (entersyscall wakes a sysmon asleep for an idle process) and of a
// spinning thread: 3.7 context switches per 4 KiB read in the attach
// process (perf stat), where a blocking wait needs one. And while the
// socket is registered with epoll, the reply arriving also wakes the thread
// asleep in epoll_pwait. So the caller alone in flight on the connection
// sleeps in poll(2) on the unregistered descriptor (awaitRaw); other waits
// (several requests in flight: the background reader; a poll that timed
// out; a caller that found another poller) go to the netpoller through a
// registered duplicate, which the next raw wait drops again.
//
// A connection whose reader already holds bytes stays as it is: the
// server sends nothing unasked after NBD_OPT_GO, so that does not happen
// with a well-behaved one.
func (c *Client) leaveNetpoller() {
	switch c.nc.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return // TLS: crypto/tls reads the socket
	}
	if c.br.Buffered() > 0 {
		return
	}
	rs, err := newRawSock(c.nc)
	if err != nil {
		return // c.nc is still open and polled
	}
	c.nc, c.rs = rs, rs
	c.br = bufio.NewReaderSize(rs, c.br.Size())
	c.rawc = nil
	if rs.tcp {
		c.rawc = sockRC{rs}
	}
}

// awaitRaw waits in poll(2), for at most clientPollMillis, until the reply
// of the caller alone in flight may be readable, if no other caller of the
// process is asleep in poll(2), the call is the only one of the process's
// Clients (a flush: no Client has several in flight; deepClients) and the
// process serves at most one connection (servedAlone); the caller then
// reads it with a plain read(2). If the wait ends without a reply, or
// another caller polls, the read waits in the netpoller. The caller holds
// c.rsMu for reading.
func (c *Client) awaitRaw(flush bool) {
	if !servedAlone() || deepClients.Load() > 0 || (!flush && clientCalls.Load() > 1) || !clientPollSlot() {
		return
	}
	defer clientPolls.Add(-1)
	clientRawWaits.Add(1)
	c.rs.rawMode()
	c.rs.poll(unix.POLLIN, clientPollMillis)
}

// clientPollSlot takes one of the maxClientPolls slots; false means none
// is free.
func clientPollSlot() bool {
	for {
		n := clientPolls.Load()
		if n >= maxClientPolls {
			return false
		}
		if clientPolls.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// discRaw sends NBD_CMD_DISC on the raw socket if the socket takes it at
// once (a server that stopped reading does not make Close wait).
func (c *Client) discRaw(hdr []byte) {
	c.rsMu.RLock()
	defer c.rsMu.RUnlock()
	sockRC{c.rs}.Control(func(fd uintptr) {
		for {
			_, err := unix.Write(int(fd), hdr)
			if err != unix.EINTR {
				return
			}
		}
	})
}

// releaseRaw closes the raw socket's descriptor once no system call uses
// it; Close calls it after the socket has been shut down, so that every
// wait on it has returned or is about to.
func (c *Client) releaseRaw() {
	if c.rs == nil {
		return
	}
	c.rsMu.Lock()
	c.rs.release()
	c.rsMu.Unlock()
}
