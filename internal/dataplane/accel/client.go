package accel

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/pki"
)

// Conn is a client connection to one target (a slot or a gateway).
type Conn struct {
	nc   net.Conn
	info Info
	out  chan []byte
	tag  atomic.Uint32

	mu      sync.Mutex
	pending map[uint32]chan Frame
	err     error // set once the connection has failed

	done chan struct{} // closed when the reader exits
	quit chan struct{} // closed by Close
	once sync.Once
	wg   sync.WaitGroup

	// untrack, if set (WithTrack), takes the connection off the
	// revocation list's tracker once the reader exits (mu); ended is set
	// then.
	untrack func()
	ended   bool
}

// DialOption configures Dial.
type DialOption func(*dialOptions)

type dialOptions struct {
	tls   *tls.Config
	track pki.TrackFunc
}

// WithTLS runs the connection inside a TLS session with cfg (a target that
// requires TLS: a rialto-accels:// URI; normally pki.LoadClientTLS of the
// cluster CA's certificate). An empty ServerName is the host dialled. A
// nil cfg means plaintext.
func WithTLS(cfg *tls.Config) DialOption { return func(o *dialOptions) { o.tls = cfg } }

// WithTrack hands track the TLS connection once it is established (the
// target's certificate), with the function that ends it: a revocation
// list's Tracker (pki.CRL.Tracker, pki.Roots.Tracker) ends the
// connection when a list it takes later revokes the target's
// certificate. Calls in flight and later fail with ErrClosed, wrapping
// why (pki.ErrRevoked). A connection track refuses (a list taken since
// the handshake revokes the target) fails the dial as a failed
// handshake does. A plaintext connection is not handed.
func WithTrack(track pki.TrackFunc) DialOption { return func(o *dialOptions) { o.track = track } }

// Dial connects to addr and authenticates with the lease credential.
func Dial(ctx context.Context, addr string, credential []byte, opts ...DialOption) (*Conn, error) {
	var o dialOptions
	for _, f := range opts {
		f(&o)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("accel: dial %s: %w", addr, err)
	}
	raw := nc
	if o.tls != nil {
		cfg := o.tls
		if cfg.ServerName == "" {
			cfg = cfg.Clone()
			cfg.ServerName = addr
			if host, _, err := net.SplitHostPort(addr); err == nil {
				cfg.ServerName = host
			}
		}
		hctx, cancel := ctx, context.CancelFunc(func() {})
		if _, ok := ctx.Deadline(); !ok {
			hctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		}
		tc := tls.Client(nc, cfg)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			_ = nc.Close()
			var rh tls.RecordHeaderError
			if errors.As(err, &rh) || errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("accel: TLS handshake with %s: the target does not speak TLS (its URI is rialto-accel://, not rialto-accels://): %w", addr, err)
			}
			return nil, fmt.Errorf("accel: TLS handshake with %s: %w", addr, err)
		}
		nc = tc
	}
	c, err := NewConn(ctx, nc, credential)
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	if tc, ok := nc.(*tls.Conn); ok && o.track != nil {
		untrack, err := o.track(addr, tc.ConnectionState(), func(why error) {
			c.fail(fmt.Errorf("%w: %w", ErrClosed, why))
			// Under the TLS session: nothing more is said to a target
			// whose certificate is revoked.
			_ = raw.Close()
		})
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("accel: TLS handshake with %s: %w", addr, err)
		}
		c.setUntrack(untrack)
	}
	return c, nil
}

