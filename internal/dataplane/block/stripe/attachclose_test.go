package stripe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// heldListener wraps the local export's listener so that a test decides
// whether a reply reaches its client: the server's side of an accepted
// connection can be kept open after the server closes it (hold, until
// let go), or made to fail its writes (failWrites).
type heldListener struct {
	net.Listener
	hold    chan struct{} // non-nil: the connections' Close waits until it is closed
	letOnce sync.Once
	mu      sync.Mutex
	conns   []*heldConn // in the order accepted
}

type heldConn struct {
	net.Conn
	l          *heldListener
	failWrites atomic.Bool
}

func (l *heldListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &heldConn{Conn: nc, l: l}
	l.mu.Lock()
	l.conns = append(l.conns, c)
	l.mu.Unlock()
	return c, nil
}

// let lets the held connections close.
func (l *heldListener) let() {
	if l.hold != nil {
		l.letOnce.Do(func() { close(l.hold) })
	}
}

func (l *heldListener) conn(i int) *heldConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[i]
}

func (c *heldConn) Write(p []byte) (int, error) {
	if c.failWrites.Load() {
		return 0, fmt.Errorf("held connection: %w", net.ErrClosed)
	}
	return c.Conn.Write(p)
}

func (c *heldConn) Close() error {
	if c.l.hold != nil {
		<-c.l.hold
	}
	return c.Conn.Close()
}

// serveHeld attaches a volume as cfg says (its URIs, StripeUnit,
// WriteBack; ConnsPerPart 0 is one connection per part, RequestTimeout 0
// is 10 s) and serves it through a heldListener (hold: its connections'
// Close waits for let).
func serveHeld(t *testing.T, cfg AttachConfig, hold bool) (*Attachment, *heldListener) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cfg.ConnsPerPart == 0 {
		cfg.ConnsPerPart = 1
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	vol, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	hl := &heldListener{}
	if hold {
		hl.hold = make(chan struct{})
	}
	a, err := Serve(ctx, vol, ServeConfig{WriteBack: cfg.WriteBack, wrapListener: func(ln net.Listener) net.Listener {
		hl.Listener = ln
		return hl
	}})
	if err != nil {
		vol.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		hl.let()
		a.Close()
	})
	return a, hl
}

// TestCloseCoversWriteAnsweredAsItDrops: a write its lender has answered,
// not yet counted by the volume when the attachment is closed, whose reply
// then reaches the client (its connection still open), is covered by
// Close's flush: Close waits for the writes under way before it decides
// whether to flush, so the lender flushes after the write.
func TestCloseCoversWriteAnsweredAsItDrops(t *testing.T) {
	m := newGatedMem(4 << 20)
	l := startLenderWith(t, m)
	a, hl := serveHeld(t, AttachConfig{URIs: []string{l.uri}}, true)
	p := a.vol.parts[0].dev.(*nbdPart)
	answered, release := make(chan struct{}), make(chan struct{})
	var once, rel sync.Once
	p.beforeCount = func() {
		once.Do(func() {
			close(answered)
			<-release
		})
	}
	// Release the write once Close waits for it, or (had it not waited)
	// once it has decided whether to flush.
	let := func() { rel.Do(func() { close(release) }) }
	a.vol.draining, a.vol.settled = let, let
	c := dialAttachment(t, a) // after the hooks are set: its server-side goroutines read them
	written := make(chan error, 1)
	go func() {
		_, err := c.WriteAt(pattern(4096, 5), 0)
		written <- err
	}()
	<-answered
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	werr := <-written
	hl.let()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if werr != nil {
		t.Fatalf("the write answered as the attachment closed: %v, want it acknowledged (its connection stays open)", werr)
	}
	if e := m.logged(); !slices.Equal(e, []string{"write", "flush"}) {
		t.Fatalf("the lender saw %v, want the acknowledged write, then Close's flush", e)
	}
}

