package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	"golang.org/x/sys/unix"
)

const (
	defaultWorkers   = 16
	maxInflightBytes = 64 << 20 // payload bytes held per connection
	maxBatch         = 64       // replies per writev
	maxGroup         = 16       // requests per hand-off to a worker
	tlsMaxGroup      = 8        // the same over TLS
)

// op is one request travelling reader → worker → writer.
type op struct {
	req   Request
	errno uint32
	buf   *[]byte // pooled payload (write data in, read data out)
	data  []byte  // write data in the reader's buffer (served by the reader)
	held  int64   // budget bytes to release once written
	hdr   [32]byte
	hlen  int
	out   []byte       // reply payload after hdr (aliases buf or ext)
	ext   []byte       // block-status payload
	mref  mappedSource // out points into this backend's mapping

	// Large reads from a file are sent with sendfile(2) instead of out.
	sfFD  int
	sfOff int64
	sfLen int
	sfSrc sendfileSource // holds sfFD open until released by freeOp

	started bool // started on the backend's ReadStarter or WriteStarter (counted in conn.nstarted)

	watch ReplyWatcher // the backend's error in the reply wants to know whether it was sent

	// pend is the move's gate o's payload is counted pending at
	// (conn.reservePending), until o is executed or freed.
	pend *dirty.Gate
}

var opPool = sync.Pool{New: func() any { return new(op) }}

// A group is the requests the reader hands one worker at once: those it
// parsed from what one read of the socket brought, up to maxGroup. The
// worker serves them in order and sends their replies with one writev.
type group []*op

var groupPool = sync.Pool{New: func() any { g := make(group, 0, maxGroup); return &g }}

// budget bounds the payload bytes in flight on one connection.
type budget struct {
	mu     sync.Mutex
	cond   sync.Cond
	used   int64
	limit  int64
	lifted bool // no longer bounds (conn.markEnded)
}

func (b *budget) acquire(n int64) {
	b.mu.Lock()
	for b.used > 0 && b.used+n > b.limit && !b.lifted {
		b.cond.Wait()
	}
	b.used += n
	b.mu.Unlock()
}

func (b *budget) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used > 0 && b.used+n > b.limit {
		return false
	}
	b.used += n
	return true
}

// lift makes acquire stop waiting, now and from now on.
func (b *budget) lift() {
	b.mu.Lock()
	b.lifted = true
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	b.cond.Signal()
}

type conn struct {
	s      *Server
	nc     net.Conn
	cancel context.CancelFunc // ends the connection (RemoveExport)
	done   chan struct{}      // closed when the connection has stopped
	// abandoned is set when the reader ends without NBD_CMD_DISC (the
	// client went away, or broke the protocol): requests still queued
	// for the workers are then answered ESHUTDOWN without reaching the
	// backend (execute).
	abandoned atomic.Bool
	// Whether the client's end may come while the reader cannot see it
	// (abandon.go): watchNone, watchBlocked or watchEnded.
	watch   atomic.Int32
	peer    syscall.RawConn // the socket, for peerEnded; nil if nc is not one
	disc    bool            // the reader read NBD_CMD_DISC (reader's; serve reads it after)
	hmu     sync.Mutex      // guards decided and held
	decided bool            // serve has decided on the held requests
	held    []*op           // requests held while the client's end was undecided
	r       *bufio.Reader
	sess    *session
	e       *export

	// A write whose payload the reader reads after it started (spliced,
	// or read or decrypted into a tmpfs file's mapping: untracked), as a
	// move's bounded wait
	// sees it (move.go): paying is set while one is under way, recv
	// counts the bytes the reader took from the socket for it (over TLS,
	// every byte crypto/tls takes).
	paying atomic.Bool
	recv   atomic.Int64

	be    Backend
	trim  Trimmer
	zero  Zeroer
	ext   Extenter
	fua   FUAWriter
	fuaf  FUAFlusher
	rst   ReadStarter
	wst   WriteStarter
	size  uint64
	min   uint32
	max   uint32
	ro    bool
	limit *RateLimit

	reqs     chan *group
	pending  *group // requests parsed and not yet handed to a worker
	maxGroup int    // requests per group: maxGroup for memory-speed backends, else 1
	bud      budget
	wmu      sync.Mutex     // serialises writes to nc
	werr     error          // the first failed send (guarded by wmu)
	failed   atomic.Bool    // werr is set
	inflight atomic.Int64   // requests grouped or handed to workers and not yet executed
	started  sync.WaitGroup // requests started on rst or wst whose done has not run
	nstarted atomic.Int64   // requests started and not yet freed (sent)
	kick     chan struct{}  // wakes the sender of started requests' replies
	rmu      sync.Mutex     // guards rq
	rq       []*op          // executed requests whose replies wait for the socket
	rqSpare  []*op          // guarded by wmu

	batch   []*op                // replies the reader goroutine sends itself
	iov     [2 * maxBatch][]byte // guarded by wmu
	bufs    net.Buffers          // guarded by wmu
	fr      *fastReader          // nil unless nc is a TCP or Unix socket
	burst   int                  // requests read since the reader last waited
	spliced bool                 // the last request was a write whose payload came straight from the socket (spliced, or read into a mapping)
	mp      mappedSource         // nil unless the backend is mapped and nc is a socket
	sp      spliceTarget
	// splice pipe for large writes (0 until first used)
	pipeR, pipeW int
	noSplice     bool
	rawc         syscall.RawConn // for sendfile; nil when nc is not a socket
	sock         syscall.RawConn // the TCP socket under nc, TLS or not (queuedBehind); nil for others
	tcp          bool
	sf           sendfileSource
}

