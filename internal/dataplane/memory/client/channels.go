package client

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/internal/rawconn"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// bulkStream is one connection of the bulk channel, driven with raw
// syscalls like the synchronous channel (see rawconn), and re-established
// alone when it breaks (rejoin.go).
type bulkStream struct {
	link
	seq  uint32
	hdrs [bulkReadWindow * protocol.HeaderSize]byte
	iov  [][]byte
}

// bulk splits [off, off+len(p)) into chunks and moves them over the bulk
// streams in parallel, each stream taking a contiguous share and pipelining
// its chunk requests.
func (c *Client) bulk(ctx context.Context, op uint8, p []byte, off int64) error {
	chunk := c.opts.ChunkSize
	nchunks := (len(p) + chunk - 1) / chunk
	ns := min(len(c.streams), nchunks)
	per := (nchunks + ns - 1) / ns
	errs := make([]error, ns)
	var wg sync.WaitGroup
	for i := ns - 1; i >= 0; i-- {
		lo := min(i*per*chunk, len(p))
		hi := min((i+1)*per*chunk, len(p))
		if lo == hi {
			continue
		}
		if i == 0 { // the caller's goroutine drives the first stream
			errs[0] = c.streams[0].run(ctx, c, op, p[lo:hi], off+int64(lo), chunk)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.streams[i].run(ctx, c, op, p[lo:hi], off+int64(lo), chunk)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Bulk pipelining depth per stream: chunk requests in flight before the
// first reply is read (reads need a deeper window: their requests are tiny).
const (
	bulkReadWindow  = 16
	bulkWriteWindow = 4
)

// run moves p over this stream with a window of chunk requests in flight,
// all from the calling goroutine: the initial window goes out in one writev
// and each reply received releases the next request. If the donor ends
// the connection, a new one goes on from the first chunk not acknowledged
// (rejoin.go).
func (s *bulkStream) run(ctx context.Context, c *Client, op uint8, p []byte, off int64, chunk int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.ready(ctx, c); err != nil {
		return err
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, s.shutdown)
		defer stop()
	}
	tries := 0
	for {
		done, err := s.pipeline(s.pg.Load(), op, p, off, chunk)
		if err == nil {
			return nil
		}
		again, err := s.recover(ctx, c, s.broke(ctx, err), &tries)
		if !again {
			return err
		}
		p, off = p[done:], off+int64(done)
	}
}

// pipeline moves p over pg (see run) and returns how many bytes of p the
// donor acknowledged, in order, before an error.
func (s *bulkStream) pipeline(pg *rawconn.Conn, op uint8, p []byte, off int64, chunk int) (done int, err error) {
	first := s.seq + 1
	n := (len(p) + chunk - 1) / chunk
	s.seq += uint32(n)
	window := bulkReadWindow
	if op == protocol.OpWrite {
		window = bulkWriteWindow
	}
	window = min(window, n)
	// request i uses header slot i%window: it is sent only after reply
	// i-window arrived, when that slot's previous header is long gone.
	bufs := s.iov[:0]
	add := func(i int) {
		lo, hi := i*chunk, min((i+1)*chunk, len(p))
		h := protocol.Header{Op: op, Seq: first + uint32(i), Offset: uint64(off) + uint64(lo), Length: uint32(hi - lo)}
		slot := s.hdrs[(i%window)*protocol.HeaderSize : (i%window+1)*protocol.HeaderSize]
		if op == protocol.OpWrite {
			h.Payload = h.Length
		}
		h.Encode(slot)
		bufs = append(bufs, slot)
		if op == protocol.OpWrite {
			bufs = append(bufs, p[lo:hi])
		}
	}
	for i := range window {
		add(i)
	}
	if err := pg.SendV(bufs); err != nil {
		return 0, err
	}
	var hdr [protocol.HeaderSize]byte
	for i := range n {
		lo, hi := i*chunk, min((i+1)*chunk, len(p))
		var buf []byte
		if op == protocol.OpRead {
			buf = p[lo:hi]
		}
		if err := pg.Reply(hdr[:], first+uint32(i), op, buf); err != nil {
			return lo, err
		}
		if next := i + window; next < n {
			bufs = bufs[:0]
			add(next)
			if err := pg.SendV(bufs); err != nil {
				return hi, err
			}
		}
	}
	return len(p), nil
}

// Op is one asynchronous request posted on a queue pair. Buf is the
// destination of a read or the source of a write and must stay untouched
// until its completion; it is at most protocol.MaxPayload bytes.
type Op struct {
	Write bool
	Off   int64
	Buf   []byte
	Tag   uint64 // returned in the completion
}

// Completion reports the end of a posted Op.
type Completion struct {
	Tag uint64
	Seq uint32
	Err error
}

type qop struct {
	op        Op
	seq       uint32
	done      chan error // internal waiters; nil → completion queue
	abandoned bool
}

// QueuePair is an asynchronous channel: requests are pipelined on one
// connection, numbered by sequence, and completed on a completion queue.
// Posting consumes a credit; the donor grants credits back over the
// session's control connection as it completes requests. A connection
// the donor ends while the session lives is re-established alone: the
// requests pending on it are sent again on the new one (same sequence
// numbers, completed once; rejoin.go). A pair that failed with its
// connection broken (a reply that did not come in time, a malformed
// frame) is re-established by the next Post (revive): its failed
// requests stay failed.
type QueuePair struct {
	c *Client
	// id is the queue's id at the donor and conn its connection: both
	// change when the connection is re-established (under wmu and mu;
	// read under either), and cgen counts those changes. br reads conn,
	// from the reader goroutine only (revive sets it while none runs).
	id   uint32
	conn net.Conn
	cgen uint32
	br   *bufio.Reader
	// cancel ends the reader's re-establishment of the connection
	// (Close); resends are the goroutines sending the pending requests
	// again on a new connection, which Close waits for. done closes
	// when the reader returns. cancel and done change when revive
	// starts a new reader (mu).
	cancel  context.CancelFunc
	resends sync.WaitGroup
	done    chan struct{}
	// rmu serialises revive.
	rmu sync.Mutex

	wmu sync.Mutex // serialises frame writes

	mu      sync.Mutex
	seq     uint32
	sent    uint32 // requests posted (cumulative, on conn)
	granted uint32 // credits granted (cumulative, to conn's queue id)
	wake    chan struct{}
	pending map[uint32]*qop
	err     error
	// lost is the session's loss (lose) while requests were pending: no
	// request is posted any more, the reader completes the pending ones
	// from what the connection holds and fails the pair once none is
	// left or the connection ends.
	lost error
	// unsettled: a WRITE was abandoned on conn (do: its caller's
	// context ended) and conn has not been replaced since; renewing: do
	// asked the reader to re-establish conn for it (renew). settled
	// closes once fail has ended the pair's connection at the donor, if
	// it had to, before it completes the requests.
	unsettled, renewing bool
	settled             chan struct{}
	// gaveUp holds the sequence numbers of requests given up on conn
	// (do: their caller's context ended) whose replies have not come,
	// oldest first, at most maxGivenUp: the reader skips a reply to
	// one, and fails the pair (ErrBadFrame) on a reply no request on
	// conn is waiting for and none was given up for. Cleared when conn
	// is replaced: the new connection carries no reply of the old one.
	gaveUp []uint32
	// spare is the connection fail opened to have the donor end the
	// failed one (a queue connection naming it), kept for revive,
	// which serves on it without a HELLO of its own (mu); nil: none.
	spare *spareConn

	cq     chan Completion
	closed bool
}

// spareConn is a queue connection of the session opened for a pair
// that failed, and its HELLO reply.
type spareConn struct {
	conn net.Conn
	rep  helloReply
}

// NewQueuePair opens another queue pair on the session.
func (c *Client) NewQueuePair(ctx context.Context) (*QueuePair, error) {
	return c.newQueuePair(ctx, 0)
}

// newQueuePair opens a queue pair on the session whose connection
// replaces the session's connection replaces (0: none; see
// protocol.ReplacedConnection).
func (c *Client) newQueuePair(ctx context.Context, replaces uint32) (*QueuePair, error) {
	if err := c.err(); err != nil {
		return nil, err
	}
	conn, rep, err := c.handshake(ctx, protocol.KindQueue, replaces)
	if err != nil {
		return nil, err
	}
	q := &QueuePair{c: c, id: rep.queue, conn: conn, br: bufio.NewReaderSize(conn, 64<<10),
		granted: rep.Credits, wake: make(chan struct{}), pending: map[uint32]*qop{},
		cq: make(chan Completion, max(int(rep.Credits), 1)), done: make(chan struct{}), settled: make(chan struct{})}
	c.qmu.Lock()
	c.queues[q.id] = q
	c.qmu.Unlock()
	rctx, cancel := context.WithCancel(context.Background())
	q.cancel = cancel
	go q.reader(rctx, q.done)
	if err := c.err(); err != nil {
		// The session was closed or lost meanwhile, past the pairs it
		// ends (Close, lost).
		_ = q.Close()
		return nil, err
	}
	return q, nil
}

// maxGivenUp bounds QueuePair.gaveUp. The replies of requests given up
// come in order with the others, within the credit window (DefaultCredits
// at a donor: 64); past this many given up without a reply, the oldest
// is forgotten, and its reply, if it ever comes, fails the pair as one
// no request was waiting for (ErrBadFrame: the pair is re-established by
// its next request; nothing is lost but the requests then pending).
const maxGivenUp = 1024

// giveUp records seq, the sequence number of a request given up on
// conn, whose reply the reader skips (mu held).
func (q *QueuePair) giveUp(seq uint32) {
	if len(q.gaveUp) >= maxGivenUp {
		q.gaveUp = append(q.gaveUp[:0], q.gaveUp[1:]...)
	}
	q.gaveUp = append(q.gaveUp, seq)
}

// forget reports whether seq is that of a request given up on conn, and
// forgets it: its reply has come (mu held).
func (q *QueuePair) forget(seq uint32) bool {
	i := slices.Index(q.gaveUp, seq)
	if i < 0 {
		return false
	}
	q.gaveUp = slices.Delete(q.gaveUp, i, i+1)
	return true
}

// rejoinable reports whether a pair that failed with err is
// re-established by its next request: its connection broke (ErrDonorLost:
// a reply that did not come in time, a connection that could not be
// re-established) or carried a malformed frame (ErrBadFrame) — not a pair
// closed, or whose session ended.
func rejoinable(err error) bool {
	return errors.Is(err, protocol.ErrDonorLost) || errors.Is(err, protocol.ErrBadFrame)
}

// revive re-establishes the pair's connection after the pair failed with
// it broken (rejoinable), for the request about to be posted: a new queue
// connection of the session that names the failed one
// (protocol.ReplacedConnection), so that the donor ends that one, if it
// still serves it, and answers once nothing more of it can land; if
// WRITEs were in flight, fail has opened that connection already
// (spare), and the pair goes on on it without a HELLO more. The requests
// that failed stay failed (fail completed them); the pair serves on with
// a fresh credit window, under a new queue id, its completion queue the
// same. Nothing if the pair does not need it (another request revived
// it, or it never failed); an error if the pair was closed, its session
// ended, or the connection could not be re-established (the pair stays
// failed, and the next request tries again).
func (q *QueuePair) revive(ctx context.Context) error {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	q.mu.Lock()
	cause, closed, lost := q.err, q.closed, q.lost
	settled, done, oldID := q.settled, q.done, q.id
	q.mu.Unlock()
	switch {
	case closed:
		return protocol.ErrClosed
	case cause == nil:
		return nil // revived meanwhile
	case lost != nil || !rejoinable(cause):
		return cause
	}
	if err := q.c.err(); err != nil {
		return err
	}
	// fail has ended the failed connection at the donor if it had to,
	// and completed its requests; the reader and the resends are done
	// with the old connection. (The reader may wait for room on the
	// completion queue for the failed requests' completions: bounded by
	// ctx and Options.Timeout.)
	t := time.NewTimer(q.c.opts.Timeout)
	defer t.Stop()
	for _, ch := range []chan struct{}{settled, done} {
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%w (waiting to re-establish the queue connection: %w)", cause, ctx.Err())
		case <-t.C:
			return fmt.Errorf("%w (the failed requests' completions were not taken within %v: drain Completions)", cause, q.c.opts.Timeout)
		}
	}
	q.resends.Wait()
	// The connection fail opened to end the failed one, if it did:
	// the pair goes on on it (one HELLO, not two).
	q.mu.Lock()
	sp := q.spare
	q.spare = nil
	q.mu.Unlock()
	var conn net.Conn
	var rep helloReply
	if sp != nil {
		conn, rep = sp.conn, sp.rep
	} else {
		var err error
		if conn, rep, err = q.c.handshake(ctx, protocol.KindQueue, oldID); err != nil {
			return fmt.Errorf("%w (re-establishing the queue connection: %v)", cause, err)
		}
	}
	// Registered first: a CREDIT for the new queue finds the pair (it
	// comes once a request posted on it completes, after q.id is the
	// new one below).
	q.c.qmu.Lock()
	delete(q.c.queues, oldID)
	q.c.queues[rep.queue] = q
	q.c.qmu.Unlock()
	rctx, cancel := context.WithCancel(context.Background())
	q.wmu.Lock()
	q.mu.Lock()
	if q.closed || q.c.closed.Load() {
		q.mu.Unlock()
		q.wmu.Unlock()
		cancel()
		_ = conn.Close()
		q.c.qmu.Lock()
		delete(q.c.queues, rep.queue)
		q.c.qmu.Unlock()
		return protocol.ErrClosed
	}
	q.conn, q.id, q.cgen = conn, rep.queue, q.cgen+1
	q.br = bufio.NewReaderSize(conn, 64<<10)
	q.granted, q.sent = rep.Credits, 0
	q.err, q.unsettled, q.renewing, q.gaveUp = nil, false, false, nil
	q.settled, q.done, q.cancel = make(chan struct{}), make(chan struct{}), cancel
	close(q.wake)
	q.wake = make(chan struct{})
	done = q.done
	q.mu.Unlock()
	q.wmu.Unlock()
	q.c.rejoins.Add(1)
	go q.reader(rctx, done)
	if err := q.c.err(); err != nil {
		// The session was closed or lost meanwhile, past the pairs it
		// ends (Client.Close, lost).
		if errors.Is(err, protocol.ErrClosed) {
			_ = q.Close()
		} else {
			q.lose(err)
		}
		return err
	}
	return nil
}

// Completions is the completion queue of operations posted with Post.
// Callers must drain it: the queue pair stalls while it is full.
func (q *QueuePair) Completions() <-chan Completion { return q.cq }

// Credits reports the credits currently available for posting.
func (q *QueuePair) Credits() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return int(int32(q.granted - q.sent))
}