// flushHeld starts a FLUSH on c and returns once it has taken a's
// failure report (rep.flushed), where it holds until release is called:
// flushed gets the FLUSH's outcome.
func flushHeld(a *Attachment, c *nbd.Client) (flushed <-chan error, release func()) {
	taken, rel := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func() {
		once.Do(func() {
			close(taken)
			<-rel
		})
	}
	a.rep.flushed.Store(&hook)
	ch := make(chan error, 1)
	go func() { ch <- c.Flush() }()
	<-taken
	return ch, func() { close(rel) }
}

// TestCloseReportsUntoldFlushReport: a FLUSH that takes a failure report
// (a write-back failure, writes a lender's restart lost) just as the
// attachment closes, whose reply then never reaches its client (the
// connection has ended), leaves the report to Close.
func TestCloseReportsUntoldFlushReport(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
	}{{"write-back failure", ErrWriteBack}, {"lost writes", ErrLostWrites}} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				a *Attachment
				c *nbd.Client
			)
			if tc.want == ErrWriteBack {
				_, a, c = failedEarlyWrite(t)
			} else {
				a, c = answeredThenRestarted(t, false)
			}
			flushed, release := flushHeld(a, c)
			closed := make(chan error, 1)
			go func() { closed <- a.Close() }()
			// The connection ends before the FLUSH has its outcome.
			var ne *nbd.Error
			if err := <-flushed; err == nil || errors.As(err, &ne) {
				t.Fatalf("FLUSH as the attachment closed: %v, want the connection's end", err)
			}
			release()
			if err := <-closed; !errors.Is(err, tc.want) {
				t.Fatalf("Close after a FLUSH's report was lost with its connection: %v, want %v", err, tc.want)
			}
		})
	}
}

// TestFlushReportsUntoldReport: a FLUSH's failure report whose reply
// could not be sent (its connection failed) is reported by the next FLUSH,
// on another connection; once that reply is sent, neither a later FLUSH
// nor Close reports it again.
func TestFlushReportsUntoldReport(t *testing.T) {
	m := newGatedMem(4 << 20)
	l := startLenderWith(t, m)
	a, hl := serveHeld(t, AttachConfig{URIs: []string{l.uri}, WriteBack: true}, false)
	c1 := dialAttachment(t, a)
	c2 := dialAttachment(t, a)
	failWriteEarly(t, m, a, c1)

	flushed, release := flushHeld(a, c1)
	hl.conn(0).failWrites.Store(true) // c1's reply cannot be sent
	release()
	var ne *nbd.Error
	if err := <-flushed; err == nil || errors.As(err, &ne) {
		t.Fatalf("FLUSH whose reply could not be sent: %v, want the connection's end", err)
	}
	if err := c2.Flush(); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
		t.Fatalf("the next FLUSH after a report was lost: %v, want EIO", err)
	}
	if err := c2.Flush(); err != nil {
		t.Fatalf("a FLUSH after the report reached a client: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close after the report reached a client: %v", err)
	}
}

// TestCloseWithWriteOnHungLender: closing while a write waits for a lender
// that never answers it returns within about the request timeout (Close
// waits for the writes under way, under a timer that closes the parts),
// and the write is not acknowledged. Close's error wraps ErrTimeout,
// unless the part connection's own request timeout (which began with the
// write, a little before Close's) failed the part first: then nothing
// acknowledged was at stake, and Close has nothing to report.
func TestCloseWithWriteOnHungLender(t *testing.T) {
	const timeout = time.Second
	m := newGatedMem(4 << 20)
	l := startLenderWith(t, m)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, ConnsPerPart: 1, RequestTimeout: timeout})
	c := dialAttachment(t, a)
	m.hold(t)
	written := make(chan error, 1)
	go func() {
		_, err := c.WriteAt(pattern(4096, 1), 0)
		written <- err
	}()
	waitFor(t, "the write to reach the lender", func() bool { return m.in.Load() == 1 })
	start := time.Now()
	err := a.Close()
	t.Logf("Close after %v: %v", time.Since(start), err)
	if d := time.Since(start); d > 10*timeout {
		t.Errorf("Close took %v with a write on a hung lender, beyond the request timeout (%v)", d, timeout)
	}
	if err := <-written; err == nil {
		t.Error("a write its lender never answered was acknowledged")
	}
	if !errors.Is(err, ErrTimeout) && (err != nil || !slices.Equal(a.vol.Failed(), []int{0})) {
		t.Errorf("Close past its deadline: %v (failed parts %v), want ErrTimeout, or nil with the part failed by its own timeout", err, a.vol.Failed())
	}
}

