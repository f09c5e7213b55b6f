package accel

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/rialto-project/rialto/internal/accept"
)

// Target is what a Server exposes: an appliance slot, or a gateway (which
// has no memory and takes only inline tasks).
type Target interface {
	// Authenticate checks the credential of a new connection.
	Authenticate(credential []byte) error
	// Info describes the target for READY.
	Info() Info
	// WriteMem and ReadMem access the target's memory; addresses are
	// target-relative and out-of-range accesses fail with ErrOutOfRange.
	WriteMem(addr uint64, p []byte) error
	ReadMem(addr uint64, n uint32) ([]byte, error)
	// Execute runs entry on each input (one invocation when the role is a
	// batcher) and returns one output per input.
	Execute(ctx context.Context, entry string, ins [][]byte) ([][]byte, error)
}

// ResultTarget is an optional interface of a Target that may already hold
// a mailbox task's output: Result returns the output of entry on
// [addr, addr+n) of its memory, accounted as the task, when it computed it
// while the bytes landed there (an appliance streaming a LOAD into a
// role, appliance.LoadBlock) and no byte of the range changed since; ok
// false: run the task the ordinary way.
type ResultTarget interface {
	Result(entry string, addr uint64, n uint32) (out []byte, ok bool)
}

// SessionTarget is an optional interface of a Target whose credentials can
// end while connections use them (a gateway shared by several leases).
// Session replaces Authenticate: it checks the credential and returns a
// context that ends when the credential stops being accepted — the server
// then closes the connection and interrupts its tasks — and a release
// function the server calls when the connection ends. The connection's
// tasks run under a context derived from the session's, so Execute sees
// its values (say, which lease is calling).
type SessionTarget interface {
	Session(credential []byte) (ctx context.Context, release func(), err error)
}

// Server serves the accel protocol for a Target.
type Server struct {
	Target         Target
	Logger         *slog.Logger  // nil: discard
	MaxPayload     uint32        // 0: DefaultMaxPayload
	MaxOutstanding int           // tasks in flight per connection; 0: 1024
	HelloTimeout   time.Duration // 0: 10 s
	// TLS, if set, makes the server require TLS (set before Serve): a
	// connection must start with a TLS handshake, and a plaintext HELLO is
	// answered CodeTLSRequired without its credential being looked at.
	TLS *tls.Config
	// MaxTaskInput bounds the bytes of mailbox task inputs the server
	// holds copied out of the target's memory at once, over all its
	// connections (0: 2 × MaxPayload). A task reads its input only once
	// the budget has room, and holds it until it returns: a START is a few
	// dozen bytes, but its input may be the target's whole memory, so
	// without a bound a borrower's queued tasks (MaxOutstanding per
	// connection, on any number of connections) would make the server
	// hold any amount of memory. Set before Serve.
	MaxTaskInput int64
	// MaxQueuedReplies bounds the bytes of READ replies (DATA frames) the
	// server holds queued for its connections' writers, over all its
	// connections (0: 2 × MaxPayload; a READ larger than the budget takes
	// all of it). A connection's reader takes a READ's share before it
	// copies the target's memory and the writer gives it back once the
	// reply is written to the socket: a READ is 12 bytes, its reply up to
	// MaxPayload, so a client that sends READs and stops reading its
	// socket would otherwise make the server hold MaxPayload per queued
	// reply. When the budget is spent, the reader waits — it stops
	// reading the connection (back-pressure) — until written replies give
	// some back. While it waits it reads no other frame either (a CANCEL,
	// a POLL): that happens only when replies are not being taken off the
	// socket, by this client or by another connection of the same server
	// (an appliance slot's server serves one lease). Set before Serve.
	MaxQueuedReplies int64
	// MaxInlineInput bounds the bytes of INLINE task inputs one
	// connection's tasks hold at once (0: DefaultInlineInputFactor ×
	// MaxPayload; never below MaxPayload). An INLINE START carries its
	// input in the frame, up to MaxPayload, and the server holds it until
	// the task returns, so without a bound a connection's MaxOutstanding
	// tasks would hold MaxOutstanding × MaxPayload. A START whose input
	// would take the connection past it, while the connection's tasks
	// hold some, is refused with ErrInputBudget (code InputBudget); one
	// on a connection that holds none is always taken. The reader does
	// not wait for it: a CANCEL must still reach a task that holds the
	// budget. Set before Serve.
	MaxInlineInput int64

	inputOnce sync.Once
	inputs    *semaphore.Weighted
	inputCap  int64

	replyOnce sync.Once
	replies   *semaphore.Weighted
	replyCap  int64
	queued    atomic.Int64 // READ reply bytes held against the budget
	waiting   atomic.Int32 // readers waiting for the reply budget
}