// Post sends op, waiting for a credit if none is available, and returns its
// sequence number. Its completion arrives on Completions.
func (q *QueuePair) Post(ctx context.Context, op Op) (uint32, error) {
	return q.post(ctx, &qop{op: op})
}

// grant applies a CREDIT update for queue id: a late one for the queue
// of a connection since re-established is ignored.
func (q *QueuePair) grant(id, v uint32) {
	q.mu.Lock()
	if id == q.id && int32(v-q.granted) > 0 {
		q.granted = v
		close(q.wake)
		q.wake = make(chan struct{})
	}
	q.mu.Unlock()
}

// lose ends the queue pair when its session is lost (its control
// connection ended): with no request pending it fails at once; otherwise
// the requests posted from now on fail with err, and the reader goes on
// reading the connection — the donor that ends a session answers the
// requests it refuses (a retired region's held writes: GONE) on their own
// connection before it closes them all, and that answer may arrive after
// the control connection's end — until no request is pending (the pair
// then fails with err) or the connection ends or stays silent past the
// requests' deadline (the rest fail with the reader's error). A donor that
// went away closes the connection too; one that cannot be reached any
// more leaves the requests to their deadline, as without the loss.
func (q *QueuePair) lose(err error) {
	q.mu.Lock()
	if q.err != nil || q.lost != nil {
		q.mu.Unlock()
		return
	}
	if len(q.pending) == 0 {
		q.mu.Unlock()
		q.fail(err)
		return
	}
	q.lost = err
	close(q.wake) // a post waiting for a credit gives up
	q.wake = make(chan struct{})
	q.mu.Unlock()
}

