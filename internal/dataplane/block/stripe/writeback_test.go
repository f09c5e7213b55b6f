package stripe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// gatedMem is a lender's memory whose writes can be held (until the gate
// opens) or failed, and which logs what reached it, in order.
type gatedMem struct {
	*nbd.MemBackend
	mu     sync.Mutex
	gate   chan struct{} // non-nil: writes wait until it is closed
	fgate  chan struct{} // non-nil: flushes wait until it is closed
	fail   atomic.Bool   // writes, zeroings and trims fail with EIO
	in     atomic.Int32  // writes that reached the backend
	events []string
}

func newGatedMem(size int64) *gatedMem { return &gatedMem{MemBackend: nbd.NewMemBackend(size)} }

func (g *gatedMem) log(e string) {
	g.mu.Lock()
	g.events = append(g.events, e)
	g.mu.Unlock()
}

func (g *gatedMem) logged() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.events...)
}

// hold makes writes wait until the returned function is called (once;
// also at cleanup, so that the lender can stop).
func (g *gatedMem) hold(t *testing.T) (release func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.gate = ch
	g.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			g.mu.Lock()
			g.gate = nil
			g.mu.Unlock()
			close(ch)
		})
	}
	t.Cleanup(release)
	return release
}

func (g *gatedMem) WriteAt(p []byte, off int64) (int, error) {
	g.in.Add(1)
	g.mu.Lock()
	ch := g.gate
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
	if g.fail.Load() {
		g.log("write failed")
		return 0, syscall.EIO
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	n, err := g.MemBackend.WriteAt(p, off)
	g.events = append(g.events, "write")
	return n, err
}

// at returns a copy of n bytes at off of the lender's memory.
func (g *gatedMem) at(off, n int) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]byte(nil), g.Bytes()[off:off+n]...)
}

func (g *gatedMem) Flush() error {
	g.log("flush")
	g.mu.Lock()
	ch := g.fgate
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
	return nil
}

// holdFlushes makes flushes wait until the returned function is called
// (once; also at cleanup, so that the lender can stop).
func (g *gatedMem) holdFlushes(t *testing.T) (release func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.fgate = ch
	g.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			g.mu.Lock()
			g.fgate = nil
			g.mu.Unlock()
			close(ch)
		})
	}
	t.Cleanup(release)
	return release
}

func (g *gatedMem) WriteZeroes(off, n int64, noHole bool) error {
	if g.fail.Load() {
		return syscall.EIO
	}
	return g.MemBackend.WriteZeroes(off, n, noHole)
}

func (g *gatedMem) Trim(off, n int64) error {
	if g.fail.Load() {
		return syscall.EIO
	}
	return g.MemBackend.Trim(off, n)
}