// replyBudget returns the reply budget's semaphore and size.
func (s *Server) replyBudget() (*semaphore.Weighted, int64) {
	s.replyOnce.Do(func() {
		s.replyCap = s.MaxQueuedReplies
		if s.replyCap <= 0 {
			s.replyCap = 2 * int64(s.maxPayload())
		}
		s.replies = semaphore.NewWeighted(s.replyCap)
	})
	return s.replies, s.replyCap
}

// holdReply waits until a READ reply of n bytes fits the server's reply
// budget (all of it for a reply larger than the budget) and returns the
// share taken, to be given back with releaseReply; it fails when ctx ends
// first.
func (s *Server) holdReply(ctx context.Context, n int64) (int64, error) {
	sem, capacity := s.replyBudget()
	n = min(n, capacity)
	if n <= 0 {
		return 0, nil
	}
	if !sem.TryAcquire(n) {
		s.waiting.Add(1)
		err := sem.Acquire(ctx, n)
		s.waiting.Add(-1)
		if err != nil {
			return 0, err
		}
	}
	s.queued.Add(n)
	return n, nil
}

func (s *Server) releaseReply(n int64) {
	if n > 0 {
		s.queued.Add(-n)
		s.replies.Release(n)
	}
}

// ReplyBudget reports the server's READ reply budget (MaxQueuedReplies
// or its default), the bytes of it held now (replies read and not yet
// written to their sockets), and the number of connections whose reader
// waits for it.
func (s *Server) ReplyBudget() (capacity, held int64, waiting int) {
	_, capacity = s.replyBudget()
	return capacity, s.queued.Load(), int(s.waiting.Load())
}

// DefaultInlineInputFactor × MaxPayload is Server.MaxInlineInput's
// default: a few calls of the largest input each in flight on one
// connection (a gateway's workers share one connection to a slot).
const DefaultInlineInputFactor = 4

// inlineBudget is the bytes of INLINE inputs one connection's tasks may
// hold at once (MaxInlineInput).
func (s *Server) inlineBudget() int64 {
	b := s.MaxInlineInput
	if b <= 0 {
		b = DefaultInlineInputFactor * int64(s.maxPayload())
	}
	return max(b, int64(s.maxPayload()))
}

// holdInput waits until n bytes of task input fit the server's budget
// (all of it for an input larger than the budget) and returns the
// function that gives them back; it fails when ctx ends first.
func (s *Server) holdInput(ctx context.Context, n int64) (func(), error) {
	s.inputOnce.Do(func() {
		s.inputCap = s.MaxTaskInput
		if s.inputCap <= 0 {
			s.inputCap = 2 * int64(s.maxPayload())
		}
		s.inputs = semaphore.NewWeighted(s.inputCap)
	})
	n = min(n, s.inputCap)
	if n <= 0 {
		return func() {}, nil
	}
	if err := s.inputs.Acquire(ctx, n); err != nil {
		return nil, err
	}
	return func() { s.inputs.Release(n) }, nil
}

func (s *Server) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

func (s *Server) maxPayload() uint32 {
	if s.MaxPayload == 0 {
		return DefaultMaxPayload
	}
	return s.MaxPayload
}

