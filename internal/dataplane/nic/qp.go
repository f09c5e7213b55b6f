package nic

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// qp is one connection (queue pair) of a session: framed, with credit-based
// flow control in both directions, as the memory data plane's queue pairs
// (docs/nic.md). Its writer goroutine drains a queue of encoded frames, so
// frames queued while a write is under way leave in one system call.
type qp struct {
	c    net.Conn
	br   *bufio.Reader
	keep time.Duration

	// Send side. granted is the cumulative DATA bytes the peer allows;
	// sent what was queued. Guarded by mu, as is the queue.
	mu      sync.Mutex
	granted uint64
	sent    uint64
	pending []byte
	spare   []byte
	closed  bool
	wake    chan struct{}

	// Receive side: window is what this end grants; limit the cumulative
	// grant issued, recvd what arrived, consumed what was delivered.
	window   uint64
	limit    atomic.Uint64
	recvd    uint64 // reader goroutine only
	consumed atomic.Uint64

	lastRecv atomic.Int64 // unix nanoseconds of the last frame read
	done     chan struct{}
	errOnce  sync.Once
	err      error
	// untrack, if set (setUntrack), takes the connection off the
	// revocation list's tracker once it ended (mu).
	untrack func()
}

func newQP(c net.Conn, sendWindow, recvWindow uint32, keepalive time.Duration) *qp {
	q := &qp{c: c, br: bufio.NewReaderSize(c, 256<<10), keep: keepalive, granted: uint64(sendWindow),
		window: uint64(recvWindow), wake: make(chan struct{}, 1), done: make(chan struct{})}
	q.limit.Store(uint64(recvWindow))
	q.lastRecv.Store(time.Now().UnixNano())
	return q
}

// fail ends the connection with err (the first error wins).
func (q *qp) fail(err error) {
	q.errOnce.Do(func() {
		q.err = err
		q.mu.Lock()
		q.closed = true
		untrack := q.untrack
		q.untrack = nil
		q.mu.Unlock()
		close(q.done)
		_ = q.c.Close()
		if untrack != nil {
			untrack()
		}
	})
}

// setUntrack makes the connection's end call f (at once if it ended
// already): its registration with a revocation list (Config.Track).
func (q *qp) setUntrack(f func()) {
	q.mu.Lock()
	if !q.closed {
		q.untrack = f
		f = nil
	}
	q.mu.Unlock()
	if f != nil {
		f()
	}
}

// failWith sends an ERROR frame to the peer (best effort) and ends.
func (q *qp) failWith(err error) {
	p := ErrorPayload(statusOf(err), err.Error())
	var h [HeaderSize]byte
	Header{Type: FrameError, Length: uint16(len(p))}.Encode(h[:])
	_ = q.c.SetWriteDeadline(time.Now().Add(time.Second))
	q.mu.Lock()
	_, _ = q.c.Write(append(h[:], p...))
	q.mu.Unlock()
	q.fail(err)
}

// Err is why the connection ended (nil while it runs).
func (q *qp) Err() error {
	select {
	case <-q.done:
		return q.err
	default:
		return nil
	}
}

// trySend queues a DATA frame if the peer's credit allows it, and reports
// whether it did. seq is called, under the lock, only once the frame is
// sure to be queued, so sequence numbers have no gaps.
func (q *qp) trySend(pkt []byte, seq func() uint32) bool {
	q.mu.Lock()
	if q.closed || q.sent+uint64(len(pkt)) > q.granted {
		q.mu.Unlock()
		return false
	}
	q.sent += uint64(len(pkt))
	var h [HeaderSize]byte
	Header{Type: FrameData, Length: uint16(len(pkt)), Seq: seq()}.Encode(h[:])
	q.pending = append(append(q.pending, h[:]...), pkt...)
	q.mu.Unlock()
	q.signal()
	return true
}