// dialAttachment opens a client connection to a's export.
func dialAttachment(t *testing.T, a *Attachment) *nbd.Client {
	t.Helper()
	u, _ := nbd.ParseURI(a.URI())
	c, err := nbd.Dial(context.Background(), u.Network, u.Address, u.Export, nbd.WithRequestTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// restartOnSamePort serves l's export again on its address once the port
// is free (a connection of the killed server may hold it for a moment), as
// a lender process that comes back; from the test goroutine only.
func (l *lender) restartOnSamePort(t *testing.T) {
	t.Helper()
	var ln net.Listener
	waitFor(t, "the lender's port", func() bool {
		var err error
		ln, err = net.Listen("tcp", l.ln.Addr().String())
		return err == nil
	})
	l.serve(t, ln)
}

// writeBeyondBound writes 512 bytes of 0xEE at off through c while held
// writes fill a's write-back bound (held of them acknowledged early): the
// write waits for room, rel releases the lender, then the write and a
// FLUSH succeed.
func writeBeyondBound(t *testing.T, a *Attachment, c *nbd.Client, off int64, held int, rel func()) {
	t.Helper()
	last := make(chan error, 1)
	go func() {
		_, err := c.WriteAt(pattern(512, 0xEE), off)
		last <- err
	}()
	waitFor(t, "the write beyond the bound to wait", func() bool {
		k, w := a.wb.state()
		return k == held && w == 1
	})
	rel()
	if err := <-last; err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds, failing the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
}

func pattern(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

// TestWriteBackOrder: a plain write spanning two parts of a composed volume
// is acknowledged while both lenders still hold it; a read of it and a
// FLUSH (each on another connection) wait until the
// lenders have answered it, and a write overlapping it is not reordered
// before it at the lender (each part has two connections, whose requests
// the lender serves independently).
func TestWriteBackOrder(t *testing.T) {
	const part, unit = 4 << 20, 64 << 10
	mems := []*gatedMem{newGatedMem(part), newGatedMem(part), newGatedMem(part)}
	var uris []string
	for _, m := range mems {
		uris = append(uris, startLenderWith(t, m).uri)
	}
	a := attach(t, AttachConfig{URIs: uris, StripeUnit: unit, ConnsPerPart: 2, WriteBack: true})
	if a.wb == nil {
		t.Fatal("write-back is off")
	}
	c, c2, c3 := dialAttachment(t, a), dialAttachment(t, a), dialAttachment(t, a)
	if c.Flags()&nbd.FlagSendFlush == 0 {
		t.Fatal("the export does not advertise FLUSH")
	}

	// Bytes [unit-4K, unit+4K): the last 4 KiB of part 0's first unit and
	// the first 4 KiB of part 1's.
	const off = unit - 4096
	dataA := pattern(8192, 0xA1)
	rel0, rel1 := mems[0].hold(t), mems[1].hold(t)
	if _, err := c.WriteAt(dataA, off); err != nil {
		t.Fatal(err)
	}
	// Acknowledged, though neither lender has written it.
	waitFor(t, "both pieces to reach their lenders", func() bool { return mems[0].in.Load() == 1 && mems[1].in.Load() == 1 })
	if n, _ := a.wb.state(); n != 1 {
		t.Fatalf("%d writes in flight, want 1", n)
	}
	read, flushed := make(chan error, 1), make(chan error, 1)
	got := make([]byte, 8192)
	go func() {
		_, err := c2.ReadAt(got, off)
		read <- err
	}()
	go func() { flushed <- c3.Flush() }()
	waitFor(t, "the read and the flush to wait", func() bool { _, w := a.wb.state(); return w == 2 })
	for _, m := range mems {
		if e := m.logged(); len(e) != 0 {
			t.Fatalf("a lender did %v while the write was held", e)
		}
	}
	rel0()
	rel1()
	if err := <-read; err != nil || !bytes.Equal(got, dataA) {
		t.Fatalf("read after an acknowledged write: %v, equal %v", err, bytes.Equal(got, dataA))
	}
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	for i, m := range mems[:2] {
		if e := m.logged(); len(e) < 2 || e[0] != "write" || e[1] != "flush" {
			t.Errorf("lender %d saw %v, want the write, then the flush", i, e)
		}
	}

	// Write after write: the second (another connection) waits for the
	// first to be answered, so the lender ends with the second's bytes.
	rel := mems[2].hold(t)
	off2 := int64(2*unit + 8192) // part 2
	if _, err := c.WriteAt(pattern(4096, 0x11), off2); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		_, err := c2.WriteAt(pattern(4096, 0x22), off2)
		second <- err
	}()
	waitFor(t, "the overlapping write to wait", func() bool { _, w := a.wb.state(); return w == 1 })
	if n := mems[2].in.Load(); n != 1 {
		t.Fatalf("%d writes reached the lender, want 1 (the overlapping one must wait)", n)
	}
	rel()
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if b := mems[2].at(8192, 4096); !bytes.Equal(b, pattern(4096, 0x22)) {
		t.Fatalf("lender holds %#x..., want the second write's 0x22", b[0])
	}
	// The two writes made while their lenders were held were acknowledged
	// early; the second overlapping one may be answered before it is
	// acknowledged (its lender runs free by then).
	if e := a.wb.early.Load(); e < 2 {
		t.Errorf("%d writes acknowledged early, want at least 2", e)
	}
}

// TestWriteBackFailure: a write that the lender fails after it was
// acknowledged fails the next FLUSH (EIO), once; FUA writes, WRITE_ZEROES
// and TRIM wait for the lender and fail themselves.
func TestWriteBackFailure(t *testing.T) {
	m := newGatedMem(4 << 20)
	l := startLenderWith(t, m)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, WriteBack: true})
	c, c2 := dialAttachment(t, a), dialAttachment(t, a)

	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	m.fail.Store(true)
	rel := m.hold(t)
	if _, err := c.WriteAt(pattern(4096, 1), 0); err != nil {
		t.Fatalf("plain write: %v (it is acknowledged before the lender answers)", err)
	}
	waitFor(t, "the write to reach the lender", func() bool { return m.in.Load() == 1 })
	rel()
	var ne *nbd.Error
	if err := c2.Flush(); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
		t.Fatalf("flush after a failed acknowledged write: %v, want EIO", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("the next flush: %v (the failure is reported once)", err)
	}

	ctx := context.Background()
	if _, err := c.WriteAtContext(ctx, pattern(4096, 2), 8192, true); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
		t.Errorf("FUA write to a failing lender: %v, want EIO", err)
	}
	if err := c.WriteZeroes(0, 4096, false); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
		t.Errorf("WRITE_ZEROES to a failing lender: %v, want EIO", err)
	}
	if err := c.Trim(0, 4096); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
		t.Errorf("TRIM to a failing lender: %v, want EIO", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("flush: %v (nothing acknowledged has failed since)", err)
	}
	m.fail.Store(false)
	if _, err := c.WriteAt(pattern(4096, 3), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if b := m.at(0, 4096); !bytes.Equal(b, pattern(4096, 3)) {
		t.Fatal("the lender lacks the flushed write")
	}
}