// fail ends the pair with err: no request is posted any more, and the
// pending ones fail with err, once
//
//   - the connection is closed and the writer lock (wmu) is free: a post
//     writing a request, or a resend (reconnect) writing the pending ones
//     again, reads the callers' buffers; closing the connection ends
//     their writes, and once they let wmu go no buffer of a request is
//     read any more, so a caller may reuse its buffer as soon as the
//     request completes;
//   - the donor has ended the connection, if WRITEs were in flight on it
//     or abandoned there (unsettled) and the session lives: a new queue
//     connection names it (protocol.ReplacedConnection), so that no
//     WRITE that fails here lands after a request issued once it
//     failed, on any channel. The pair keeps that connection (spare)
//     and its next request goes on on it (revive): one HELLO ends the
//     failed connection and re-establishes the pair, admitted at the
//     donor's connection limits since it replaces one (two did: a sync
//     connection closed once answered, then the pair's new one, which
//     the limits could refuse). If that cannot be done, the session is
//     lost (Client.unsettled).
func (q *QueuePair) fail(err error) {
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return
	}
	q.err = err
	pend := q.pending
	q.pending = map[uint32]*qop{}
	close(q.wake)
	q.wake = make(chan struct{})
	conn, id, writes, settled := q.conn, q.id, q.unsettled, q.settled
	for _, o := range pend {
		writes = writes || o.op.Write
	}
	q.mu.Unlock()
	_ = conn.Close()
	q.wmu.Lock()
	//lint:ignore SA2001 an empty critical section waits for the writers
	q.wmu.Unlock()
	if writes {
		// fail has no context of its own; the HELLO is bounded by
		// Options.Timeout.
		q.endConn(id)
	}
	close(settled)
	for _, o := range pend {
		q.finish(o, err)
	}
}