// sendControl queues a frame that needs no credit (CREDIT, PING, PONG).
func (q *qp) sendControl(typ uint8, v uint64) {
	var b [HeaderSize + 8]byte
	Header{Type: typ, Length: 8}.Encode(b[:])
	binary.BigEndian.PutUint64(b[HeaderSize:], v)
	q.mu.Lock()
	if !q.closed {
		q.pending = append(q.pending, b[:]...)
	}
	q.mu.Unlock()
	q.signal()
}

func (q *qp) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// writeLoop writes queued frames until the connection ends.
func (q *qp) writeLoop() {
	for {
		select {
		case <-q.done:
			return
		case <-q.wake:
		}
		for {
			q.mu.Lock()
			buf := q.pending
			q.pending = q.spare[:0]
			q.mu.Unlock()
			if len(buf) == 0 {
				q.spare = buf
				break
			}
			if _, err := q.c.Write(buf); err != nil {
				q.fail(fmt.Errorf("%w: write: %v", ErrLost, err))
				return
			}
			q.mu.Lock()
			q.spare = buf[:0]
			q.mu.Unlock()
		}
	}
}

// keepLoop pings every keep interval and ends the connection when nothing
// arrived for three intervals.
func (q *qp) keepLoop() {
	t := time.NewTicker(q.keep)
	defer t.Stop()
	for {
		select {
		case <-q.done:
			return
		case now := <-t.C:
			if now.Sub(time.Unix(0, q.lastRecv.Load())) > 3*q.keep {
				q.fail(fmt.Errorf("%w: silent for %v", ErrLost, 3*q.keep))
				return
			}
			q.sendControl(FramePing, uint64(now.UnixNano()))
		}
	}
}

// delivered records that n bytes of DATA were consumed and grants more
// credit once a quarter of the window has been consumed.
func (q *qp) delivered(n int) {
	c := q.consumed.Add(uint64(n))
	if c+q.window-q.limit.Load() >= q.window/4 {
		q.limit.Store(c + q.window)
		q.sendControl(FrameCredit, c+q.window)
	}
}

// readLoop reads frames and hands DATA to onData (in arrival order; onData
// calls delivered once the packet is consumed, possibly later). It returns
// when the connection ends.
func (q *qp) readLoop(onData func(seq uint32, pkt []byte) error) {
	var hdr [HeaderSize]byte
	buf := make([]byte, MaxPacket)
	for {
		if _, err := io.ReadFull(q.br, hdr[:]); err != nil {
			q.fail(fmt.Errorf("%w: %v", ErrLost, err))
			return
		}
		h, err := DecodeHeader(hdr[:])
		if err != nil {
			q.failWith(err)
			return
		}
		p := buf[:h.Length]
		if _, err := io.ReadFull(q.br, p); err != nil {
			q.fail(fmt.Errorf("%w: %v", ErrLost, err))
			return
		}
		q.lastRecv.Store(time.Now().UnixNano())
		switch h.Type {
		case FrameData:
			q.recvd += uint64(h.Length)
			if q.recvd > q.limit.Load() {
				q.failWith(fmt.Errorf("%w: %d bytes received, %d granted", ErrCredit, q.recvd, q.limit.Load()))
				return
			}
			if err := onData(h.Seq, p); err != nil {
				q.failWith(err)
				return
			}
		case FrameCredit:
			v := binary.BigEndian.Uint64(p)
			q.mu.Lock()
			if v > q.granted {
				q.granted = v
			}
			q.mu.Unlock()
		case FramePing:
			q.sendControl(FramePong, binary.BigEndian.Uint64(p))
		case FramePong:
		case FrameError:
			q.fail(ParseError(p))
			return
		}
	}
}

// run starts the writer and keepalive goroutines and runs the reader; it
// returns, with the connection closed, once all three have ended.
func (q *qp) run(onData func(seq uint32, pkt []byte) error) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); q.writeLoop() }()
	go func() { defer wg.Done(); q.keepLoop() }()
	q.readLoop(onData)
	wg.Wait()
	if q.err == nil || errors.Is(q.err, net.ErrClosed) {
		return ErrLost
	}
	return q.err
}