// TestWriteBackLenderGone: a write spanning two parts is acknowledged while
// one part's lender can no longer answer it; its connection then drops
// (no redial): the next FLUSH fails.
func TestWriteBackLenderGone(t *testing.T) {
	const part, unit = 4 << 20, 64 << 10
	l0, l1 := startLender(t, part), startLender(t, part)
	bh := newBlackhole(t, l1.ln.Addr().String())
	u1, _ := nbd.ParseURI(l1.uri)
	u1.Address = bh.ln.Addr().String()
	a := attach(t, AttachConfig{URIs: []string{l0.uri, u1.String()}, StripeUnit: unit, ConnsPerPart: 1, RedialTimeout: -1, WriteBack: true})
	c := dialAttachment(t, a)
	if _, err := c.WriteAt(pattern(8192, 7), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	bh.freeze()
	if _, err := c.WriteAt(pattern(8192, 8), unit-4096); err != nil {
		t.Fatalf("write: %v (it is acknowledged once sent)", err)
	}
	if n, _ := a.wb.state(); n != 1 {
		t.Fatalf("%d writes in flight, want 1 (part 1's lender cannot answer)", n)
	}
	// The lender's host drops the connection.
	bh.mu.Lock()
	for _, nc := range bh.conns {
		nc.Close()
	}
	bh.mu.Unlock()
	var ne *nbd.Error
	if err := c.Flush(); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
		t.Fatalf("flush after the lender dropped an acknowledged write: %v, want EIO", err)
	}
}