// Serve accepts connections on ln until ctx ends or ln fails, then closes
// ln and every connection and waits for their goroutines.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	var retry accept.Backoff
	for {
		nc, err := ln.Accept()
		if err != nil {
			// A timeout, or out of descriptors or memory for now: the
			// connection waits in the backlog; the tasks served go on.
			if retry.Retry(ctx, err, s.logger()) {
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accel: accept: %w", err)
		}
		retry.Reset()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, nc)
		}()
	}
}

type taskState struct {
	done   bool
	outLen uint32
	err    error
}

type runningTask struct{ cancel context.CancelFunc }

// reply is a frame queued for the writer, with the share of the server's
// reply budget it holds (released once it is written).
type reply struct {
	b    []byte
	held int64
}

type conn struct {
	s   *Server
	nc  net.Conn
	out chan reply
	// stop ends the connection's task context; the writer calls it when
	// the socket fails, so that a reader waiting for the reply budget
	// stops waiting.
	stop  context.CancelFunc
	sem   chan struct{}
	mu    sync.Mutex
	tasks map[uint32]*taskState
	// running holds the cancel of every START still executing, by tag
	// (guarded by mu), for CANCEL.
	running map[uint32]*runningTask
	// inline counts the bytes of INLINE inputs the connection's tasks
	// hold (guarded by mu; Server.MaxInlineInput).
	inline int64
	failed chan struct{}
	once   sync.Once
}

// ServeConn serves one already-accepted connection until it ends or ctx
// ends.
func (s *Server) ServeConn(ctx context.Context, nc net.Conn) { s.serveConn(ctx, nc) }

func (s *Server) serveConn(ctx context.Context, nc net.Conn) {
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer stop()
	defer nc.Close()
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	log := s.logger().With("remote", nc.RemoteAddr().String())
	br := bufio.NewReaderSize(nc, 64<<10)
	ht := s.HelloTimeout
	if ht == 0 {
		ht = 10 * time.Second
	}
	_ = nc.SetDeadline(time.Now().Add(ht))
	if s.TLS != nil {
		b, err := br.Peek(2)
		if err != nil {
			return
		}
		if b[0] != tlsHandshakeRecord || b[1] != 3 {
			f, err := ReadFrame(br, 64<<10)
			if err == nil {
				_, _ = nc.Write(errFrame(f.Tag, ErrTLSRequired))
			}
			log.Info("accel: connection refused: plaintext on a target that requires TLS")
			return
		}
		tc := tls.Server(&bufferedConn{Conn: nc, r: br}, s.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			log.Debug("accel: TLS handshake failed", "err", err)
			return
		}
		nc = tc
		br = bufio.NewReaderSize(tc, 64<<10)
	}
	f, err := ReadFrame(br, 64<<10)
	if err != nil {
		log.Debug("accel: no hello", "err", err)
		return
	}
	_ = nc.SetDeadline(time.Time{})
	if f.Op != OpHello {
		_, _ = nc.Write(errFrame(f.Tag, fmt.Errorf("%w: first frame must be HELLO", ErrAuth)))
		return
	}
	h, err := ParseHello(f.Payload)
	if err == nil && h.Version != Version {
		err = fmt.Errorf("%w: protocol version %d, want %d", ErrFrame, h.Version, Version)
	}
	if st, ok := s.Target.(SessionTarget); ok && err == nil {
		var sctx context.Context
		var release func()
		if sctx, release, err = st.Session(h.Credential); err == nil {
			defer release()
			parent := ctx
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(sctx)
			defer cancel()
			stopP := context.AfterFunc(parent, cancel)
			defer stopP()
			stopC := context.AfterFunc(ctx, func() { _ = nc.Close() })
			defer stopC()
		}
	} else if err == nil {
		err = s.Target.Authenticate(h.Credential)
	}
	if err != nil {
		log.Info("accel: connection refused", "err", err)
		_, _ = nc.Write(errFrame(f.Tag, err))
		return
	}
	info := s.Target.Info()
	info.Version, info.MaxPayload = Version, s.maxPayload()
	if _, err := nc.Write(AppendFrame(nil, Frame{Op: OpReady, Tag: f.Tag, Payload: appendInfo(nil, info)})); err != nil {
		return
	}
	mo := s.MaxOutstanding
	if mo <= 0 {
		mo = 1024
	}
	tctx, cancel := context.WithCancel(ctx)
	c := &conn{s: s, nc: nc, out: make(chan reply, 256), stop: cancel, sem: make(chan struct{}, mo),
		tasks: map[uint32]*taskState{}, running: map[uint32]*runningTask{}, failed: make(chan struct{})}
	var wwg sync.WaitGroup
	wwg.Add(1)
	go func() {
		defer wwg.Done()
		c.writer()
	}()
	var twg sync.WaitGroup
	for {
		f, err := ReadFrame(br, s.maxPayload())
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				log.Debug("accel: read", "err", err)
				if errors.Is(err, ErrTooLarge) || errors.Is(err, ErrFrame) {
					c.send(errFrame(0, err))
				}
			}
			break
		}
		c.handle(tctx, &twg, f)
	}
	cancel()
	twg.Wait()
	close(c.out)
	wwg.Wait()
}