// setUntrack makes the reader's exit call f (at once if it exited).
func (c *Conn) setUntrack(f func()) {
	c.mu.Lock()
	if !c.ended {
		c.untrack = f
		f = nil
	}
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

// NewConn runs the HELLO exchange on an established connection and returns
// the client; it owns nc from then on.
func NewConn(ctx context.Context, nc net.Conn, credential []byte) (*Conn, error) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	} else {
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	}
	if len(credential) > 0xffff {
		return nil, fmt.Errorf("%w: credential too long", ErrAuth)
	}
	p := binary.LittleEndian.AppendUint16(nil, Version)
	p = binary.LittleEndian.AppendUint16(p, uint16(len(credential)))
	p = append(p, credential...)
	if _, err := nc.Write(AppendFrame(nil, Frame{Op: OpHello, Payload: p})); err != nil {
		return nil, fmt.Errorf("accel: hello: %w", err)
	}
	br := bufio.NewReaderSize(nc, 64<<10)
	f, err := ReadFrame(br, DefaultMaxPayload)
	if err != nil {
		return nil, fmt.Errorf("accel: hello reply: %w", err)
	}
	if f.Op == OpError {
		return nil, remoteErr(f.Payload)
	}
	if f.Op != OpReady {
		return nil, fmt.Errorf("%w: hello answered by op %#x", ErrFrame, f.Op)
	}
	info, err := ParseInfo(f.Payload)
	if err != nil {
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	c := &Conn{nc: nc, info: info, out: make(chan []byte, 256), pending: map[uint32]chan Frame{},
		done: make(chan struct{}), quit: make(chan struct{})}
	c.wg.Add(2)
	go func() { defer c.wg.Done(); c.reader(br) }()
	go func() { defer c.wg.Done(); c.writer() }()
	return c, nil
}

func remoteErr(p []byte) error {
	if len(p) < 2 {
		return &RemoteError{Code: CodeInternal, Msg: "short error frame"}
	}
	return &RemoteError{Code: Code(binary.LittleEndian.Uint16(p)), Msg: string(p[2:])}
}

// Info returns what the target said about itself at HELLO.
func (c *Conn) Info() Info { return c.info }

// Close closes the connection; calls in flight fail with ErrClosed.
func (c *Conn) Close() error {
	c.once.Do(func() { close(c.quit) })
	err := c.nc.Close()
	c.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	for tag, ch := range c.pending {
		close(ch)
		delete(c.pending, tag)
	}
	c.mu.Unlock()
}

func (c *Conn) reader(br *bufio.Reader) {
	defer close(c.done)
	defer func() {
		c.mu.Lock()
		f := c.untrack
		c.untrack, c.ended = nil, true
		c.mu.Unlock()
		if f != nil {
			f()
		}
	}()
	max := c.info.MaxPayload
	if max < DefaultMaxPayload {
		max = DefaultMaxPayload
	}
	for {
		f, err := ReadFrame(br, max)
		if err != nil {
			c.fail(fmt.Errorf("%w: %v", ErrClosed, err))
			return
		}
		c.mu.Lock()
		ch := c.pending[f.Tag]
		delete(c.pending, f.Tag)
		c.mu.Unlock()
		if ch != nil {
			ch <- f // buffered 1
		}
	}
}

func (c *Conn) writer() {
	bw := bufio.NewWriterSize(c.nc, 64<<10)
	for {
		var b []byte
		select {
		case b = <-c.out:
		case <-c.done:
			return
		case <-c.quit:
			return
		}
		_, err := bw.Write(b)
		for err == nil && len(c.out) > 0 {
			_, err = bw.Write(<-c.out)
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			_ = c.nc.Close()
			return
		}
	}
}

// send registers a reply channel for a new tag and queues the frame.
func (c *Conn) send(ctx context.Context, op Op, flags uint8, payload []byte) (uint32, chan Frame, error) {
	if c.info.MaxPayload > 0 && uint64(len(payload)) > uint64(c.info.MaxPayload) {
		return 0, nil, fmt.Errorf("%w: %d-byte payload above the target's %d", ErrTooLarge, len(payload), c.info.MaxPayload)
	}
	ch := make(chan Frame, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, nil, err
	}
	tag := c.tag.Add(1)
	for c.pending[tag] != nil {
		tag = c.tag.Add(1)
	}
	c.pending[tag] = ch
	c.mu.Unlock()
	b := AppendFrame(make([]byte, 0, HeaderSize+len(payload)), Frame{Op: op, Flags: flags, Tag: tag, Payload: payload})
	select {
	case c.out <- b:
		return tag, ch, nil
	case <-ctx.Done():
		c.forget(tag)
		return 0, nil, ctx.Err()
	case <-c.done:
		return 0, nil, c.closedErr()
	case <-c.quit:
		return 0, nil, ErrClosed
	}
}