// TestWriteBackLostAfterAnswer: a write the lender answered and no flush
// covered, when the lender restarts, is reported lost by the next FLUSH,
// as with synchronous writes (TestLenderRestart).
func TestWriteBackLostAfterAnswer(t *testing.T) {
	const part = 4 << 20
	l := startLender(t, part)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, RequestTimeout: 10 * time.Second, WriteBack: true})
	c := dialAttachment(t, a)
	if _, err := c.WriteAt(pattern(4096, 9), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lender's answer", func() bool { n, _ := a.wb.state(); return n == 0 })
	l.kill()
	l.restartOnSamePort(t)
	var ne *nbd.Error
	if err := c.Flush(); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
		t.Fatalf("flush after a restart lost an answered write: %v, want EIO", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestWriteBackBounded: with the lender holding every write, at most
// maxEarlyWrites are acknowledged; the next write waits until the lender
// answers, and every byte arrives.
func TestWriteBackBounded(t *testing.T) {
	const size = 4 << 20
	m := newGatedMem(size)
	l := startLenderWith(t, m)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, RequestTimeout: 30 * time.Second, WriteBack: true})
	c := dialAttachment(t, a)
	rel := m.hold(t)
	for i := range maxEarlyWrites {
		if _, err := c.WriteAt(pattern(512, byte(i)), int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	writeBeyondBound(t, a, c, maxEarlyWrites*4096, maxEarlyWrites, rel)
	for i := range maxEarlyWrites + 1 {
		want := byte(i)
		if i == maxEarlyWrites {
			want = 0xEE
		}
		if !bytes.Equal(m.at(i*4096, 512), pattern(512, want)) {
			t.Fatalf("write %d missing at the lender", i)
		}
	}
}

// TestWriteBackClose: closing an attachment while acknowledged writes are
// held at the lender (`rialto detach` right after an unflushed nbdcopy)
// waits until the lender has answered them, then flushes: Close returns
// nil and the lender holds every acknowledged byte, flushed; a write after
// Close fails.
func TestWriteBackClose(t *testing.T) {
	const n = 8
	m := newGatedMem(4 << 20)
	l := startLenderWith(t, m)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, RequestTimeout: 30 * time.Second, WriteBack: true})
	c := dialAttachment(t, a)
	rel := m.hold(t)
	for i := range n {
		if _, err := c.WriteAt(pattern(4096, byte(i+1)), int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the writes to reach the lender", func() bool { return m.in.Load() >= 1 })
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	waitFor(t, "Close to wait for the writes", func() bool {
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while the lender held acknowledged writes", err)
		default:
		}
		k, w := a.wb.state()
		return k == n && w == 1
	})
	if e := m.logged(); len(e) != 0 {
		t.Fatalf("the lender did %v while it held the writes", e)
	}
	rel()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i := range n {
		if b := m.at(i*4096, 4096); !bytes.Equal(b, pattern(4096, byte(i+1))) {
			t.Fatalf("acknowledged write %d missing at the lender after Close", i)
		}
	}
	if e := m.logged(); len(e) != n+1 || e[n] != "flush" {
		t.Fatalf("the lender saw %v, want %d writes, then a flush", e, n)
	}
	if k, _ := a.wb.state(); k != 0 {
		t.Fatalf("%d writes in flight after Close", k)
	}
	if _, err := a.wb.WriteAt(pattern(4096, 1), 0); err == nil {
		t.Fatal("a write after Close succeeded")
	}
}

// TestWriteBackCloseUnanswered: closing an attachment whose lender never
// answers the acknowledged writes returns once the request timeout has
// passed, with an error wrapping ErrWriteBack: those writes may be lost.
func TestWriteBackCloseUnanswered(t *testing.T) {
	const timeout = 2 * time.Second
	m := newGatedMem(4 << 20)
	l := startLenderWith(t, m)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, RequestTimeout: timeout, WriteBack: true})
	c := dialAttachment(t, a)
	m.hold(t)
	for i := range 8 {
		if _, err := c.WriteAt(pattern(4096, byte(i+1)), int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the writes to reach the lender", func() bool { return m.in.Load() >= 1 })
	start := time.Now()
	err := a.Close()
	if !errors.Is(err, ErrWriteBack) {
		t.Fatalf("Close with acknowledged writes the lender never answered: %v, want ErrWriteBack", err)
	}
	t.Logf("Close after %v: %v", time.Since(start), err)
	if d := time.Since(start); d > 10*timeout {
		t.Errorf("Close took %v, beyond the request timeout (%v)", d, timeout)
	}
	if n, _ := a.wb.state(); n != 0 {
		t.Fatalf("%d writes in flight after Close", n)
	}
}

// failedEarlyWrite attaches a write-back volume over one lender, makes a
// plain write at 0 that is acknowledged and then failed by the lender, and
// returns with the lender healthy again and the failure not yet reported.
func failedEarlyWrite(t *testing.T) (*gatedMem, *Attachment, *nbd.Client) {
	t.Helper()
	m := newGatedMem(4 << 20)
	l := startLenderWith(t, m)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, WriteBack: true})
	c := dialAttachment(t, a)
	failWriteEarly(t, m, a, c)
	return m, a, c
}