// endConn has the donor end the pair's failed connection id, on which
// WRITEs were in flight, with a new queue connection that names it
// (protocol.ReplacedConnection): the donor answers once nothing more of
// the old one can land. The new connection is kept for the pair's next
// request (spare, revive); closed if the pair was closed meanwhile. If
// the donor cannot be made to end the old one, the session is lost
// (Client.unsettled). Nothing if the session ended.
func (q *QueuePair) endConn(id uint32) {
	if q.c.err() != nil {
		return
	}
	conn, rep, err := q.c.handshake(context.Background(), protocol.KindQueue, id)
	if err != nil {
		q.c.unsettled(protocol.KindQueue, err)
		return
	}
	q.mu.Lock()
	if q.closed || q.c.closed.Load() {
		q.mu.Unlock()
		_ = conn.Close()
		return
	}
	old := q.spare
	q.spare = &spareConn{conn: conn, rep: rep}
	q.mu.Unlock()
	if old != nil { // not reached: revive takes it before the pair can fail again
		_ = old.conn.Close()
	}
}

func (q *QueuePair) finish(o *qop, err error) {
	if o.done != nil {
		o.done <- err
		return
	}
	if o.abandoned {
		return
	}
	q.cq <- Completion{Tag: o.op.Tag, Seq: o.seq, Err: err}
}

