package rawconn

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"golang.org/x/sys/unix"
)

// Idle lets the Conns that share it (a server's, SetIdle) hold no thread
// while they are idle. A Conn's wait in poll(2) holds an OS thread, and
// the Go runtime ends the process past 10000 of them: a server with a
// thread blocked per idle connection had its connections bounded by its
// threads. With an Idle, a wait for input that found none for Wait moves
// to Go's netpoller — a duplicate of the descriptor registered there, the
// goroutine parked in a syscall.RawConn's Read, holding no thread — and
// the next wait after it woke goes back to poll(2), the descriptor off the
// netpoller again (its registration closed). While requests keep coming
// (one at least every Wait) nothing changes: the waits sleep in poll(2)
// as before, only with Wait as their deadline.
//
// The move changes how the Conn waits, never what it reads: no byte is
// read but by the Conn's own readv on its descriptor, whichever way it
// waited, so a request that arrives as a Conn moves either way is read as
// any other, in order. A Shutdown wakes a Conn waiting on the netpoller as
// it wakes one in poll(2).
//
// Max bounds the threads the Conns sleep in poll(2) on at once: a Conn
// whose reads wait in poll(2) holds one of them, from SetIdle (or its
// return from the netpoller) until it moves to the netpoller or closes.
// Past Max a Conn's waits stay on the netpoller (each request then pays a
// netpoller wake-up) until one is free again.
//
// A wait for output (a full socket buffer: the peer does not read) moves
// the same way. The reading goroutine's sleeps in poll(2) for up to Wait
// on the thread it holds, then moves to the netpoller and gives that
// thread back meanwhile (the Conn counts as parked: a peer that does not
// read must not keep a thread from the Conns that serve), and takes one
// again, if one is free, once the socket took more. A Conn that holds
// none, or a write from another goroutine (Sender), takes one for its
// sleep in poll(2) if one is free, and gives it back after.
type Idle struct {
	// Wait is how long a wait for input stays in poll(2) before it moves
	// to the netpoller (at least a nanosecond: zero moves at once).
	Wait time.Duration
	// Max bounds the threads sleeping in poll(2) at once (0: none).
	Max int
	// Moved, if set, is called from a Conn's reading goroutine, with its
	// descriptor, as its waits for input move to the netpoller (parked,
	// before it registers there) and back (after the netpoller woke it,
	// before it leaves it): the moments a request may arrive in between;
	// and as a wait for output of that goroutine's gives its thread back
	// (parked) and takes one again.
	Moved func(fd int, parked bool)

	polling atomic.Int64 // threads held for poll(2)
	parked  atomic.Int64 // Conns whose waits for input are on the netpoller
}

// Polling is how many threads the Conns hold for poll(2) now.
func (i *Idle) Polling() int { return int(i.polling.Load()) }

// Parked is how many Conns wait for input on the netpoller (holding no
// thread) now.
func (i *Idle) Parked() int { return int(i.parked.Load()) }