// sendfileSource is implemented by backends whose bytes live in a file
// descriptor, so that large reads go from the page cache to the socket with
// sendfile(2) instead of pread + write (one copy instead of two).
// sendfileRange returns ok=false when the range must be read the ordinary
// way (including once the backend is closed); after ok=true the descriptor
// stays open, even across a concurrent Close, until the caller calls
// releaseFD once.
type sendfileSource interface {
	sendfileRange(off, n int64) (fd int, foff int64, ok bool)
	releaseFD()
}

// mapRead points o's reply at the backend's mapping when it can; the
// kernel then copies the bytes to the socket without a pread.
func (c *conn) mapRead(o *op) bool {
	if c.mp == nil {
		return false
	}
	p, ok := c.mp.mapRange(int64(o.req.Offset), int64(o.req.Length))
	if !ok {
		return false
	}
	o.mref, o.out = c.mp, p
	c.encodeRead(o)
	mappedReads.Add(1)
	return true
}

// mappedReads counts the reads answered from the backend's mapping (for
// tests).
var mappedReads atomic.Int64

// readerBatch bounds the replies the reader holds before sending them, so
// that the client can start on the first replies while the rest are read.
const readerBatch = 8

// sendfileMin is the smallest read served with sendfile; below it pread +
// writev costs fewer system calls.
const sendfileMin = 64 << 10

func newConn(s *Server, nc net.Conn, r *bufio.Reader, sess *session) *conn {
	e := sess.exp
	c := &conn{s: s, nc: nc, r: r, sess: sess, e: e, be: e.Backend,
		size: uint64(e.size), min: e.MinBlock, max: e.MaxBlock, ro: e.ReadOnly, limit: e.Limit}
	c.trim, _ = e.Backend.(Trimmer)
	c.zero, _ = e.Backend.(Zeroer)
	c.ext, _ = e.Backend.(Extenter)
	c.fua, _ = e.Backend.(FUAWriter)
	c.fuaf, _ = e.Backend.(FUAFlusher)
	c.rst, _ = e.Backend.(ReadStarter)
	c.wst, _ = e.Backend.(WriteStarter)
	c.bud.limit = maxInflightBytes
	c.sf, _ = e.Backend.(sendfileSource)
	c.sp, _ = e.Backend.(spliceTarget)
	switch t := nc.(type) {
	case *net.TCPConn:
		c.rawc, _ = t.SyscallConn()
		c.sock = c.rawc
		c.tcp = true
	case *net.UnixConn:
		c.rawc, _ = t.SyscallConn()
	case *rawSock:
		c.rawc, c.tcp = sockRC{t}, t.tcp
	}
	if c.rawc != nil {
		// Mapped bytes may only reach a socket's writev: Go code touching
		// them could fault if the file were truncated.
		c.mp, _ = e.Backend.(mappedSource)
	}
	c.bud.cond.L = &c.bud.mu
	c.maxGroup = 1
	if m, ok := e.Backend.(memorySpeed); ok && m.memorySpeed() {
		c.maxGroup = maxGroup
		if sess != nil && sess.encrypted() {
			// Over TLS a group's replies are also encrypted before the
			// first of them leaves: smaller groups keep the client's
			// queue fuller (docs/bench/tls.md, "Follow-up: queue depth
			// 32 over TLS").
			c.maxGroup = tlsMaxGroup
		}
	}
	return c
}

// memorySpeed is implemented by backends whose requests never wait for a
// device (a FileBackend on tmpfs or ramfs): the reader hands their requests
// to the workers in groups, each served in order by one worker. Requests to
// other backends (a disk, where a read may wait for the device) go to a
// worker each, so that they wait in parallel.
type memorySpeed interface {
	memorySpeed() bool
}