// failWriteEarly makes a plain write at 0 through c, to a (write-back)
// whose only lender is m, that is acknowledged and then failed by the
// lender, and returns with the lender healthy again and the failure not
// yet reported.
func failWriteEarly(t *testing.T, m *gatedMem, a *Attachment, c *nbd.Client) {
	t.Helper()
	m.fail.Store(true)
	rel := m.hold(t)
	if _, err := c.WriteAt(pattern(4096, 1), 0); err != nil {
		t.Fatalf("plain write: %v (it is acknowledged before the lender answers)", err)
	}
	waitFor(t, "the write to reach the lender", func() bool { return m.in.Load() == 1 })
	rel()
	waitFor(t, "the lender's answer", func() bool { n, _ := a.wb.state(); return n == 0 })
	m.fail.Store(false)
}

// TestWriteBackFUAKeepsFailure: a FUA write after an acknowledged write
// failed at its lender is durable and succeeds, and leaves the failure to
// the next FLUSH (a FUA write is no observer of other writes' failures:
// had it taken the report, the FLUSH that the client relies on for the
// failed write would succeed).
func TestWriteBackFUAKeepsFailure(t *testing.T) {
	m, _, c := failedEarlyWrite(t)
	if _, err := c.WriteAtContext(context.Background(), pattern(4096, 2), 8192, true); err != nil {
		t.Fatalf("FUA write to a healthy lender: %v", err)
	}
	if b := m.at(8192, 4096); !bytes.Equal(b, pattern(4096, 2)) {
		t.Fatal("the lender lacks the FUA write")
	}
	var ne *nbd.Error
	if err := c.Flush(); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
		t.Fatalf("flush after a failed acknowledged write (and a FUA write): %v, want EIO", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("the next flush: %v (the failure is reported once)", err)
	}
}

// TestWriteBackBoundedBytes: with the lender holding every write, at most
// maxEarlyBytes are acknowledged (sixteen 1 MiB writes, far fewer than
// maxEarlyWrites); the next write, however small, waits until the lender
// answers, and every byte arrives.
func TestWriteBackBoundedBytes(t *testing.T) {
	const n = maxEarlyBytes / maxEarlyWrite
	m := newGatedMem((n + 1) * maxEarlyWrite)
	l := startLenderWith(t, m)
	// A connection per write: the lender takes only a write or two of
	// each connection off its socket while it holds them, and the
	// sockets' backpressure (which the bound does not replace) must not
	// stop the writes before the bound does.
	a := attach(t, AttachConfig{URIs: []string{l.uri}, ConnsPerPart: n, RequestTimeout: 30 * time.Second, WriteBack: true})
	c := dialAttachment(t, a)
	rel := m.hold(t)
	for i := range n {
		if _, err := c.WriteAt(pattern(maxEarlyWrite, byte(i+1)), int64(i)*maxEarlyWrite); err != nil {
			t.Fatal(err)
		}
	}
	writeBeyondBound(t, a, c, n*maxEarlyWrite, n, rel)
	for i := range n {
		if !bytes.Equal(m.at(i*maxEarlyWrite, maxEarlyWrite), pattern(maxEarlyWrite, byte(i+1))) {
			t.Fatalf("write %d missing at the lender", i)
		}
	}
	if !bytes.Equal(m.at(n*maxEarlyWrite, 512), pattern(512, 0xEE)) {
		t.Fatal("the last write is missing at the lender")
	}
}