// take takes a thread for poll(2); false past Max.
func (i *Idle) take() bool {
	if i.Max <= 0 {
		i.polling.Add(1)
		return true
	}
	for {
		n := i.polling.Load()
		if n >= int64(i.Max) {
			return false
		}
		if i.polling.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (i *Idle) give() { i.polling.Add(-1) }

// SetIdle makes the Conn, a server's without a timeout, hold no thread
// while idle (see Idle); its owner calls it once, before it serves, from
// the goroutine that reads it. A Conn with a timeout ignores it.
func (p *Conn) SetIdle(i *Idle) {
	p.idle = i
	p.held = i.take()
	if !p.held {
		i.parked.Add(1)
	}
}

// dropIdle gives back what the Conn holds of its Idle (Close, life held).
func (p *Conn) dropIdle() {
	i := p.idle
	if i == nil {
		return
	}
	p.idle = nil
	if p.held {
		i.give()
	} else {
		i.parked.Add(-1)
	}
	if p.park != nil {
		_ = p.park.Close()
		p.park = nil
	}
}

// waitInput waits for input, from the Conn's reading goroutine: in
// poll(2) for up to Wait while it holds a thread, else (or then) on the
// netpoller, and back to poll(2) for the next wait once woken, if a
// thread is free.
func (p *Conn) waitInput() error {
	i := p.idle
	if p.held {
		p.leaveNetpoller()
		ready, err := p.pollFor(unix.POLLIN, i.Wait)
		if err != nil || ready {
			return err
		}
		// Idle for Wait: let the thread go.
		p.letGo()
	}
	if err := p.netpollWait(&p.park, unix.POLLIN, time.Time{}); err != nil {
		return err
	}
	p.netpolled = true
	if p.takeBack() {
		// Off the netpoller: the next segments wake no runtime thread.
		if p.park != nil { // nil: it could not register (netpollWait)
			_ = p.park.Close()
			p.park = nil
		}
	}
	return nil
}

// letGo gives the thread the reading goroutine holds back: the
// connection waits parked on the netpoller.
func (p *Conn) letGo() {
	i := p.idle
	p.held = false
	i.give()
	i.parked.Add(1)
	if i.Moved != nil {
		i.Moved(p.fd, true)
	}
}

// takeBack takes a thread for the reading goroutine of a parked
// connection, if one is free, and reports whether it did.
func (p *Conn) takeBack() bool {
	i := p.idle
	if !i.take() {
		return false
	}
	p.held = true
	i.parked.Add(-1)
	if i.Moved != nil {
		i.Moved(p.fd, false)
	}
	return true
}

// waitOutput waits until the socket takes more bytes, for at most bound
// (0: for ever; then ErrStalled): in poll(2) for up to Wait, on the
// thread the reading goroutine holds if it is that goroutine's (no send
// through Sender is under way), else on one it takes if one is free;
// then on the netpoller, the reading goroutine's thread given back
// meanwhile (see Idle).
func (p *Conn) waitOutput(bound time.Duration) error {
	i := p.idle
	var deadline time.Time
	first := i.Wait
	q := -1 // the socket's unacknowledged bytes as the wait starts
	if bound > 0 {
		deadline = time.Now().Add(bound)
		first = min(first, bound)
		q = p.unacked()
	}
	// senders first: a Sender's goroutine must not look at held, the
	// reading goroutine's.
	if p.senders.Load() == 0 && p.held {
		ready, err := p.pollFor(unix.POLLOUT, first)
		if err != nil || ready {
			return err
		}
		// Its peer does not read: let the thread go while it waits.
		p.letGo()
		err = p.waitOutputNetpoll(deadline, bound, q)
		if err == nil {
			p.netpolled = true
			p.takeBack()
		}
		return err
	}
	if i.take() {
		ready, err := p.pollFor(unix.POLLOUT, first)
		i.give()
		if err != nil || ready {
			return err
		}
	}
	return p.waitOutputNetpoll(deadline, bound, q)
}

// waitOutputNetpoll waits on the netpoller until the socket takes more
// bytes, or deadline (zero: none) passes with its peer having taken
// none of them (ErrStalled): while the peer acknowledges more of what
// the socket holds (q, unacked's count at the wait's start: -1 if
// unknown), the deadline is renewed by bound (see tookMore).
func (p *Conn) waitOutputNetpoll(deadline time.Time, bound time.Duration, q int) error {
	var f *os.File
	defer func() {
		if f != nil {
			_ = f.Close()
		}
	}()
	for {
		err := p.netpollWait(&f, unix.POLLOUT, deadline)
		if !errors.Is(err, ErrStalled) || !p.tookMore(&q) {
			return err
		}
		deadline = time.Now().Add(bound)
	}
}

// pollFor waits in poll(2) until the socket is ready for events (true) or
// d passes (false).
func (p *Conn) pollFor(events int16, d time.Duration) (bool, error) {
	ts := unix.NsecToTimespec(int64(max(d, 0)))
	for {
		fds := [1]unix.PollFd{{Fd: int32(p.fd), Events: events}}
		n, err := unix.Ppoll(fds[:], &ts, nil) // ts: what is left, after EINTR
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("%w: poll: %v", protocol.ErrDonorLost, err)
		}
		return n > 0, nil
	}
}

// Bounds of the interval at which a wait that cannot register with the
// netpoller (out of descriptors) checks its socket, holding no thread.
const (
	unregisteredCheckMin = time.Millisecond
	unregisteredCheckMax = 100 * time.Millisecond
)

// netpollWait waits on Go's netpoller, holding no thread, until the
// socket is ready for events (or shut down, or failed), or deadline (zero:
// none) passes: ErrStalled (deadlines bound waits for output). *f is the
// registration, a duplicate of the descriptor made if nil (the caller
// closes it, which takes it off the netpoller).
//
// If the descriptor cannot be registered (the process is out of
// descriptors, say: EMFILE), it still holds no thread: it checks the
// socket without blocking at growing intervals (unregisteredCheckMin to
// unregisteredCheckMax; time.Sleep parks the goroutine) and retries the
// registration each time. A wait in poll(2) there held a thread Max does
// not count until the next request, however long: every connection that
// went idle during a shortage of descriptors held one, past Max, for
// good. A request that arrives then waits up to unregisteredCheckMax.
func (p *Conn) netpollWait(f **os.File, events int16, deadline time.Time) error {
	ready := func(fd uintptr) bool {
		for {
			fds := [1]unix.PollFd{{Fd: int32(fd), Events: events}}
			n, err := unix.Poll(fds[:], 0)
			if err != unix.EINTR {
				return n > 0 || err != nil // an error: the readv or writev says which
			}
		}
	}
	var delay time.Duration
	for {
		if *f == nil {
			if nfd, err := unix.FcntlInt(uintptr(p.fd), unix.F_DUPFD_CLOEXEC, 0); err == nil {
				// Non-blocking (the flag is the socket's): os.NewFile
				// registers it with the netpoller.
				*f = os.NewFile(uintptr(nfd), "rawconn")
			}
		}
		if *f != nil {
			rc, err := (*f).SyscallConn()
			if err == nil {
				if events == unix.POLLIN {
					err = rc.Read(ready)
				} else if err = (*f).SetWriteDeadline(deadline); err == nil {
					err = rc.Write(ready)
				}
			}
			if err == nil {
				return nil
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return p.stalled()
			}
			// Not registered (epoll_ctl failed), or the netpoller
			// reported an error on it: a new one next time.
			_ = (*f).Close()
			*f = nil
		}
		if ready(uintptr(p.fd)) {
			return nil
		}
		delay = min(max(2*delay, unregisteredCheckMin), unregisteredCheckMax)
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return p.stalled()
			}
			delay = min(delay, left)
		}
		time.Sleep(delay)
	}
}