func (q *QueuePair) post(ctx context.Context, o *qop) (uint32, error) {
	n := len(o.op.Buf)
	if n > protocol.MaxPayload {
		return 0, fmt.Errorf("memory: queue op of %d bytes exceeds %d", n, protocol.MaxPayload)
	}
	if err := q.c.check(n, o.op.Off); err != nil {
		return 0, err
	}
	var timer <-chan time.Time
	// A pair that failed with its connection broken is re-established
	// first (revive), once per request.
	mayRevive := true
	q.mu.Lock()
	for {
		if q.err != nil && mayRevive && q.lost == nil && !q.closed && rejoinable(q.err) {
			q.mu.Unlock()
			mayRevive = false
			if err := q.revive(ctx); err != nil {
				return 0, err
			}
			q.mu.Lock()
			continue
		}
		if q.err != nil || q.lost != nil || int32(q.granted-q.sent) > 0 {
			break
		}
		w := q.wake
		q.mu.Unlock()
		if timer == nil {
			t := time.NewTimer(q.c.opts.Timeout)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-w:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-timer:
			mayRevive = false // this request fails
			q.fail(fmt.Errorf("%w: no credit granted within %v", protocol.ErrDonorLost, q.c.opts.Timeout))
		}
		q.mu.Lock()
	}
	if q.err != nil || q.lost != nil {
		err := q.err
		if err == nil {
			err = q.lost
		}
		q.mu.Unlock()
		return 0, err
	}
	q.sent++
	q.seq++
	o.seq = q.seq
	q.pending[o.seq] = o
	gen := q.cgen
	_ = q.conn.SetReadDeadline(q.c.deadline(ctx))
	q.mu.Unlock()

	var hdr [protocol.HeaderSize]byte
	bufs := o.frame(hdr[:])
	q.wmu.Lock()
	if q.cgen != gen {
		// The connection was re-established since o was registered:
		// o was pending then, and sent again on the new one.
		q.wmu.Unlock()
		return o.seq, nil
	}
	conn := q.conn
	_ = conn.SetWriteDeadline(q.c.deadline(ctx))
	_, err := bufs.WriteTo(conn)
	q.wmu.Unlock()
	if err != nil && !connEnded(err) {
		q.fail(transportErr(err))
	}
	// A connection the donor ended: the reader finds its end, and
	// re-establishes it (sending o again) or fails the pair.
	return o.seq, nil
}