// TestCloseListsReportOnce: a failure report that a FLUSH takes while
// Close is under way (Close takes it too: both are observers under way
// when it is found), and whose reply then never reaches its client, is
// listed once by Close, not once as Close's own and again as the FLUSH's
// untold report.
func TestCloseListsReportOnce(t *testing.T) {
	t.Run("write-back failure", func(t *testing.T) {
		m := newGatedMem(4 << 20)
		l := startLenderWith(t, m)
		a, hl := serveHeld(t, AttachConfig{URIs: []string{l.uri}, WriteBack: true}, false)
		c := dialAttachment(t, a)
		m.fail.Store(true)
		rel := m.hold(t)
		if _, err := c.WriteAt(pattern(4096, 1), 0); err != nil {
			t.Fatalf("plain write: %v (it is acknowledged before the lender answers)", err)
		}
		waitFor(t, "the write to reach the lender", func() bool { return m.in.Load() == 1 })
		flushed := make(chan error, 1)
		go func() { flushed <- c.Flush() }()
		waitFor(t, "the FLUSH to wait for the write", func() bool { _, w := a.wb.state(); return w == 1 })
		hl.conn(0).failWrites.Store(true) // the FLUSH's reply cannot be sent
		closed := make(chan error, 1)
		go func() { closed <- a.Close() }()
		waitFor(t, "Close to wait for the write too", func() bool { _, w := a.wb.state(); return w == 2 })
		rel() // the lender fails the write: the FLUSH and Close both take the report
		<-flushed
		err := <-closed
		if n := strings.Count(fmt.Sprint(err), ErrWriteBack.Error()); n != 1 {
			t.Fatalf("Close listed the write-back failure %d times, want once: %v", n, err)
		}
	})
	t.Run("lost writes", func(t *testing.T) {
		l := startLender(t, 4<<20)
		a, hl := serveHeld(t, AttachConfig{URIs: []string{l.uri}}, false)
		p := a.vol.parts[0].dev.(*nbdPart)
		// The FLUSH holds once its part flush has succeeded, before it
		// takes the loss, until Close's own flush (which takes it too)
		// has ended.
		taken, release := make(chan struct{}), make(chan struct{})
		var first atomic.Bool
		var rel sync.Once
		p.beforeReport = func() {
			if first.CompareAndSwap(false, true) { // not sync.Once: Close's flush passes
				close(taken)
				<-release
			}
		}
		a.vol.settled = func() { rel.Do(func() { close(release) }) }
		c := dialAttachment(t, a) // after the hooks are set: its server-side goroutines read them
		if _, err := c.WriteAt(pattern(4096, 9), 0); err != nil {
			t.Fatal(err)
		}
		l.kill()
		l.restartOnSamePort(t)
		flushed := make(chan error, 1)
		go func() { flushed <- c.Flush() }()
		<-taken
		hl.conn(0).failWrites.Store(true) // the FLUSH's reply cannot be sent
		err := a.Close()
		<-flushed
		if n := strings.Count(fmt.Sprint(err), ErrLostWrites.Error()); n != 1 {
			t.Fatalf("Close listed the lost writes %d times, want once: %v", n, err)
		}
	})
	t.Run("write-back failure, two FLUSHes", func(t *testing.T) {
		m := newGatedMem(4 << 20)
		l := startLenderWith(t, m)
		a, hl := serveHeld(t, AttachConfig{URIs: []string{l.uri}, WriteBack: true}, false)
		c1, c2 := dialAttachment(t, a), dialAttachment(t, a)
		m.fail.Store(true)
		rel := m.hold(t)
		if _, err := c1.WriteAt(pattern(4096, 1), 0); err != nil {
			t.Fatalf("plain write: %v (it is acknowledged before the lender answers)", err)
		}
		waitFor(t, "the write to reach the lender", func() bool { return m.in.Load() == 1 })
		flushed := make(chan error, 2)
		for _, c := range []*nbd.Client{c1, c2} {
			go func() { flushed <- c.Flush() }()
		}
		waitFor(t, "both FLUSHes to wait for the write", func() bool { _, w := a.wb.state(); return w == 2 })
		hl.conn(0).failWrites.Store(true) // neither reply can be sent
		hl.conn(1).failWrites.Store(true)
		rel() // both take the report
		<-flushed
		<-flushed
		err := a.Close()
		if n := strings.Count(fmt.Sprint(err), ErrWriteBack.Error()); n != 1 {
			t.Fatalf("Close listed the write-back failure %d times, want once: %v", n, err)
		}
	})
	// Close's own flush, through a part's pool: the connection that
	// flushes for all finds the loss, then (having reconnected) every
	// connection flushes for itself, that one again.
	t.Run("lost writes, pooled", func(t *testing.T) {
		l := startLender(t, 4<<20)
		a := attach(t, AttachConfig{URIs: []string{l.uri}, ConnsPerPart: 2, RequestTimeout: 10 * time.Second})
		c := dialAttachment(t, a)
		if _, err := c.WriteAt(pattern(4096, 9), 0); err != nil {
			t.Fatal(err)
		}
		l.kill()
		l.restartOnSamePort(t)
		err := a.Close()
		if n := strings.Count(fmt.Sprint(err), ErrLostWrites.Error()); n != 1 {
			t.Fatalf("Close listed the lost writes %d times, want once: %v", n, err)
		}
	})
}