func (c *Conn) forget(tag uint32) {
	c.mu.Lock()
	delete(c.pending, tag)
	c.mu.Unlock()
}

func (c *Conn) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	return ErrClosed
}

func (c *Conn) wait(ctx context.Context, tag uint32, ch chan Frame) (Frame, error) {
	select {
	case f, ok := <-ch:
		if !ok {
			return Frame{}, c.closedErr()
		}
		if f.Op == OpError {
			return f, remoteErr(f.Payload)
		}
		return f, nil
	case <-ctx.Done():
		c.forget(tag)
		return Frame{}, ctx.Err()
	}
}

func (c *Conn) roundTrip(ctx context.Context, op Op, flags uint8, payload []byte, want Op) (Frame, error) {
	tag, ch, err := c.send(ctx, op, flags, payload)
	if err != nil {
		return Frame{}, err
	}
	f, err := c.wait(ctx, tag, ch)
	if err != nil {
		return f, err
	}
	if f.Op != want {
		return f, fmt.Errorf("%w: op %#x answered by %#x", ErrFrame, op, f.Op)
	}
	return f, nil
}

// Ping checks the connection.
func (c *Conn) Ping(ctx context.Context) error {
	_, err := c.roundTrip(ctx, OpPing, 0, nil, OpOK)
	return err
}

// WriteMem writes p into the target's memory at addr.
func (c *Conn) WriteMem(ctx context.Context, addr uint64, p []byte) error {
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+len(p)), addr)
	_, err := c.roundTrip(ctx, OpWrite, 0, append(b, p...), OpOK)
	return err
}

// ReadMem reads n bytes of the target's memory at addr.
func (c *Conn) ReadMem(ctx context.Context, addr uint64, n uint32) ([]byte, error) {
	b := binary.LittleEndian.AppendUint64(nil, addr)
	b = binary.LittleEndian.AppendUint32(b, n)
	f, err := c.roundTrip(ctx, OpRead, 0, b, OpData)
	if err != nil {
		return nil, err
	}
	if uint32(len(f.Payload)) != n {
		return nil, fmt.Errorf("%w: read %d bytes, got %d", ErrFrame, n, len(f.Payload))
	}
	return f.Payload, nil
}

// TaskSpec is a mailbox task: run Entry on InLen bytes at In, writing the
// output (at most OutCap bytes) at Out.
type TaskSpec struct {
	Entry   string
	In      uint64
	InLen   uint32
	Out     uint64
	OutCap  uint32
	Batch   bool // input and output are EncodeBatch envelopes
	Polled  bool // ask for ACCEPTED and poll instead of a pushed completion
	payload []byte
	inline  bool
}

// Task is a started task.
type Task struct {
	c      *Conn
	id     uint32
	ch     chan Frame
	polled bool
}

// ID is the task's tag on the connection.
func (t *Task) ID() uint32 { return t.id }

// Start starts a mailbox task. Unless s.Polled, the completion is pushed.
func (c *Conn) Start(ctx context.Context, s TaskSpec) (*Task, error) {
	var flags uint8
	if !s.Polled {
		flags |= FlagNotify
	}
	if s.Batch {
		flags |= FlagBatch
	}
	if s.inline {
		flags |= FlagInline
	}
	p := AppendStart(nil, Start{In: s.In, InLen: s.InLen, Out: s.Out, OutCap: s.OutCap, Entry: s.Entry, Payload: s.payload})
	tag, ch, err := c.send(ctx, OpStart, flags, p)
	if err != nil {
		return nil, err
	}
	t := &Task{c: c, id: tag, ch: ch, polled: s.Polled}
	if s.Polled {
		if _, err := c.wait(ctx, tag, ch); err != nil {
			if ctx.Err() != nil {
				c.abandon(tag)
			}
			return nil, err
		}
	}
	return t, nil
}