// tlsHandshakeRecord is the first byte of a TLS connection (a handshake
// record, then the major version 3). A plaintext connection starts with
// its HELLO frame's length, little-endian: such a length would have to be
// over 770 bytes (a credential of hundreds of bytes) to look the same.
const tlsHandshakeRecord = 0x16

// bufferedConn reads through r, which has peeked at the connection.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func errFrame(tag uint32, err error) []byte {
	p := binary.LittleEndian.AppendUint16(nil, uint16(CodeOf(err)))
	return AppendFrame(nil, Frame{Op: OpError, Tag: tag, Payload: append(p, err.Error()...)})
}

func (c *conn) send(b []byte) { c.sendHeld(b, 0) }

// sendHeld queues b, which holds held bytes of the server's reply budget:
// the writer releases them once b is written (or dropped).
func (c *conn) sendHeld(b []byte, held int64) {
	select {
	case c.out <- reply{b, held}:
	case <-c.failed:
		c.s.releaseReply(held)
	}
}

// writer coalesces queued replies into one flush, and gives their share
// of the reply budget back once they are written.
func (c *conn) writer() {
	bw := bufio.NewWriterSize(c.nc, 64<<10)
	for r := range c.out {
		held := r.held
		_, err := bw.Write(r.b)
		for err == nil && len(c.out) > 0 {
			r = <-c.out
			held += r.held
			_, err = bw.Write(r.b)
		}
		if err == nil {
			err = bw.Flush()
		}
		c.s.releaseReply(held)
		if err != nil {
			c.once.Do(func() { close(c.failed) })
			_ = c.nc.Close()
			c.stop()
			for r := range c.out {
				c.s.releaseReply(r.held)
			}
			return
		}
	}
}