// TestCloseDeadlineAcknowledgesNothingUncovered: a write its lender has
// answered, whose count (and reply) comes only once Close's deadline (the
// request timeout) has passed and closed the parts, when Close's flush
// can no longer cover it, is not acknowledged to its client (whose
// connection is still open); Close's error wraps ErrTimeout.
func TestCloseDeadlineAcknowledgesNothingUncovered(t *testing.T) {
	const timeout = time.Second
	m := newGatedMem(4 << 20)
	l := startLenderWith(t, m)
	a, hl := serveHeld(t, AttachConfig{URIs: []string{l.uri}, RequestTimeout: timeout}, true)
	p := a.vol.parts[0].dev.(*nbdPart)
	answered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.beforeCount = func() {
		once.Do(func() {
			close(answered)
			<-release
		})
	}
	c := dialAttachment(t, a) // after the hook is set: its server-side goroutines read it
	written := make(chan error, 1)
	go func() {
		_, err := c.WriteAt(pattern(4096, 5), 0)
		written <- err
	}()
	<-answered
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	waitFor(t, "Close's deadline to close the parts", a.vol.closed.Load)
	close(release)
	werr := <-written
	hl.let()
	cerr := <-closed
	t.Logf("write: %v; Close: %v", werr, cerr)
	if werr == nil {
		t.Errorf("a write counted after Close's deadline was acknowledged; the lender saw %v", m.logged())
	}
	if !errors.Is(cerr, ErrTimeout) {
		t.Errorf("Close past its deadline: %v, want ErrTimeout", cerr)
	}
}