// Status is a polled task's state.
type Status struct {
	State  uint8
	OutLen uint32
	Err    error
}

// Poll asks for the state of a task started with Polled; a finished task
// is forgotten by the server once reported.
func (t *Task) Poll(ctx context.Context) (Status, error) {
	f, err := t.c.roundTrip(ctx, OpPoll, 0, binary.LittleEndian.AppendUint32(nil, t.id), OpStatus)
	if err != nil {
		return Status{}, err
	}
	d := dec{p: f.Payload}
	st := Status{State: d.u8(), OutLen: d.u32()}
	if err := d.err("status"); err != nil {
		return st, err
	}
	if st.State == StateFailed {
		st.Err = remoteErr(d.p)
	}
	return st, nil
}

// Wait waits for the task and returns the output length (and, for inline
// tasks, the output). Polled tasks are polled with a growing interval.
func (t *Task) Wait(ctx context.Context) (uint32, error) {
	n, _, err := t.wait(ctx)
	return n, err
}

func (t *Task) wait(ctx context.Context) (n uint32, out []byte, err error) {
	defer func() {
		// A caller that gives up (its deadline, its cancellation) stops the
		// task on the target too, so that the slot does not go on running
		// work nobody waits for.
		if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			t.c.abandon(t.id)
		}
	}()
	if !t.polled {
		f, err := t.c.wait(ctx, t.id, t.ch)
		if err != nil {
			return 0, nil, err
		}
		if f.Op != OpDone || len(f.Payload) < 4 {
			return 0, nil, fmt.Errorf("%w: completion op %#x", ErrFrame, f.Op)
		}
		return binary.LittleEndian.Uint32(f.Payload), f.Payload[4:], nil
	}
	backoff := 20 * time.Microsecond
	for {
		st, err := t.Poll(ctx)
		if err != nil {
			return 0, nil, err
		}
		switch st.State {
		case StateDone:
			return st.OutLen, nil, nil
		case StateFailed:
			return 0, nil, st.Err
		}
		tm := time.NewTimer(backoff)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return 0, nil, ctx.Err()
		}
		backoff = min(2*backoff, 5*time.Millisecond)
	}
}

// Cancel stops the task on the target: it fails there with code Canceled
// (a pushed ERROR, or a failed STATUS). It returns nil if the task was
// running, an error matching ErrUnknownTask if it had already finished.
func (t *Task) Cancel(ctx context.Context) error {
	_, err := t.c.roundTrip(ctx, OpCancel, 0, AppendCancel(nil, t.id), OpOK)
	return err
}

// abandonTimeout bounds how long abandon waits to queue its CANCEL behind
// the connection's other frames.
const abandonTimeout = 5 * time.Second

// abandon sends CANCEL for task id without waiting for the answer: the
// caller has already given up on it.
func (c *Conn) abandon(id uint32) {
	c.forget(id)
	ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
	defer cancel()
	if tag, _, err := c.send(ctx, OpCancel, 0, AppendCancel(nil, id)); err == nil {
		c.forget(tag)
	}
}

// Call runs entry on in and returns the output in one round trip (an
// inline task: the input travels in START, the output in DONE).
func (c *Conn) Call(ctx context.Context, entry string, in []byte) ([]byte, error) {
	t, err := c.Start(ctx, TaskSpec{Entry: entry, payload: in, inline: true})
	if err != nil {
		return nil, err
	}
	_, out, err := t.wait(ctx)
	return out, err
}