func (c *conn) handle(ctx context.Context, wg *sync.WaitGroup, f Frame) {
	t := c.s.Target
	switch f.Op {
	case OpPing:
		c.send(AppendFrame(nil, Frame{Op: OpOK, Tag: f.Tag}))
	case OpWrite:
		if len(f.Payload) < 8 {
			c.send(errFrame(f.Tag, fmt.Errorf("%w: short write", ErrFrame)))
			return
		}
		if err := t.WriteMem(binary.LittleEndian.Uint64(f.Payload), f.Payload[8:]); err != nil {
			c.send(errFrame(f.Tag, err))
			return
		}
		c.send(AppendFrame(nil, Frame{Op: OpOK, Tag: f.Tag}))
	case OpRead:
		if len(f.Payload) != 12 {
			c.send(errFrame(f.Tag, fmt.Errorf("%w: read payload is 12 bytes", ErrFrame)))
			return
		}
		n := binary.LittleEndian.Uint32(f.Payload[8:])
		if n > c.s.maxPayload() {
			c.send(errFrame(f.Tag, fmt.Errorf("%w: read of %d bytes above %d", ErrTooLarge, n, c.s.maxPayload())))
			return
		}
		// Back-pressure: the reply's bytes are held against the server's
		// budget before they are copied, until the writer has sent them.
		held, err := c.s.holdReply(ctx, int64(n))
		if err != nil {
			return // the connection is ending
		}
		p, err := t.ReadMem(binary.LittleEndian.Uint64(f.Payload), n)
		if err != nil {
			c.s.releaseReply(held)
			c.send(errFrame(f.Tag, err))
			return
		}
		c.sendHeld(AppendFrame(nil, Frame{Op: OpData, Tag: f.Tag, Payload: p}), held)
	case OpStart:
		st, err := ParseStart(f.Payload, f.Flags)
		if err != nil {
			c.send(errFrame(f.Tag, err))
			return
		}
		notify := f.Flags&FlagNotify != 0
		select {
		case c.sem <- struct{}{}:
		default:
			c.send(errFrame(f.Tag, fmt.Errorf("%w (%d in flight)", ErrBusy, cap(c.sem))))
			return
		}
		// An INLINE input is held until the task returns: within the
		// connection's budget, or refused.
		var inl int64
		if f.Flags&FlagInline != 0 {
			inl = int64(len(st.Payload))
		}
		if inl > 0 {
			budget := c.s.inlineBudget()
			c.mu.Lock()
			held := c.inline
			over := held > 0 && held+inl > budget
			if !over {
				c.inline += inl
			}
			c.mu.Unlock()
			if over {
				<-c.sem
				c.send(errFrame(f.Tag, fmt.Errorf("%w: this connection's running tasks hold %d bytes of inline input, %d more would pass its %d: wait for a task to finish",
					ErrInputBudget, held, inl, budget)))
				return
			}
		}
		// A polled task's state: written only while the tag still names
		// it (a cancelled task is forgotten, and its tag may be reused
		// before its role returns).
		var ts *taskState
		if !notify {
			c.mu.Lock()
			_, dup := c.tasks[f.Tag]
			full := len(c.tasks) >= 4*cap(c.sem)
			if !dup && !full {
				ts = &taskState{}
				c.tasks[f.Tag] = ts
			}
			c.mu.Unlock()
			if dup || full {
				c.releaseInline(inl)
				<-c.sem
				c.send(errFrame(f.Tag, fmt.Errorf("%w: task tag %d in use or too many unpolled tasks", ErrBusy, f.Tag)))
				return
			}
			c.send(AppendFrame(nil, Frame{Op: OpAccepted, Tag: f.Tag}))
		}
		rctx, rcancel := context.WithCancel(ctx)
		rt := &runningTask{cancel: rcancel}
		c.mu.Lock()
		if c.running[f.Tag] == nil {
			c.running[f.Tag] = rt
		}
		c.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := c.run(rctx, f.Flags, st)
			rcancel()
			c.mu.Lock()
			if c.running[f.Tag] == rt {
				delete(c.running, f.Tag)
			}
			// The slot and the inline input are given back before the
			// completion is sent (or the polled state says done): a
			// client that has seen it may start the next task at once.
			c.inline -= inl
			c.mu.Unlock()
			<-c.sem
			if notify {
				if err != nil {
					c.send(errFrame(f.Tag, err))
					return
				}
				p := binary.LittleEndian.AppendUint32(make([]byte, 0, 4+len(out)), uint32(len(out)))
				if f.Flags&FlagInline != 0 {
					p = append(p, out...)
				}
				c.send(AppendFrame(nil, Frame{Op: OpDone, Tag: f.Tag, Payload: p}))
				return
			}
			c.mu.Lock()
			if c.tasks[f.Tag] == ts {
				ts.done, ts.outLen, ts.err = true, uint32(len(out)), err
			}
			c.mu.Unlock()
		}()
	case OpCancel:
		id, err := ParseCancel(f.Payload)
		if err != nil {
			c.send(errFrame(f.Tag, err))
			return
		}
		c.mu.Lock()
		rt := c.running[id]
		delete(c.running, id)
		delete(c.tasks, id) // a cancelled polled task is forgotten: nobody polls it
		c.mu.Unlock()
		if rt == nil {
			c.send(errFrame(f.Tag, fmt.Errorf("%w %d (not running)", ErrUnknownTask, id)))
			return
		}
		rt.cancel()
		c.send(AppendFrame(nil, Frame{Op: OpOK, Tag: f.Tag}))
	case OpLoad, OpStore:
		c.handleBlock(ctx, f)
	case OpPoll:
		if len(f.Payload) != 4 {
			c.send(errFrame(f.Tag, fmt.Errorf("%w: poll payload is 4 bytes", ErrFrame)))
			return
		}
		id := binary.LittleEndian.Uint32(f.Payload)
		c.mu.Lock()
		ts, ok := c.tasks[id]
		var st taskState
		if ok {
			st = *ts
			if ts.done {
				delete(c.tasks, id)
			}
		}
		c.mu.Unlock()
		if !ok {
			c.send(errFrame(f.Tag, fmt.Errorf("%w %d", ErrUnknownTask, id)))
			return
		}
		p := []byte{StateRunning}
		switch {
		case st.done && st.err != nil:
			p[0] = StateFailed
		case st.done:
			p[0] = StateDone
		}
		p = binary.LittleEndian.AppendUint32(p, st.outLen)
		if st.err != nil {
			p = binary.LittleEndian.AppendUint16(p, uint16(CodeOf(st.err)))
			p = append(p, st.err.Error()...)
		}
		c.send(AppendFrame(nil, Frame{Op: OpStatus, Tag: f.Tag, Payload: p}))
	default:
		c.send(errFrame(f.Tag, fmt.Errorf("%w: unexpected op %#x", ErrFrame, f.Op)))
	}
}