// serve runs the transmission phase: this goroutine reads requests and
// hands them in groups to a bounded set of workers, which execute them and
// send their replies.
func (c *conn) serve(ctx context.Context) error {
	transmitting.Add(1)
	defer transmitting.Add(-1)
	nw := c.s.Workers
	if nw <= 0 {
		nw = defaultWorkers
	}
	c.reqs = make(chan *group, nw)
	var wg sync.WaitGroup
	wg.Add(nw)
	for i := 0; i < nw; i++ {
		go func() {
			defer wg.Done()
			for g := range c.reqs {
				c.serveGroup(ctx, g)
			}
		}()
	}

	var sent chan struct{}
	starts := c.rst != nil || c.wst != nil
	if starts {
		// The replies of requests started on rst or wst are sent by
		// this goroutine: their done runs on whichever goroutine read
		// the part's reply, which must not wait for this socket.
		c.kick, sent = make(chan struct{}, 1), make(chan struct{})
		go func() {
			defer close(sent)
			for range c.kick {
				c.drainReplies()
			}
		}()
	}

	rerr := c.reader(ctx)
	if rerr != nil && !c.disc {
		// No NBD_CMD_DISC: nobody waits for the replies. A client that
		// lost the connection may already have sent a queued write
		// again on another one, and written the range since: the
		// stale copy must not land after that (on a file backend a
		// write that is being executed is in the kernel already,
		// ordered before later writes of the file; a backend that
		// forwards it to another server gives no such order). After
		// NBD_CMD_DISC every request received before it is served,
		// even if a reply could not be sent: the client asked for
		// them to be handled.
		c.abandoned.Store(true)
		if c.s.testHookAbandoned != nil {
			c.s.testHookAbandoned()
		}
	}
	if c.s.testHookEnded != nil {
		c.s.testHookEnded()
	}
	// The requests held while the client's end was undecided, and the
	// group parsed last, go on now: refused if abandoned (execute).
	held := c.decide()
	c.dispatch()
	c.closePipe()

	close(c.reqs)
	wg.Wait()
	if len(held) > 0 {
		late := c.e.Deadline.Passed()
		for _, o := range held {
			if late {
				c.shutdown(o)
				continue
			}
			c.execute(ctx, o)
		}
		c.queueReplies(held, false)
		c.inflight.Add(-int64(len(held)))
	}
	if starts {
		c.started.Wait()
		close(c.kick)
		<-sent
	}
	c.drainReplies()
	if rerr != nil && !errors.Is(rerr, io.EOF) && !errors.Is(rerr, net.ErrClosed) {
		return rerr
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.werr
}

// shutdown answers o ESHUTDOWN without reaching the backend (its
// export's deadline passed before a worker took it up).
func (c *conn) shutdown(o *op) {
	c.unpend(o)
	o.errno = ESHUTDOWN
	c.encodeError(o)
}

// serveGroup executes a group's requests in order and queues their
// replies.
func (c *conn) serveGroup(ctx context.Context, g *group) {
	ops := *g
	n := len(ops)
	if h := c.s.testHookGroup; h != nil {
		h()
	}
	// Read before the deadline, but perhaps taken up after it (one clock
	// reading per group).
	late := c.e.Deadline.Passed()
	for i, o := range ops {
		if w := c.watch.Load(); w != watchNone && isWrite(o.req.Type) && c.hold(w, ops[i:]) {
			// Held until the reader has read to the client's end
			// (abandon.go).
			n = i
			break
		}
		if late {
			c.shutdown(o)
			continue
		}
		c.execute(ctx, o)
	}
	c.queueReplies(ops[:n], false)
	c.inflight.Add(-int64(n))
	clear(ops)
	*g = ops[:0]
	groupPool.Put(g)
}

// maxQueuedReplies bounds the replies queued for the socket: beyond it the
// goroutine queueing waits for the socket, so that a client that does not
// take its replies stops the workers and then the reader, rather than
// making the server queue replies without bound (requests without payload
// hold no budget).
const maxQueuedReplies = 4 * maxBatch

// queueReplies queues the replies of ops (executed) and sends what is
// queued unless another goroutine is sending, which then sends them too:
// whoever holds the socket sends every reply that is ready, up to maxBatch
// per writev, and nobody waits for the socket behind it (up to
// maxQueuedReplies). reader says the caller is the connection's reader,
// whose wait for the socket then lets the workers watch for the client's
// end (abandon.go).
func (c *conn) queueReplies(ops []*op, reader bool) {
	c.rmu.Lock()
	c.rq = append(c.rq, ops...)
	n := len(c.rq)
	c.rmu.Unlock()
	if n > maxQueuedReplies {
		if reader {
			c.blockBegin()
		}
		c.wmu.Lock()
		c.sendQueued()
		c.wmu.Unlock()
		if reader {
			c.blockEnd()
		}
	}
	c.drainReplies()
}

// drainReplies sends the queued replies if no other goroutine is sending.
func (c *conn) drainReplies() {
	for c.wmu.TryLock() {
		c.sendQueued()
		c.wmu.Unlock()
		// Replies queued while this goroutine held the socket, by one
		// that found it taken, are sent by the next pass.
		c.rmu.Lock()
		empty := len(c.rq) == 0
		c.rmu.Unlock()
		if empty {
			return
		}
	}
}

// sendQueued sends the queued replies until none is left; the caller holds
// wmu. After a failed send it only frees them (the connection is closed,
// so the reader stops).
func (c *conn) sendQueued() {
	for {
		c.rmu.Lock()
		batch := c.rq
		c.rq = c.rqSpare[:0]
		c.rmu.Unlock()
		if len(batch) == 0 {
			c.rqSpare = batch
			return
		}
		sent := 0 // the first sent replies of batch were written whole
		for b := batch; len(b) > 0 && c.werr == nil; {
			k := min(len(b), maxBatch)
			if c.werr = c.send(b[:k]); c.werr != nil {
				c.failed.Store(true)
				// The server has observed the client's end: the
				// writes not started are held until the reader has
				// ended, as after an end found on the socket
				// (abandon.go; TestAbandonedAfterFailedSend).
				c.markEnded()
				// Before the client can see the connection end.
				tellSent(batch[sent:], false)
				c.nc.Close()
			} else {
				sent += k
			}
			b = b[k:]
		}
		tellSent(batch[:sent], true)
		for _, o := range batch {
			c.freeOp(o) // tells the others (not sent)
		}
		clear(batch)
		c.rqSpare = batch[:0]
	}
}

// grouped counts the requests handed to workers in groups of more than
// one, readerWrites the writes the reader served from its buffer at
// depth (for tests).
var grouped, readerWrites atomic.Int64

// tlsReaderWrites counts the writes over TLS the reader served from the
// payload it decrypted (for tests).
var tlsReaderWrites atomic.Int64

// dispatch hands the pending group to a worker. The channel send may
// block while every worker is busy: the workers then watch for the
// client's end (abandon.go).
func (c *conn) dispatch() {
	if c.pending == nil {
		return
	}
	if n := len(*c.pending); n > 1 {
		grouped.Add(int64(n))
	}
	select {
	case c.reqs <- c.pending:
	default:
		c.blockBegin()
		c.reqs <- c.pending
		c.blockEnd()
	}
	c.pending = nil
}

// requestBuffered reports whether the next request header is already
// here: in the reader's buffer or, over TLS, in a whole record crypto/tls
// has not taken yet.
func (c *conn) requestBuffered() bool {
	return c.r.Buffered() >= requestHeaderLen || c.recordQueued()
}

// recordQueued reports whether, over TLS, a whole record (normally a
// request) waits behind what the reader has taken.
func (c *conn) recordQueued() bool {
	return c.sess != nil && c.sess.rec != nil && c.sess.rec.recordBuffered()
}

// reader parses requests until DISC, EOF or a protocol violation.
func (c *conn) reader(ctx context.Context) error {
	defer c.dropBatch()
	// The group parsed last is handed to a worker by serve, once it has
	// decided whether the client ended without NBD_CMD_DISC.
	var hb [requestHeaderLen]byte
	for {
		if !c.requestBuffered() {
			// One request per wait looks like queue depth 1. Over TLS,
			// not while requests are in flight (grouped or with the
			// workers; counted before the group is handed over): a
			// client at depth whose requests each come in a record of
			// their own (libnbd's) is often read one request per wait,
			// and a wait in poll(2) then blocked the reader while the
			// workers served and sent (docs/bench/tls.md, "Follow-up:
			// queue depth 32 and large writes over TLS").
			atDepth := c.burst > 1 || (c.sess.encrypted() && c.inflight.Load() > 0)
			// About to wait for the client: hand over the requests
			// parsed and send what is ready first.
			if err := c.flushBatch(); err != nil {
				return err
			}
			if c.fr != nil {
				c.fr.noPoll = atDepth
			}
			c.burst = 0
		}
		c.burst++
		var err error
		if c.spliced && c.fr != nil && c.r.Buffered() == 0 {
			// Large writes are streaming in: read only the next
			// header, so that the buffer does not take part of the
			// next payload, which splice can move whole.
			_, err = io.ReadFull(c.fr, hb[:])
		} else {
			_, err = io.ReadFull(c.r, hb[:])
		}
		c.spliced = false
		if err != nil {
			return err
		}
		req, err := parseRequest(hb[:])
		if err != nil {
			return fmt.Errorf("%w: bad request magic", ErrProtocol)
		}
		if req.Type == CmdDisc {
			c.disc = true
			if h := c.s.testHookDisc; h != nil {
				h(c)
			}
			return c.flushBatch()
		}
		o := opPool.Get().(*op)
		o.req = req
		o.errno = c.check(req)
		if o.errno == 0 && c.e.Deadline.Passed() {
			// Arrived after the export's deadline (the lease's
			// expiry): refused whatever else happens to the export.
			o.errno = ESHUTDOWN
		}
		spliced, served := false, false
		// Not once the client's end was found on the socket: writes
		// then go to the workers, which hold them (abandon.go).
		live := !isWrite(req.Type) || c.writable()
		if req.Type == CmdWrite {
			if c.r.Buffered() < int(req.Length) {
				// Reading the payload may block.
				if err := c.flushBatch(); err != nil {
					c.freeOp(o)
					return err
				}
				// The hand-over may have waited for a worker or the
				// socket: the client may have gone meanwhile.
				live = live && c.writable()
			}
			if o.errno == 0 && live && req.Length > 0 && c.r.Buffered() < int(req.Length) {
				// A file in memory (tmpfs): the payload goes from the
				// socket (or crypto/tls) straight into its mapping
				// (mapwrite.go); o is answered.
				handled, err := c.mappedWrite(ctx, o, live)
				if err != nil {
					c.freeOp(o)
					return err
				}
				served = handled
				// As after a spliced payload, the next header is read
				// on its own (plaintext only: over TLS the socket's
				// bytes are records).
				c.spliced = handled && (c.sess == nil || !c.sess.encrypted())
			}
			if !served && o.errno == 0 && live && c.canSplice(req) {
				handled, err := c.spliceCounted(o)
				if err != nil {
					c.freeOp(o)
					return err
				}
				spliced = handled
			}
			if served {
				// Read into the mapping and answered above.
			} else if spliced {
				// Payload already in the file; o.errno is set on failure.
				c.spliced = true
			} else if o.errno != 0 || req.Length == 0 {
				// Keep the stream in sync: discard the payload.
				if _, err := io.CopyN(io.Discard, c.r, int64(req.Length)); err != nil {
					c.freeOp(o)
					return err
				}
			} else if live && c.maxGroup > 1 && c.limit == nil && req.Flags&CmdFlagFUA == 0 &&
				c.r.Buffered() >= int(req.Length) && c.e.writes.Gate() == nil {
				// A write to memory (tmpfs) whose payload is in the
				// read buffer: this goroutine writes it from there,
				// with no copy, no pooled buffer and no hand-off, and
				// sends its reply with the others it holds. The
				// payload is memcpy'd into the page cache, which costs
				// less than handing it to a worker and the reply
				// back (docs/bench/block.md, "Follow-up: 4 KiB random
				// writes at queue depth 32"). Not while the export
				// moves (a write may be held at the gate; the check
				// above races only with a gate installed at this very
				// moment, and writes are held only later, by
				// PauseWrites), nor with a rate limit (it waits) or
				// FUA (it syncs).
				readerWrites.Add(1)
				o.data, _ = c.r.Peek(int(req.Length))
				c.execute(ctx, o)
				o.data = nil
				c.r.Discard(int(req.Length))
				served = true
			} else {
				// While the export moves, the payload is counted at the
				// move's gate, which may make this reader wait first
				// (move.go).
				if err := c.reservePending(ctx, o); err != nil {
					c.freeOp(o)
					return err
				}
				if err := c.acquire(o, int64(req.Length)); err != nil {
					c.freeOp(o)
					return err
				}
				live = live && c.writable() // acquire may have waited
				o.buf = getBuf(int(req.Length))
				if err := c.readPayload(*o.buf); err != nil {
					c.freeOp(o)
					return err
				}
				if live && c.sess.tls != nil && c.maxGroup > 1 && c.limit == nil && req.Flags&CmdFlagFUA == 0 &&
					c.e.writes.Gate() == nil {
					// Over TLS this goroutine has just decrypted the
					// payload into o.buf: a write to memory (tmpfs) is
					// written from here, while the bytes are in this
					// CPU's cache, with no hand-off to a worker. Other
					// connections' readers write in parallel (nbdcopy
					// opens four); the agent's CPU per MiB written fell
					// by a tenth (docs/bench/tls.md, "Follow-up: queue
					// depth 32 and large writes over TLS"). The same
					// conditions as for writes served from the buffer,
					// above.
					tlsReaderWrites.Add(1)
					c.execute(ctx, o)
					served = true
				}
			}
		} else if req.Type == CmdRead && o.errno == 0 {
			if err := c.acquire(o, int64(req.Length)); err != nil {
				c.freeOp(o)
				return err
			}
		}
		if served {
			// executed and encoded above
		} else if o.errno != 0 {
			c.encodeError(o)
		} else if spliced {
			c.encodeOK(o)
		} else if live && c.inflight.Load() == 0 && c.r.Buffered() == 0 && !c.recordQueued() && !c.queuedBehind(o) && c.inline(o) {
			// Nothing else in flight and no request queued behind this
			// one (typical at queue depth 1): serve it here, sparing two
			// goroutine hand-offs.
			c.execute(ctx, o)
		} else if live && c.start(ctx, o) {
			// At depth, a read or write of a backend that forwards it
			// (ReadStarter, WriteStarter) is sent from here; its reply is
			// sent by the sender goroutine.
			continue
		} else {
			// At depth, add it to the group for a worker, even a read
			// the reader could serve from memory: the reader only
			// parses while the workers serve and send in parallel.
			// Serving such reads here (as this reader once did) ran a
			// whole queue depth of reads and their sends on one
			// thread, which on a busy machine got one thread's share
			// of the CPU (docs/bench/block.md, "Follow-up: queue depth
			// 32"). Handing each request to a worker of its own, and
			// each reply to a writer goroutine, cost two goroutine
			// wakeups per request; a group costs one per read of the
			// socket (docs/bench/block.md, "Follow-up: 4 KiB random
			// writes at queue depth 32").
			if c.pending == nil {
				c.pending = groupPool.Get().(*group)
			}
			*c.pending = append(*c.pending, o)
			c.inflight.Add(1)
			if len(*c.pending) >= c.maxGroup || c.e.writes.Gate() != nil {
				// While the export moves, a write may be held at
				// the gate: it must not hold the requests behind it.
				c.dispatch()
			}
			continue
		}
		// Replies served here are sent by this goroutine, batched while
		// further requests are already buffered.
		c.batch = append(c.batch, o)
		if len(c.batch) == readerBatch {
			if err := c.flushBatch(); err != nil {
				return err
			}
		}
	}
}

// start starts o, a read or a write without FUA at depth, on the backend's
// ReadStarter or WriteStarter: false means it was not started (the caller
// serves it the usual way).
func (c *conn) start(ctx context.Context, o *op) bool {
	r := o.req
	switch {
	case r.Type == CmdRead && c.rst != nil:
	case r.Type == CmdWrite && c.wst != nil && o.buf != nil && r.Flags&CmdFlagFUA == 0:
		// The payload is in o.buf; not with FUA (WriteAtFUA).
	default:
		return false
	}
	if c.limit != nil || ctx.Err() != nil || r.Length == 0 || c.nstarted.Load() >= maxQueuedReplies ||
		c.e.writes.Gate() != nil {
		// Beyond maxQueuedReplies started requests not yet sent (a
		// client that does not take its replies), requests go to the
		// workers, whose queue of replies is bounded: the reader then
		// stops. Nor while the export has a move state (execute's
		// gate).
		return false
	}
	if r.Type == CmdWrite && c.e.writes.Begin() != nil {
		return false // a move state came meanwhile
	}
	if o.buf == nil {
		o.buf = getBuf(int(r.Length))
	}
	c.inflight.Add(1)
	c.started.Add(1)
	c.nstarted.Add(1)
	o.started = true
	done := func(err error) { c.startedDone(o, err) }
	var ok bool
	if r.Type == CmdRead {
		ok = c.rst.StartReadAt(*o.buf, int64(r.Offset), done)
	} else {
		ok = c.wst.StartWriteAt(*o.buf, int64(r.Offset), done)
	}
	if ok {
		return true
	}
	o.started = false
	if r.Type == CmdWrite {
		c.e.writes.EndUntracked()
	}
	c.nstarted.Add(-1)
	c.inflight.Add(-1)
	c.started.Done()
	return false
}

// startedDone encodes the reply of o, a request started on the backend's
// ReadStarter or WriteStarter, and queues it for the sender goroutine. It
// does not block.
func (c *conn) startedDone(o *op, err error) {
	if o.req.Type == CmdWrite {
		// Counted as an untracked write since start (TrackWrites
		// waits for it).
		c.e.writes.EndUntracked()
	}
	switch {
	case err != nil:
		c.s.logger().Debug("nbd: request failed", "export", NameTag(c.e.Name), "cmd", o.req.Type, "err", err)
		o.errno = errnoOf(err)
		c.encodeError(o)
		errors.As(err, &o.watch) // as in execute
	case o.req.Type == CmdRead:
		c.encodeRead(o)
	default:
		c.encodeOK(o)
	}
	c.rmu.Lock()
	c.rq = append(c.rq, o)
	c.rmu.Unlock()
	c.inflight.Add(-1)
	select {
	case c.kick <- struct{}{}:
	default:
	}
	c.started.Done()
}

// acquire takes budget for o's payload, sending the pending batch first if
// it would have to wait (the batch holds budget too).
func (c *conn) acquire(o *op, n int64) error {
	o.held = n
	if c.bud.tryAcquire(n) {
		return nil
	}
	if err := c.flushBatch(); err != nil {
		o.held = 0
		return err
	}
	c.blockBegin()
	c.bud.acquire(n)
	c.blockEnd()
	return nil
}

// flushBatch is called before the reader may block (and by a TLS
// session's record reader before it reads the socket): the pending group
// goes to a worker, and the replies the reader has accumulated are sent
// (by this goroutine, or by a worker sending at the same time).
func (c *conn) flushBatch() error {
	c.dispatch()
	if len(c.batch) == 0 {
		return nil
	}
	c.queueReplies(c.batch, true)
	clear(c.batch)
	c.batch = c.batch[:0]
	if c.failed.Load() {
		return net.ErrClosed // serve reports the send's error
	}
	return nil
}

func (c *conn) dropBatch() {
	for i, o := range c.batch {
		c.freeOp(o)
		c.batch[i] = nil
	}
	c.batch = c.batch[:0]
}

// send writes the replies of ops with one writev.
func (c *conn) send(ops []*op) error {
	// c.iov and c.bufs live in the conn (guarded by wmu) so that sending
	// does not allocate.
	bufs := &c.bufs
	*bufs = c.iov[:0]
	corked := false
	defer func() {
		if corked {
			c.cork(false)
		}
	}()
	for _, b := range ops {
		*bufs = append(*bufs, b.hdr[:b.hlen])
		if len(b.out) > 0 {
			*bufs = append(*bufs, b.out)
		}
		if b.sfLen == 0 {
			continue
		}
		// Header (and anything before it) first, held back by the cork so
		// that it leaves in the same segment as the file data.
		if c.tcp && !corked {
			c.cork(true)
			corked = true
		}
		if _, err := writeBuffers(c.nc, bufs); err != nil {
			return err
		}
		*bufs = c.iov[:0]
		if err := c.sendfile(b); err != nil {
			return err
		}
	}
	if len(*bufs) > 0 {
		if _, err := writeBuffers(c.nc, bufs); err != nil {
			return err
		}
	}
	return nil
}

// queuedBehind reports whether requests may wait in the socket behind o
// though the reader's buffer is empty: a WRITE payload at least as large
// as that buffer is read past it, straight from the socket, so an empty
// buffer says nothing of what follows, and serving o inline would serve
// a queue of large writes one at a time (a composed volume's attach under
// nbdcopy stalled so). Then the kernel is asked (SIOCINQ).
func (c *conn) queuedBehind(o *op) bool {
	if o.req.Type != CmdWrite || int(o.req.Length) < c.r.Size() || c.sock == nil {
		return false
	}
	n := 0
	c.sock.Control(func(fd uintptr) {
		n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	})
	return n > 0
}

func (c *conn) cork(on bool) {
	v := 0
	if on {
		v = 1
	}
	c.rawc.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK, v)
	})
}