// frame is o's request frame, its header encoded into hdr.
func (o *qop) frame(hdr []byte) net.Buffers {
	n := len(o.op.Buf)
	h := protocol.Header{Op: protocol.OpRead, Seq: o.seq, Offset: uint64(o.op.Off), Length: uint32(n)}
	bufs := net.Buffers{hdr}
	if o.op.Write {
		h.Op, h.Payload = protocol.OpWrite, uint32(n)
		bufs = append(bufs, o.op.Buf)
	}
	h.Encode(hdr)
	return bufs
}

var qopPool = sync.Pool{New: func() any { return &qop{done: make(chan error, 1)} }}

// do runs one request on the queue pair, split into chunks that are all in
// flight together, and waits for them.
func (q *QueuePair) do(ctx context.Context, op uint8, p []byte, off int64, chunk int) error {
	n := (len(p) + chunk - 1) / chunk
	ops := make([]*qop, 0, n)
	var err error
	for i := 0; i < len(p); i += chunk {
		o := qopPool.Get().(*qop)
		o.op = Op{Write: op == protocol.OpWrite, Off: off + int64(i), Buf: p[i:min(i+chunk, len(p))]}
		o.abandoned = false
		if _, err = q.post(ctx, o); err != nil {
			qopPool.Put(o)
			break
		}
		ops = append(ops, o)
	}
	abandoned, write := false, false
	for _, o := range ops {
		select {
		case e := <-o.done:
			if err == nil {
				err = e
			}
			qopPool.Put(o)
			continue
		case <-ctx.Done():
		}
		q.mu.Lock()
		if _, ok := q.pending[o.seq]; ok {
			delete(q.pending, o.seq) // the reader will discard its reply
			q.giveUp(o.seq)
			if o.op.Write {
				q.unsettled, write = true, true
			}
			q.mu.Unlock()
			abandoned = true
			if err == nil {
				err = ctx.Err()
			}
			continue // o is dropped, not pooled: its done may never fire
		}
		q.mu.Unlock()
		if e := <-o.done; err == nil {
			err = e
		}
		qopPool.Put(o)
	}
	if write {
		// An abandoned WRITE may still land (its payload late, or held
		// by a move's pause): its connection is ended first (renew).
		q.renew()
	}
	if abandoned {
		// A re-established connection's resend may be sending the
		// abandoned requests: p is the caller's again once it is done.
		q.wmu.Lock()
		//lint:ignore SA2001 an empty critical section waits for the resend
		q.wmu.Unlock()
	}
	return err
}

// renew has the pair's connection re-established, naming the old one
// (protocol.ReplacedConnection), after do abandoned a WRITE on it: the
// donor ends the old connection, a WRITE under way or held there
// included, and answers the new one's HELLO once nothing more of it can
// land. It returns once that is done, or once the pair failed (fail
// ends the connection too: renew waits for it) or the session was lost
// (no request goes out on it any more). The reader re-establishes the
// connection: renew marks it wanted and ends the connection for reading,
// which wakes the reader; the requests still pending are sent again on
// the new connection, as when the donor ends one.
func (q *QueuePair) renew() {
	q.mu.Lock()
	gen, conn := q.cgen, q.conn
	// A pair that failed needs none; one whose session was lost goes on
	// reading the answers its connection holds (lose).
	live := q.err == nil && q.lost == nil
	q.renewing = live
	q.mu.Unlock()
	if live {
		closeRead(conn)
	}
	q.mu.Lock()
	for q.cgen == gen && q.err == nil && q.lost == nil {
		w := q.wake
		q.mu.Unlock()
		<-w
		q.mu.Lock()
	}
	failed, settled := q.cgen == gen && q.err != nil, q.settled
	q.mu.Unlock()
	if failed {
		<-settled
	}
}

// closeRead ends conn (a TCP connection, or TLS over one) for reading
// only: its reader finds the end, while requests may still be written
// on it until it is replaced. Any other connection is closed.
func closeRead(conn net.Conn) {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	if cr, ok := conn.(interface{ CloseRead() error }); ok && cr.CloseRead() == nil {
		return
	}
	_ = conn.Close()
}

// takeRenewing reports whether renew asked for the connection to be
// re-established (mu held), and takes the request.
func (q *QueuePair) takeRenewing() bool {
	r := q.renewing
	q.renewing = false
	return r
}