// releaseInline gives back n bytes of the connection's INLINE input
// budget.
func (c *conn) releaseInline(n int64) {
	if n > 0 {
		c.mu.Lock()
		c.inline -= n
		c.mu.Unlock()
	}
}

// run executes one task: the mailbox read, the role, the mailbox write.
func (c *conn) run(ctx context.Context, flags uint8, st Start) ([]byte, error) {
	t := c.s.Target
	in := st.Payload
	if rt, ok := t.(ResultTarget); ok && flags&(FlagInline|FlagBatch) == 0 {
		if out, ok := rt.Result(st.Entry, st.In, st.InLen); ok {
			return c.storeOutput(st, out)
		}
	}
	if flags&FlagInline == 0 {
		release, err := c.s.holdInput(ctx, int64(st.InLen))
		if err != nil {
			return nil, err
		}
		defer release()
		if in, err = t.ReadMem(st.In, st.InLen); err != nil {
			return nil, err
		}
	}
	items := [][]byte{in}
	if flags&FlagBatch != 0 {
		var err error
		if items, err = DecodeBatch(in); err != nil {
			return nil, err
		}
	}
	outs, err := t.Execute(ctx, st.Entry, items)
	if err != nil {
		return nil, err
	}
	if len(outs) != len(items) {
		return nil, fmt.Errorf("%w: %d outputs for %d inputs", ErrRoleFailed, len(outs), len(items))
	}
	var out []byte
	if flags&FlagBatch != 0 {
		out = EncodeBatch(outs)
	} else {
		out = outs[0]
	}
	if flags&FlagInline != 0 {
		if uint64(len(out))+4 > uint64(c.s.maxPayload()) {
			return nil, fmt.Errorf("%w: %d-byte output above the frame limit", ErrTooLarge, len(out))
		}
		return out, nil
	}
	return c.storeOutput(st, out)
}

// storeOutput writes a mailbox task's output to its buffer in memory.
func (c *conn) storeOutput(st Start, out []byte) ([]byte, error) {
	if uint64(len(out)) > uint64(st.OutCap) {
		return nil, fmt.Errorf("%w: output is %d bytes, buffer %d", ErrOutputTooSmall, len(out), st.OutCap)
	}
	if err := c.s.Target.WriteMem(st.Out, out); err != nil {
		return nil, err
	}
	return out, nil
}