// TestCloseDeadlineNamesUnflushedWrites: when Close's deadline passes
// while it waits for a write to one part (its connection broke, and the
// redial cannot get through), the parts are closed unflushed; a write
// acknowledged earlier on the other part, which no flush covered, is
// named in Close's error (ErrUnflushed), which wraps ErrTimeout.
func TestCloseDeadlineNamesUnflushedWrites(t *testing.T) {
	const timeout, unit = time.Second, 64 << 10
	l0, m1 := startLender(t, 4<<20), newGatedMem(4<<20)
	l1 := startLenderWith(t, m1)
	bh := newBlackhole(t, l0.ln.Addr().String())
	u0, _ := nbd.ParseURI(l0.uri)
	u0.Address = bh.ln.Addr().String()
	// The redial outlasts Close's deadline: nothing but Close's timer
	// ends the write.
	a := attach(t, AttachConfig{URIs: []string{u0.String(), l1.uri}, StripeUnit: unit, ConnsPerPart: 1,
		RequestTimeout: timeout, RedialTimeout: 20 * time.Second})
	c := dialAttachment(t, a)
	if _, err := c.WriteAt(pattern(4096, 1), unit); err != nil { // part 1
		t.Fatal(err)
	}
	bh.freeze()
	bh.mu.Lock() // the path to part 0's lender drops its connection
	for _, nc := range bh.conns {
		nc.Close()
	}
	bh.mu.Unlock()
	written := make(chan error, 1)
	go func() {
		_, err := c.WriteAt(pattern(4096, 2), 0) // part 0: redialled through the frozen path
		written <- err
	}()
	waitFor(t, "the write's redial to reach the frozen path", func() bool {
		bh.mu.Lock()
		defer bh.mu.Unlock()
		return len(bh.conns) > 2
	})
	err := a.Close()
	t.Logf("Close: %v", err)
	if e := m1.logged(); !slices.Equal(e, []string{"write"}) {
		t.Fatalf("part 1's lender saw %v, want the write alone (the deadline came first)", e)
	}
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrUnflushed) ||
		!strings.Contains(fmt.Sprint(err), "device 1 (1 requests") || strings.Contains(fmt.Sprint(err), "device 0 (") {
		t.Errorf("Close past its deadline: %v, want ErrTimeout, and ErrUnflushed naming device 1 (one write) alone", err)
	}
	if err := <-written; err == nil {
		t.Error("a write its lender never answered was acknowledged")
	}
}

// TestCloseFlushesBesideFailedPart: a part failed (its lender stopped
// answering, and a read timed out) does not keep Close from flushing the
// other part's acknowledged write; Close reports the failed part, and
// names its acknowledged write, which no flush covered (ErrUnflushed).
func TestCloseFlushesBesideFailedPart(t *testing.T) {
	const timeout, unit = time.Second, 64 << 10
	l0, m1 := startLender(t, 4<<20), newGatedMem(4<<20)
	l1 := startLenderWith(t, m1)
	bh := newBlackhole(t, l0.ln.Addr().String())
	u0, _ := nbd.ParseURI(l0.uri)
	u0.Address = bh.ln.Addr().String()
	a := attach(t, AttachConfig{URIs: []string{u0.String(), l1.uri}, StripeUnit: unit, ConnsPerPart: 1, RequestTimeout: timeout})
	c := dialAttachment(t, a)
	for _, off := range []int64{0, unit} { // parts 0 and 1
		if _, err := c.WriteAt(pattern(4096, 1), off); err != nil {
			t.Fatal(err)
		}
	}
	bh.freeze() // part 0's lender vanishes
	if _, err := c.ReadAt(make([]byte, 4096), 0); err == nil {
		t.Fatal("a read from a vanished lender succeeded")
	}
	if f := a.vol.Failed(); !slices.Equal(f, []int{0}) {
		t.Fatalf("failed parts %v, want [0]", f)
	}
	err := a.Close()
	t.Logf("Close: %v", err)
	if e := m1.logged(); !slices.Equal(e, []string{"write", "flush"}) {
		t.Errorf("part 1's lender saw %v, want its acknowledged write, then Close's flush", e)
	}
	// (Part 0's failure wraps ErrTimeout, its request's; Close's own
	// deadline did not pass.)
	if !errors.Is(err, ErrDeviceFailed) || !errors.Is(err, ErrUnflushed) || strings.Contains(fmt.Sprint(err), "did not answer within") ||
		!strings.Contains(fmt.Sprint(err), "device 0 (1 requests") || strings.Contains(fmt.Sprint(err), "device 1 (") {
		t.Errorf("Close: %v, want part 0's failure, and ErrUnflushed naming device 0 (one write) alone", err)
	}
}