// TestWriteBackConcurrentFlushes: an acknowledged write fails while two
// FLUSHes (on two client connections) wait for it: both report it; the
// next FLUSH does not.
func TestWriteBackConcurrentFlushes(t *testing.T) {
	m := newGatedMem(4 << 20)
	l := startLenderWith(t, m)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, RequestTimeout: 30 * time.Second, WriteBack: true})
	c1, c2 := dialAttachment(t, a), dialAttachment(t, a)
	m.fail.Store(true)
	rel := m.hold(t)
	if _, err := c1.WriteAt(pattern(4096, 1), 0); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for _, c := range []*nbd.Client{c1, c2} {
		go func() { errs <- c.Flush() }()
	}
	waitFor(t, "both flushes to wait for the write", func() bool { _, w := a.wb.state(); return w == 2 })
	rel()
	for range 2 {
		var ne *nbd.Error
		if err := <-errs; !errors.As(err, &ne) || ne.Errno != nbd.EIO {
			t.Fatalf("a flush under way when an acknowledged write failed: %v, want EIO", err)
		}
	}
	m.fail.Store(false)
	if err := c2.Flush(); err != nil {
		t.Fatalf("the next flush: %v (the failure is reported once)", err)
	}
}

// TestWriteBackCloseNoGoroutines: acknowledged writes are in flight when
// their lender's connections drop (their redials and retries run off the
// connections' readers) and the attachment is closed while the redials
// are under way: Close waits for them for the request timeout, then
// closes the parts and reports the writes failed; once it is closed, and
// the lender and the network path are gone, no goroutine is left.
func TestWriteBackCloseNoGoroutines(t *testing.T) {
	base := runtime.NumGoroutine()
	l := startLender(t, 4<<20)
	bh := newBlackhole(t, l.ln.Addr().String())
	u, _ := nbd.ParseURI(l.uri)
	u.Address = bh.ln.Addr().String()
	// Close waits for the writes for the request timeout, shorter than
	// the redials, then closes the parts.
	a := attach(t, AttachConfig{URIs: []string{u.String()}, RedialTimeout: 20 * time.Second, RequestTimeout: 3 * time.Second, WriteBack: true})
	c := dialAttachment(t, a)
	bh.freeze()
	for i := range 8 {
		if _, err := c.WriteAt(pattern(4096, byte(i)), int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	// The lender's host drops the connections: the writes' retries
	// redial, through the frozen path, and wait.
	bh.mu.Lock()
	for _, nc := range bh.conns {
		nc.Close()
	}
	bh.mu.Unlock()
	waitFor(t, "a redial to reach the frozen path", func() bool {
		bh.mu.Lock()
		defer bh.mu.Unlock()
		return len(bh.conns) > 4
	})
	if n, _ := a.wb.state(); n == 0 {
		t.Fatal("no write in flight while its connection is redialled")
	}
	if err := a.Close(); !errors.Is(err, ErrWriteBack) {
		t.Fatalf("Close while acknowledged writes were redialled: %v, want ErrWriteBack", err)
	}
	if n, _ := a.wb.state(); n != 0 {
		t.Fatalf("%d writes in flight after Close", n)
	}
	c.Close()
	bh.ln.Close()
	bh.mu.Lock()
	for _, nc := range bh.conns {
		nc.Close()
	}
	bh.mu.Unlock()
	bh.wg.Wait()
	l.kill()
	waitFor(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
}

// TestWriteBackFUAZeroTrimKeepFailure: WRITE_ZEROES and TRIM with FUA
// (sent by libnbd) after an acknowledged write failed at its lender
// succeed and leave the failure to the next FLUSH, as a FUA write does
// (TestWriteBackFUAKeepsFailure).
func TestWriteBackFUAZeroTrimKeepFailure(t *testing.T) {
	if exec.Command("/usr/bin/python3", "-c", "import nbd").Run() != nil {
		t.Skip("python3-libnbd is not installed")
	}
	for _, cmd := range []string{"zero", "trim"} {
		t.Run(cmd, func(t *testing.T) {
			_, a, c := failedEarlyWrite(t)
			script := "import nbd, sys\nh = nbd.NBD()\nh.connect_uri(sys.argv[1])\nh." + cmd +
				"(4096, 8192, nbd.CMD_FLAG_FUA)\nh.shutdown()\n"
			if out, err := exec.Command("/usr/bin/python3", "-c", script, a.URI()).CombinedOutput(); err != nil {
				t.Fatalf("%s with FUA to a healthy lender: %v\n%s", cmd, err, out)
			}
			var ne *nbd.Error
			if err := c.Flush(); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
				t.Fatalf("flush after a failed acknowledged write (and a FUA %s): %v, want EIO", cmd, err)
			}
		})
	}
}

// TestLostWritesFUAThenFlush: a write the lender answered and no flush
// covered, when the lender restarts, is reported lost by the next FLUSH
// even if a FUA write (whose own flush finds the loss) came first: the
// FUA write answers for itself, the FLUSH for the writes before it. With
// and without write-back.
func TestLostWritesFUAThenFlush(t *testing.T) {
	for _, wb := range []bool{false, true} {
		t.Run(fmt.Sprintf("writeback=%v", wb), func(t *testing.T) {
			_, c := answeredThenRestarted(t, wb)
			_, ferr := c.WriteAtContext(context.Background(), pattern(4096, 10), 8192, true)
			t.Logf("FUA write after the restart: %v", ferr)
			var ne *nbd.Error
			if err := c.Flush(); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
				t.Fatalf("flush after a restart lost an answered write (a FUA write came first): %v, want EIO", err)
			}
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLostWritesFUAConcurrentFlushes: a FUA write finds that a lender's
// restart lost a write while two FLUSHes (on two client connections) are
// under way, waiting for an acknowledged write on the other part: both
// report the loss, as every FLUSH under way reports a loss its own flush
// finds; the next FLUSH does not.
func TestLostWritesFUAConcurrentFlushes(t *testing.T) {
	const part, unit = 4 << 20, 64 << 10
	m0 := newGatedMem(part)
	l0, l1 := startLenderWith(t, m0), startLender(t, part)
	a := attach(t, AttachConfig{URIs: []string{l0.uri, l1.uri}, StripeUnit: unit, ConnsPerPart: 1,
		RequestTimeout: 10 * time.Second, WriteBack: true})
	c1, c2, c3 := dialAttachment(t, a), dialAttachment(t, a), dialAttachment(t, a)
	// A write to part 1 that its lender answers and no flush covers.
	if _, err := c1.WriteAt(pattern(4096, 1), unit); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lender's answer", func() bool { n, _ := a.wb.state(); return n == 0 })
	// A write to part 0, acknowledged and held: the FLUSHes wait for it.
	rel := m0.hold(t)
	if _, err := c1.WriteAt(pattern(4096, 2), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the write to reach part 0's lender", func() bool { return m0.in.Load() == 1 })
	errs := make(chan error, 2)
	for _, c := range []*nbd.Client{c1, c2} {
		go func() { errs <- c.Flush() }()
	}
	waitFor(t, "both flushes to wait for the write", func() bool { _, w := a.wb.state(); return w == 2 })
	l1.kill()
	l1.restartOnSamePort(t)
	var ne *nbd.Error
	if _, err := c3.WriteAtContext(context.Background(), pattern(4096, 3), unit+8192, true); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
		t.Fatalf("FUA write whose flush finds the loss: %v, want EIO", err)
	}
	rel()
	for range 2 {
		if err := <-errs; !errors.As(err, &ne) || ne.Errno != nbd.EIO {
			t.Fatalf("a flush under way when a FUA write found lost writes: %v, want EIO", err)
		}
	}
	if err := c3.Flush(); err != nil {
		t.Fatalf("the next flush: %v (the loss is reported once)", err)
	}
}

// TestCloseReportsLostWrites: a write the lender answered and no flush
// covered, when the lender restarts, is reported lost by Close (`rialto
// detach` with no FLUSH since), also when a FUA write's flush found the
// loss first; with and without write-back.
func TestCloseReportsLostWrites(t *testing.T) {
	for _, wb := range []bool{false, true} {
		for _, fua := range []bool{false, true} {
			t.Run(fmt.Sprintf("writeback=%v/fua=%v", wb, fua), func(t *testing.T) {
				a, c := answeredThenRestarted(t, wb)
				if fua {
					_, ferr := c.WriteAtContext(context.Background(), pattern(4096, 10), 8192, true)
					t.Logf("FUA write after the restart: %v", ferr)
				}
				if err := a.Close(); !errors.Is(err, ErrLostWrites) {
					t.Fatalf("Close after a restart lost an answered write: %v, want ErrLostWrites", err)
				}
			})
		}
	}
}

// TestVolumeShutdownFlushes: a volume used without an attachment (`rialto
// attach --fuse`, whose FUSE server writes through it) flushes the writes
// no flush covered when it shuts down, once, and not when there are none;
// after a lender's restart its Shutdown fails.
func TestVolumeShutdownFlushes(t *testing.T) {
	open := func(t *testing.T, uri string) *Volume {
		t.Helper()
		vol, err := Open(context.Background(), OpenConfig{URIs: []string{uri}, ConnsPerPart: 1, RequestTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return vol
	}
	t.Run("unflushed", func(t *testing.T) {
		m := newGatedMem(4 << 20)
		vol := open(t, startLenderWith(t, m).uri)
		if _, err := vol.WriteAt(pattern(4096, 3), 8192); err != nil {
			t.Fatal(err)
		}
		if err := vol.Shutdown(); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if e := m.logged(); len(e) != 2 || e[0] != "write" || e[1] != "flush" {
			t.Fatalf("the lender saw %v, want a write, then a flush", e)
		}
		if _, err := vol.WriteAt(pattern(4096, 3), 0); err == nil {
			t.Fatal("a write after Shutdown succeeded")
		}
	})
	t.Run("flushed", func(t *testing.T) {
		m := newGatedMem(4 << 20)
		vol := open(t, startLenderWith(t, m).uri)
		if _, err := vol.WriteAt(pattern(4096, 3), 8192); err != nil {
			t.Fatal(err)
		}
		if err := vol.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := vol.Shutdown(); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if e := m.logged(); len(e) != 2 {
			t.Fatalf("the lender saw %v, want a write and one flush", e)
		}
	})
	t.Run("lender restarted", func(t *testing.T) {
		l := startLender(t, 4<<20)
		vol := open(t, l.uri)
		if _, err := vol.WriteAt(pattern(4096, 3), 0); err != nil {
			t.Fatal(err)
		}
		l.kill()
		l.restartOnSamePort(t)
		// Open's connections do not redial: the flush fails on the
		// broken connection instead of finding the loss (ErrLostWrites).
		if err := vol.Shutdown(); err == nil {
			t.Fatal("Shutdown after the lender's restart, with a write no flush covered, returned nil")
		}
	})
}

// answeredThenRestarted attaches a volume over one lender (write-back if
// wb), writes 4 KiB at 0 through it and waits for the lender's answer,
// then kills the lender and serves its export again on the same port, as
// a lender process that restarted: the answered write, which no flush
// covered, may be lost.
func answeredThenRestarted(t *testing.T, wb bool) (*Attachment, *nbd.Client) {
	t.Helper()
	l := startLender(t, 4<<20)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, ConnsPerPart: 1, RequestTimeout: 10 * time.Second, WriteBack: wb})
	c := dialAttachment(t, a)
	if _, err := c.WriteAt(pattern(4096, 9), 0); err != nil {
		t.Fatal(err)
	}
	if wb {
		waitFor(t, "the lender's answer", func() bool { n, _ := a.wb.state(); return n == 0 })
	}
	l.kill()
	l.restartOnSamePort(t)
	return a, c
}