// CallBatch runs entry on every input in one invocation (one round trip).
func (c *Conn) CallBatch(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	t, err := c.Start(ctx, TaskSpec{Entry: entry, payload: EncodeBatch(ins), inline: true, Batch: true})
	if err != nil {
		return nil, err
	}
	_, out, err := t.wait(ctx)
	if err != nil {
		return nil, err
	}
	outs, err := DecodeBatch(out)
	if err != nil {
		return nil, err
	}
	if len(outs) != len(ins) {
		return nil, fmt.Errorf("%w: %d outputs for %d inputs", ErrFrame, len(outs), len(ins))
	}
	return outs, nil
}

// CallBatchSettled is CallBatch for a caller that dispatches work to the
// target and counts it free once a call returns (a gateway in front of its
// slots): when ctx ends, it cancels the task on the target (CANCEL) and
// waits, for at most settle, until the target has ended it — its ERROR
// (Canceled) or, for a role with no cancellation point, its DONE once the
// batch ran to its end — and then returns ctx's error. CallBatch returns
// at once instead, while the target may still be running the batch.
func (c *Conn) CallBatchSettled(ctx context.Context, entry string, ins [][]byte, settle time.Duration) ([][]byte, error) {
	t, err := c.Start(ctx, TaskSpec{Entry: entry, payload: EncodeBatch(ins), inline: true, Batch: true})
	if err != nil {
		return nil, err
	}
	var f Frame
	select {
	case fr, ok := <-t.ch:
		if !ok {
			return nil, c.closedErr()
		}
		f = fr
	case <-ctx.Done():
		c.settle(t.id, t.ch, settle)
		return nil, ctx.Err()
	}
	if f.Op == OpError {
		return nil, remoteErr(f.Payload)
	}
	if f.Op != OpDone || len(f.Payload) < 4 {
		return nil, fmt.Errorf("%w: completion op %#x", ErrFrame, f.Op)
	}
	outs, err := DecodeBatch(f.Payload[4:])
	if err != nil {
		return nil, err
	}
	if len(outs) != len(ins) {
		return nil, fmt.Errorf("%w: %d outputs for %d inputs", ErrFrame, len(outs), len(ins))
	}
	return outs, nil
}

// settle cancels task id on the target and waits, for at most d, for its
// final frame on ch (or the connection's end).
func (c *Conn) settle(id uint32, ch chan Frame, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	defer c.forget(id)
	if tag, _, err := c.send(ctx, OpCancel, 0, AppendCancel(nil, id)); err == nil {
		defer c.forget(tag)
	}
	select {
	case <-ch:
	case <-ctx.Done():
	case <-c.done:
	}
}

// Mailbox runs one mailbox round through slot memory with pipelining:
// WRITE and START travel together (the server handles a connection's frames
// in order), then the output is READ once DONE arrives — two round trips
// instead of four. The output is at most outCap bytes. If the WRITE fails
// the task still runs (on whatever the memory held) but its output is not
// read and the WRITE's error is returned.
func (c *Conn) Mailbox(ctx context.Context, entry string, in []byte, inAddr, outAddr uint64, outCap uint32) ([]byte, error) {
	wp := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+len(in)), inAddr)
	wtag, wch, err := c.send(ctx, OpWrite, 0, append(wp, in...))
	if err != nil {
		return nil, err
	}
	sp := AppendStart(nil, Start{In: inAddr, InLen: uint32(len(in)), Out: outAddr, OutCap: outCap, Entry: entry})
	stag, sch, err := c.send(ctx, OpStart, FlagNotify, sp)
	if err != nil {
		c.forget(wtag)
		return nil, err
	}
	if _, err := c.wait(ctx, wtag, wch); err != nil {
		c.forget(stag)
		return nil, err
	}
	t := &Task{c: c, id: stag, ch: sch}
	n, err := t.Wait(ctx)
	if err != nil {
		return nil, err
	}
	return c.ReadMem(ctx, outAddr, n)
}
