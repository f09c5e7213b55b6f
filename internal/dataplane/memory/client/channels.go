package client

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/internal/rawconn"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// bulkStream is one connection of the bulk channel, driven with raw
// syscalls like the synchronous channel (see rawconn).
type bulkStream struct {
	mu   sync.Mutex
	pg   *rawconn.Conn
	seq  uint32
	bad  error
	hdrs [bulkReadWindow * protocol.HeaderSize]byte
	iov  [][]byte
}

func (s *bulkStream) close() {
	s.pg.Shutdown()
	s.mu.Lock()
	s.pg.Close()
	if s.bad == nil {
		s.bad = protocol.ErrClosed
	}
	s.mu.Unlock()
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
			errs[0] = c.streams[0].run(ctx, op, p[lo:hi], off+int64(lo), chunk)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.streams[i].run(ctx, op, p[lo:hi], off+int64(lo), chunk)
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
// and each reply received releases the next request.
func (s *bulkStream) run(ctx context.Context, op uint8, p []byte, off int64, chunk int) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bad != nil {
		return s.bad
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, s.pg.Shutdown)
		defer stop()
	}
	defer func() {
		if err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("%w: %w", protocol.ErrDonorLost, ctx.Err())
			}
			s.bad = err
			s.pg.Shutdown()
		}
	}()
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
	if err := s.pg.SendV(bufs); err != nil {
		return err
	}
	var hdr [protocol.HeaderSize]byte
	for i := range n {
		lo, hi := i*chunk, min((i+1)*chunk, len(p))
		var buf []byte
		if op == protocol.OpRead {
			buf = p[lo:hi]
		}
		if err := s.pg.Reply(hdr[:], first+uint32(i), op, buf); err != nil {
			return err
		}
		if next := i + window; next < n {
			bufs = bufs[:0]
			add(next)
			if err := s.pg.SendV(bufs); err != nil {
				return err
			}
		}
	}
	return nil
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
// session's control connection as it completes requests.
type QueuePair struct {
	c    *Client
	id   uint32
	conn net.Conn
	br   *bufio.Reader

	wmu sync.Mutex // serialises frame writes

	mu      sync.Mutex
	seq     uint32
	sent    uint32 // requests posted (cumulative)
	granted uint32 // credits granted (cumulative)
	wake    chan struct{}
	pending map[uint32]*qop
	err     error
	// lost is the session's loss (lose) while requests were pending: no
	// request is posted any more, the reader completes the pending ones
	// from what the connection holds and fails the pair once none is
	// left or the connection ends.
	lost error

	cq     chan Completion
	done   chan struct{}
	closed bool
}

// NewQueuePair opens another queue pair on the session.
func (c *Client) NewQueuePair(ctx context.Context) (*QueuePair, error) {
	if err := c.err(); err != nil {
		return nil, err
	}
	conn, rep, err := c.handshake(ctx, protocol.KindQueue)
	if err != nil {
		return nil, err
	}
	q := &QueuePair{c: c, id: rep.queue, conn: conn, br: bufio.NewReaderSize(conn, 64<<10),
		granted: rep.Credits, wake: make(chan struct{}), pending: map[uint32]*qop{},
		cq: make(chan Completion, max(int(rep.Credits), 1)), done: make(chan struct{})}
	c.qmu.Lock()
	c.queues[q.id] = q
	c.qmu.Unlock()
	go q.reader()
	return q, nil
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

func (q *QueuePair) grant(v uint32) {
	q.mu.Lock()
	if int32(v-q.granted) > 0 {
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
	q.mu.Unlock()
	for _, o := range pend {
		q.finish(o, err)
	}
	_ = q.conn.Close()
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
	q.mu.Lock()
	for q.err == nil && q.lost == nil && int32(q.granted-q.sent) <= 0 {
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
	_ = q.conn.SetReadDeadline(q.c.deadline(ctx))
	q.mu.Unlock()

	h := protocol.Header{Op: protocol.OpRead, Seq: o.seq, Offset: uint64(o.op.Off), Length: uint32(n)}
	var hdr [protocol.HeaderSize]byte
	bufs := net.Buffers{hdr[:]}
	if o.op.Write {
		h.Op, h.Payload = protocol.OpWrite, uint32(n)
		bufs = append(bufs, o.op.Buf)
	}
	h.Encode(hdr[:])
	q.wmu.Lock()
	_ = q.conn.SetWriteDeadline(q.c.deadline(ctx))
	_, err := bufs.WriteTo(q.conn)
	q.wmu.Unlock()
	if err != nil {
		q.fail(transportErr(err))
	}
	return o.seq, nil
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
			q.mu.Unlock()
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
	return err
}

func (q *QueuePair) reader() {
	defer close(q.done)
	var hdr [protocol.HeaderSize]byte
	for {
		h, err := readHeader(q.br, hdr[:])
		if err == nil && (!h.IsResponse() || (h.Op != protocol.OpRead && h.Op != protocol.OpWrite)) {
			err = fmt.Errorf("%w: unexpected frame op %d on a queue pair", protocol.ErrBadFrame, h.Op)
		}
		if err != nil {
			if q.c.closed.Load() || q.isClosed() {
				err = protocol.ErrClosed
			}
			q.fail(err)
			return
		}
		q.mu.Lock()
		o := q.pending[h.Seq]
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
			q.finish(o, err)
			q.fail(err)
			return
		} else if h.Payload > 0 {
			if o == nil {
				_, err = q.br.Discard(int(h.Payload))
			} else {
				_, err = io.ReadFull(q.br, o.op.Buf)
			}
			if err != nil {
				err = transportErr(err)
				if o != nil {
					q.finish(o, err)
				}
				q.fail(err)
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
	}
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
	q.mu.Unlock()
	_ = q.conn.Close()
	<-q.done
	q.c.qmu.Lock()
	delete(q.c.queues, q.id)
	q.c.qmu.Unlock()
	return nil
}