// sendfile copies an op's file range to the socket. Its reply header is
// already sent, so a failure here must end the connection (the caller
// closes it on error).
func (c *conn) sendfile(o *op) error {
	off := o.sfOff
	left := o.sfLen
	var serr error
	err := c.rawc.Write(func(fd uintptr) bool {
		for left > 0 {
			n, err := unix.Sendfile(int(fd), o.sfFD, &off, left)
			if err == unix.EINTR {
				continue
			}
			if err == unix.EAGAIN {
				return false
			}
			if err != nil {
				serr = fmt.Errorf("nbd: sendfile: %w", err)
				return true
			}
			if n == 0 {
				serr = fmt.Errorf("nbd: sendfile: %w", io.ErrUnexpectedEOF)
				return true
			}
			left -= n
		}
		return true
	})
	if err != nil {
		return err
	}
	return serr
}

// tellSent tells the ReplyWatchers of ops whether their replies were sent.
func tellSent(ops []*op, sent bool) {
	for _, o := range ops {
		if o.watch != nil {
			o.watch.ReplySent(sent)
			o.watch = nil
		}
	}
}

func (c *conn) freeOp(o *op) {
	if o.watch != nil {
		o.watch.ReplySent(false) // dropped unsent
	}
	if o.mref != nil {
		o.mref.unmapRange()
	}
	if o.sfSrc != nil {
		o.sfSrc.releaseFD()
	}
	if o.started {
		c.nstarted.Add(-1)
	}
	c.unpend(o)
	putBuf(o.buf)
	c.bud.release(o.held)
	*o = op{hdr: o.hdr, ext: o.ext[:0]}
	opPool.Put(o)
}