func (q *QueuePair) reader(ctx context.Context, done chan struct{}) {
	defer close(done)
	var hdr [protocol.HeaderSize]byte
	// rejoins counts the connections re-established since the last
	// reply: a donor that keeps ending them fails the pair. One renew
	// asked for is not counted.
	rejoins := 0
	// rejoin re-establishes the connection after it ended (ended), or
	// when renew asked for it.
	rejoin := func(ended bool) bool {
		if q.c.closed.Load() || q.isClosed() {
			return false
		}
		q.mu.Lock()
		renewing := q.takeRenewing()
		q.mu.Unlock()
		if renewing {
			return q.reconnect(ctx)
		}
		if !ended || rejoins >= maxRejoins {
			return false
		}
		rejoins++
		return q.reconnect(ctx)
	}
	for {
		var h protocol.Header
		_, err := io.ReadFull(q.br, hdr[:])
		ended := err != nil && connEnded(err)
		if err != nil {
			err = transportErr(err)
		} else {
			h, err = protocol.DecodeHeader(hdr[:])
		}
		if err == nil && (!h.IsResponse() || (h.Op != protocol.OpRead && h.Op != protocol.OpWrite)) {
			err = fmt.Errorf("%w: unexpected frame op %d on a queue pair", protocol.ErrBadFrame, h.Op)
		}
		if err != nil {
			if q.c.closed.Load() || q.isClosed() {
				err = protocol.ErrClosed
			} else if rejoin(ended) {
				continue
			}
			q.fail(err)
			return
		}
		rejoins = 0
		q.mu.Lock()
		renewing := q.renewing // taken once this reply is read (rejoin)
		o := q.pending[h.Seq]
		if o == nil && !q.forget(h.Seq) {
			// No request on the connection is waiting for it, and none
			// was given up: a donor's bug, or a corrupted stream. The
			// replies after it cannot be trusted either; the requests
			// pending fail at once rather than at their deadline.
			q.mu.Unlock()
			q.fail(fmt.Errorf("%w: a reply (op %d) for seq %d, which no request on the queue connection is waiting for",
				protocol.ErrBadFrame, h.Op, h.Seq))
			return
		}
		delete(q.pending, h.Seq)
		if len(q.pending) == 0 {
			_ = q.conn.SetReadDeadline(time.Time{})
		} else {
			_ = q.conn.SetReadDeadline(time.Now().Add(q.c.opts.Timeout))
		}
		// The session is lost and this was the last request pending
		// (lose): the pair ends once it is completed.
		lost := q.lost
		if len(q.pending) > 0 {
			lost = nil
		}
		q.mu.Unlock()
		var res error
		want := protocol.OpRead
		if o != nil && o.op.Write {
			want = protocol.OpWrite
		}
		if h.Status != protocol.StatusOK {
			res = readStatus(q.br, h)
		} else if o != nil && (h.Op != want || (want == protocol.OpRead && int(h.Payload) != len(o.op.Buf))) {
			// Completing o would report a read that filled nothing, or
			// write a read's data into the source of a write.
			err := fmt.Errorf("%w: reply op %d of %d bytes for seq %d op %d of %d bytes",
				protocol.ErrBadFrame, h.Op, h.Payload, h.Seq, want, len(o.op.Buf))
			if o.op.Write {
				q.mu.Lock()
				q.unsettled = true // its fate unknown: see fail
				q.mu.Unlock()
			}
			q.fail(err) // first: see fail
			q.finish(o, err)
			return
		} else if h.Payload > 0 {
			if o == nil {
				_, err = q.br.Discard(int(h.Payload))
			} else {
				_, err = io.ReadFull(q.br, o.op.Buf)
			}
			if err != nil {
				// o, a READ whose data the connection's end cut short,
				// is pending again: sent again, or failed with the pair.
				repended := connEnded(err) && q.repend(o)
				if repended && rejoin(true) {
					continue
				}
				err = transportErr(err)
				q.fail(err)
				if o != nil && !repended {
					q.finish(o, err)
				}
				return
			}
		}
		if o != nil {
			q.finish(o, res)
		}
		if lost != nil {
			q.fail(lost)
			return
		}
		if renewing && !rejoin(false) {
			err := fmt.Errorf("%w: the queue connection could not be re-established", protocol.ErrDonorLost)
			if q.c.closed.Load() || q.isClosed() {
				err = protocol.ErrClosed
			}
			q.fail(err)
			return
		}
	}
}