// TestCloseContextAbandonsUnacknowledgedWrite: when the caller's ctx ends
// while Close waits for a write on a hung lender, the write fails,
// unacknowledged (its client, still connected, gets EIO), and Close goes
// on at once, well before the request timeout: it flushes the other part,
// which has an acknowledged write, and reports the failed write with
// ctx's error.
func TestCloseContextAbandonsUnacknowledgedWrite(t *testing.T) {
	const timeout, unit = 30 * time.Second, 64 << 10
	m0, m1 := newGatedMem(4<<20), newGatedMem(4<<20)
	l0, l1 := startLenderWith(t, m0), startLenderWith(t, m1)
	a, hl := serveHeld(t, AttachConfig{URIs: []string{l0.uri, l1.uri}, StripeUnit: unit, RequestTimeout: timeout}, true)
	c := dialAttachment(t, a)
	if _, err := c.WriteAt(pattern(4096, 1), unit); err != nil { // part 1
		t.Fatal(err)
	}
	m0.hold(t)
	written := make(chan error, 1)
	go func() {
		_, err := c.WriteAt(pattern(4096, 2), 0) // part 0, whose lender hangs
		written <- err
	}()
	waitFor(t, "the write to reach the hung lender", func() bool { return m0.in.Load() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.vol.draining = cancel // the caller gives up once Close waits for the write
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- a.CloseContext(ctx) }()
	werr := <-written // once Close has flushed and closed the parts
	d := time.Since(start)
	hl.let()
	err := <-closed
	t.Logf("write after %v: %v; Close: %v", d, werr, err)
	var ne *nbd.Error
	if !errors.As(werr, &ne) || ne.Errno != nbd.EIO {
		t.Errorf("the write abandoned by Close: %v, want EIO", werr)
	}
	if d > timeout/2 {
		t.Errorf("Close held the write on the hung lender for %v, with ctx ended at once (request timeout %v)", d, timeout)
	}
	if e := m1.logged(); !slices.Equal(e, []string{"write", "flush"}) {
		t.Errorf("the healthy part's lender saw %v, want the acknowledged write, then Close's flush", e)
	}
	if !errors.Is(err, context.Canceled) || !strings.Contains(fmt.Sprint(err), "unacknowledged: 1") || errors.Is(err, ErrTimeout) {
		t.Errorf("Close: %v, want ctx's error reporting one write failed unacknowledged (and no timeout)", err)
	}
}

// TestCloseContextKeepsAcknowledgedWrites: a ctx that has already ended
// does not make Close give up on a write acknowledged early (write-back):
// Close waits for its lender's answer (within the request timeout), then
// flushes it, and returns nil.
func TestCloseContextKeepsAcknowledgedWrites(t *testing.T) {
	m := newGatedMem(4 << 20)
	l := startLenderWith(t, m)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, RequestTimeout: 30 * time.Second, WriteBack: true})
	c := dialAttachment(t, a)
	rel := m.hold(t)
	if _, err := c.WriteAt(pattern(4096, 1), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the write to reach the lender", func() bool { return m.in.Load() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	closed := make(chan error, 1)
	go func() { closed <- a.CloseContext(ctx) }()
	waitFor(t, "Close to wait for the acknowledged write", func() bool {
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while the lender held an acknowledged write", err)
		default:
		}
		_, w := a.wb.state()
		return w == 1
	})
	rel()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if e := m.logged(); !slices.Equal(e, []string{"write", "flush"}) {
		t.Fatalf("the lender saw %v, want the acknowledged write, then Close's flush", e)
	}
}