// check validates a request against the export; it returns an NBD errno.
func (c *conn) check(r Request) uint32 {
	const known = CmdFlagFUA | CmdFlagNoHole | CmdFlagDF | CmdFlagReqOne
	if r.Flags&^known != 0 {
		return EINVAL
	}
	end := r.Offset + uint64(r.Length)
	overflow := end < r.Offset
	aligned := r.Offset%uint64(c.min) == 0 && uint64(r.Length)%uint64(c.min) == 0
	switch r.Type {
	case CmdRead:
		if r.Flags&CmdFlagDF != 0 && !c.sess.structured {
			return EINVAL
		}
		if r.Length > c.max || overflow || end > c.size || !aligned {
			return EINVAL
		}
	case CmdWrite:
		switch {
		case c.ro:
			return EPERM
		case r.Length > c.max || !aligned:
			return EINVAL
		case overflow || end > c.size:
			return ENOSPC
		}
	case CmdFlush:
	case CmdTrim:
		switch {
		case c.ro:
			return EPERM
		case c.trim == nil || overflow || end > c.size || !aligned:
			return EINVAL
		}
	case CmdWriteZeroes:
		switch {
		case c.ro:
			return EPERM
		case !aligned:
			return EINVAL
		case overflow || end > c.size:
			return ENOSPC
		}
	case CmdBlockStatus:
		if !c.sess.meta || r.Length == 0 || overflow || end > c.size || !aligned {
			return EINVAL
		}
	default:
		return EINVAL
	}
	return 0
}