// repend puts o (nil: nothing), whose reply's data the connection's end
// cut short, back among the pending requests; false if the session was
// lost meanwhile (the pair then fails).
func (q *QueuePair) repend(o *qop) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil || q.lost != nil {
		return false
	}
	if o != nil {
		q.pending[o.seq] = o
	}
	return true
}

// reconnect re-establishes the pair's connection, which the donor ended
// while the session lives, as a new queue connection of the session (a
// queue of its own at the donor, with a fresh credit window), and has
// the requests pending sent again on it, in order, before any posted
// later (rejoin.go). False if the session, or the pair, ended or the
// connection could not be re-established: the pair then fails.
func (q *QueuePair) reconnect(ctx context.Context) bool {
	if q.c.err() != nil {
		return false
	}
	// Named as the one it replaces: the donor ends the old one first
	// (rejoin.go).
	conn, rep, err := q.c.handshake(ctx, protocol.KindQueue, q.id)
	if err != nil {
		return false
	}
	q.wmu.Lock() // until the pending requests are sent again (resend)
	q.mu.Lock()
	if q.err != nil || q.lost != nil || q.closed || q.c.closed.Load() {
		q.mu.Unlock()
		q.wmu.Unlock()
		_ = conn.Close()
		return false
	}
	old, oldID := q.conn, q.id
	q.conn, q.id, q.cgen = conn, rep.queue, q.cgen+1
	// The new connection named the old one: nothing abandoned there
	// lands any more, and a renew asked for is done.
	q.unsettled, q.renewing, q.gaveUp = false, false, nil
	q.br = bufio.NewReaderSize(conn, 64<<10)
	ops := make([]*qop, 0, len(q.pending))
	for _, o := range q.pending {
		ops = append(ops, o)
	}
	// In the order they were posted (sequence numbers wrap; the pending
	// ones are within a window of each other).
	slices.SortFunc(ops, func(a, b *qop) int { return cmp.Compare(int32(a.seq-b.seq), 0) })
	// The new queue's window holds as many requests as the old one's;
	// any beyond it (a donor whose window shrank) fail.
	var over []*qop
	if len(ops) > int(rep.Credits) {
		ops, over = ops[:rep.Credits], ops[rep.Credits:]
		for _, o := range over {
			delete(q.pending, o.seq)
		}
	}
	q.granted, q.sent = rep.Credits, uint32(len(ops))
	close(q.wake)
	q.wake = make(chan struct{})
	if len(ops) > 0 {
		_ = conn.SetReadDeadline(time.Now().Add(q.c.opts.Timeout))
	}
	q.mu.Unlock()
	_ = old.Close()
	q.c.qmu.Lock()
	delete(q.c.queues, oldID)
	q.c.queues[rep.queue] = q
	q.c.qmu.Unlock()
	q.c.rejoins.Add(1)
	// From another goroutine, so that the reader takes the replies
	// meanwhile (the donor stops reading requests while its replies
	// are not read); posts wait on wmu until it is done.
	q.resends.Go(func() {
		defer q.wmu.Unlock()
		_ = conn.SetWriteDeadline(time.Now().Add(q.c.opts.Timeout))
		var hdr [protocol.HeaderSize]byte
		for _, o := range ops {
			bufs := o.frame(hdr[:])
			if _, err := bufs.WriteTo(conn); err != nil {
				// The reader finds the connection's end and
				// re-establishes it again or fails the pair; any other
				// failure ends the connection for it to find.
				if !connEnded(err) {
					_ = conn.Close()
				}
				return
			}
		}
	})
	for _, o := range over {
		q.finish(o, fmt.Errorf("%w: the re-established queue connection's window is smaller", protocol.ErrDonorLost))
	}
	return true
}

func (q *QueuePair) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// Close closes the queue pair; outstanding operations fail with protocol.ErrClosed.
func (q *QueuePair) Close() error {
	q.mu.Lock()
	q.closed = true
	conn, cancel, done, sp := q.conn, q.cancel, q.done, q.spare
	q.spare = nil
	q.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	_ = conn.Close()
	if sp != nil {
		_ = sp.conn.Close()
	}
	<-done
	q.resends.Wait()
	// A revive under way finds the pair closed, and does not register
	// it again.
	q.mu.Lock()
	id := q.id
	q.mu.Unlock()
	q.c.qmu.Lock()
	delete(q.c.queues, id)
	q.c.qmu.Unlock()
	return nil
}