func errnoOf(err error) uint32 {
	var en syscall.Errno
	if errors.As(err, &en) {
		switch en {
		case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
			return ENOSPC
		case syscall.EPERM, syscall.EROFS, syscall.EACCES:
			return EPERM
		case syscall.ENOMEM:
			return ENOMEM
		case syscall.EINVAL:
			return EINVAL
		}
	}
	if errors.Is(err, ErrBackendClosed) {
		return ESHUTDOWN
	}
	var ne *Error
	if errors.As(err, &ne) && ne.Errno != 0 {
		return ne.Errno
	}
	return EIO
}

// execute performs o against the backend and encodes its reply.
func (c *conn) execute(ctx context.Context, o *op) {
	r := o.req
	if o.pend != nil {
		// Written (or refused) once execute returns: no longer pending
		// at the move's gate.
		defer c.unpend(o)
	}
	if ctx.Err() != nil || c.abandoned.Load() {
		// The connection is ending (its export removed, or its client
		// gone without a disconnect): requests still queued must not
		// reach the backend.
		o.errno = ESHUTDOWN
		c.encodeError(o)
		return
	}
	g, untracked, ok := c.gate(ctx, o)
	if !ok {
		return // refused by the export's move (move.go)
	}
	if g != nil {
		defer g.Leave(int64(r.Offset), int64(r.Length))
	} else if untracked {
		defer c.e.writes.EndUntracked()
	}
	if c.limit != nil && (r.Type == CmdRead || r.Type == CmdWrite || r.Type == CmdWriteZeroes || r.Type == CmdTrim) {
		n := int64(0)
		if r.Type == CmdRead || r.Type == CmdWrite {
			n = int64(r.Length)
		}
		if err := c.limit.Wait(ctx, n); err != nil {
			o.errno = ESHUTDOWN
			c.encodeError(o)
			return
		}
	}
	off := int64(r.Offset)
	n := int64(r.Length)
	fua := r.Flags&CmdFlagFUA != 0
	var err error
	switch r.Type {
	case CmdRead:
		// From a file in memory (tmpfs, ramfs), data is answered from
		// the mapping whatever the read's size: writev copies it into
		// the socket once. Large reads went out with sendfile(2), which
		// copies nothing here but hands the socket the page cache's
		// 4 KiB pages, and the client's receive of those cost it more
		// than the copy saved the server: an nbdcopy read of a
		// dedicated lease reached 0.86–1.02× nbdkit's with sendfile,
		// 1.32–1.44× from the mapping, with no more server CPU per
		// GiB (docs/bench/block.md, "Follow-up: large reads from the
		// mapping"). sendfile stays for files on disk and for ranges
		// that may hold holes (faulting a hole in allocates a page).
		if o.buf == nil && c.mapRead(o) {
			return
		}
		if c.sf != nil && c.rawc != nil && n >= sendfileMin {
			if fd, foff, ok := c.sf.sendfileRange(off, n); ok {
				o.sfFD, o.sfOff, o.sfLen, o.sfSrc = fd, foff, int(n), c.sf
				c.encodeRead(o)
				return
			}
		}
		if o.buf == nil {
			o.buf = getBuf(int(n))
		}
		var got int
		got, err = c.be.ReadAt(*o.buf, off)
		if got == int(n) {
			err = nil
		} else if err == nil {
			err = io.ErrUnexpectedEOF
		}
		if err == nil {
			c.encodeRead(o)
			return
		}
	case CmdWrite:
		if n > 0 {
			p := o.data
			if o.buf != nil {
				p = *o.buf
			}
			if fua && c.fua != nil {
				_, err = c.fua.WriteAtFUA(p, off)
				fua = false
			} else {
				_, err = c.be.WriteAt(p, off)
			}
		}
	case CmdFlush:
		err = c.be.Flush()
	case CmdTrim:
		if n > 0 {
			err = c.trim.Trim(off, n)
		}
	case CmdWriteZeroes:
		if n > 0 {
			err = c.writeZeroes(off, n, r.Flags&CmdFlagNoHole != 0)
		}
	case CmdBlockStatus:
		if err = c.blockStatus(o); err == nil {
			return
		}
	}
	if err == nil && fua && r.Type != CmdFlush {
		if c.fuaf != nil {
			err = c.fuaf.FlushFUA()
		} else {
			err = c.be.Flush()
		}
	}
	if err != nil {
		o.errno = errnoOf(err)
		c.s.logger().Debug("nbd: request failed", "export", NameTag(c.e.Name), "cmd", r.Type, "err", err)
		c.encodeError(o)
		// A report that must know whether it was told (ReplyWatcher):
		// sendQueued or freeOp tells it.
		errors.As(err, &o.watch)
		return
	}
	c.encodeOK(o)
}

func (c *conn) writeZeroes(off, n int64, noHole bool) error {
	if c.zero != nil {
		return c.zero.WriteZeroes(off, n, noHole)
	}
	for n > 0 {
		k := min(n, int64(len(zeroes)))
		if _, err := c.be.WriteAt(zeroes[:k], off); err != nil {
			return err
		}
		off += k
		n -= k
	}
	return nil
}

func (c *conn) blockStatus(o *op) error {
	r := o.req
	off, n := int64(r.Offset), int64(r.Length)
	var exts []Extent
	if c.ext != nil {
		var err error
		if exts, err = c.ext.Extents(off, n); err != nil {
			return err
		}
	}
	b := o.ext[:0]
	b = binary.BigEndian.AppendUint32(b, metaContextID)
	cnt := 0
	covered := int64(0)
	var lastFlags uint32
	for _, x := range exts {
		if x.Length <= 0 {
			continue
		}
		l := min(x.Length, n-covered)
		if l <= 0 {
			break
		}
		if cnt > 0 && x.Flags == lastFlags {
			prev := binary.BigEndian.Uint32(b[len(b)-8:])
			binary.BigEndian.PutUint32(b[len(b)-8:], prev+uint32(l))
		} else {
			if cnt == maxExtentsList || (cnt == 1 && r.Flags&CmdFlagReqOne != 0) {
				break
			}
			b = binary.BigEndian.AppendUint32(b, uint32(l))
			b = binary.BigEndian.AppendUint32(b, x.Flags)
			cnt++
			lastFlags = x.Flags
		}
		covered += l
		if covered >= n {
			break
		}
	}
	if cnt == 0 {
		b = binary.BigEndian.AppendUint32(b, uint32(n))
		b = binary.BigEndian.AppendUint32(b, 0)
	}
	o.ext = b
	o.out = b
	putChunkHeader(o.hdr[:], replyFlagDone, replyTypeBlockStatus, r.Handle, uint32(len(b)))
	o.hlen = structuredHeaderLen
	return nil
}

func (c *conn) encodeRead(o *op) {
	if ct := c.e.Counters; ct != nil {
		ct.Read.Add(int64(o.req.Length))
	}
	if c.sess.structured {
		if o.req.Length == 0 {
			putChunkHeader(o.hdr[:], replyFlagDone, replyTypeNone, o.req.Handle, 0)
			o.hlen = structuredHeaderLen
			return
		}
		putChunkHeader(o.hdr[:], replyFlagDone, replyTypeOffsetData, o.req.Handle, 8+o.req.Length)
		binary.BigEndian.PutUint64(o.hdr[structuredHeaderLen:], o.req.Offset)
		o.hlen = structuredHeaderLen + 8
	} else {
		putSimpleReply(o.hdr[:], 0, o.req.Handle)
		o.hlen = simpleReplyLen
	}
	if o.buf != nil {
		o.out = *o.buf
	}
}

func (c *conn) encodeOK(o *op) {
	if ct := c.e.Counters; ct != nil && o.req.Type == CmdWrite {
		ct.Written.Add(int64(o.req.Length))
	}
	putSimpleReply(o.hdr[:], 0, o.req.Handle)
	o.hlen = simpleReplyLen
	o.out = nil
}

func (c *conn) encodeError(o *op) {
	o.out = nil
	if c.sess.structured && (o.req.Type == CmdRead || o.req.Type == CmdBlockStatus) {
		putChunkHeader(o.hdr[:], replyFlagDone, replyTypeError, o.req.Handle, 6)
		binary.BigEndian.PutUint32(o.hdr[structuredHeaderLen:], o.errno)
		binary.BigEndian.PutUint16(o.hdr[structuredHeaderLen+4:], 0)
		o.hlen = structuredHeaderLen + 6
		return
	}
	putSimpleReply(o.hdr[:], o.errno, o.req.Handle)
	o.hlen = simpleReplyLen
}
