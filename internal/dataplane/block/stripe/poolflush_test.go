package stripe

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// countingBackend counts the FLUSHes a lender serves; multiConn says
// whether it lets the server advertise multi-conn consistency.
type countingBackend struct {
	*nbd.MemBackend
	flushes   atomic.Int64
	multiConn bool
}

func (c *countingBackend) Flush() error        { c.flushes.Add(1); return c.MemBackend.Flush() }
func (c *countingBackend) MultiConnSafe() bool { return c.multiConn }

// poolOf dials n connections to l and pools them as Attach does.
func poolOf(t *testing.T, l *lender, n int) (*Pool, []*nbdPart) {
	t.Helper()
	u, err := nbd.ParseURI(l.uri)
	if err != nil {
		t.Fatal(err)
	}
	var parts []*nbdPart
	var devs []Device
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := nbd.Dial(ctx, u.Network, u.Address, u.Export)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		p := newPart(c, u, nil, nil, 0, 10*time.Second, 5*time.Second, nil, slog.New(slog.DiscardHandler))
		t.Cleanup(func() { p.Close() })
		parts = append(parts, p)
		devs = append(devs, p)
	}
	pool, err := NewPool(devs...)
	if err != nil {
		t.Fatal(err)
	}
	return pool, parts
}

// TestPoolFlushOnceWithMultiConn: against a lender that advertises
// multi-conn, a pool's flush is one FLUSH on one connection; without it,
// one per connection.
func TestPoolFlushOnceWithMultiConn(t *testing.T) {
	for _, tc := range []struct {
		multiConn bool
		want      int64
	}{{true, 1}, {false, 3}} {
		be := &countingBackend{MemBackend: nbd.NewMemBackend(1 << 20), multiConn: tc.multiConn}
		l := startLenderWith(t, be)
		pool, parts := poolOf(t, l, 3)
		for i, p := range parts { // a write completed on every connection
			if _, err := p.WriteAt([]byte{byte(i + 1)}, int64(i)*4096); err != nil {
				t.Fatal(err)
			}
		}
		for round := int64(1); round <= 2; round++ {
			if err := pool.Flush(); err != nil {
				t.Fatalf("multiconn=%v: Flush: %v", tc.multiConn, err)
			}
			if got := be.flushes.Load(); got != round*tc.want {
				t.Errorf("multiconn=%v: after %d pool flushes the lender served %d FLUSHes, want %d", tc.multiConn, round, got, round*tc.want)
			}
		}
		for i, p := range parts {
			if f, w := p.flushed.Load(), p.wseq.Load(); f != w {
				t.Errorf("multiconn=%v: connection %d: %d writes, %d flushed", tc.multiConn, i, w, f)
			}
		}
	}
}

// TestPoolFlushAfterLenderRestart: writes completed on one connection
// before the lender restarted are reported lost even when another
// connection has already reconnected to the new lender (a flush there does
// not cover them), and only then does one flush serve the pool again.
func TestPoolFlushAfterLenderRestart(t *testing.T) {
	be := &countingBackend{MemBackend: nbd.NewMemBackend(1 << 20), multiConn: true}
	l := startLenderWith(t, be)
	pool, parts := poolOf(t, l, 2)
	a, b := parts[0], parts[1]
	if _, err := b.WriteAt([]byte("unflushed"), 0); err != nil {
		t.Fatal(err)
	}
	l.kill()
	l.restart(t)
	if _, err := a.ReadAt(make([]byte, 9), 0); err != nil { // a reconnects; b does not know yet
		t.Fatalf("read after the restart: %v", err)
	}
	if err := pool.Flush(); !errors.Is(err, ErrLostWrites) {
		t.Fatalf("flush after losing b's unflushed write = %v, want ErrLostWrites", err)
	}
	if err := pool.Flush(); err != nil {
		t.Fatalf("second flush: %v", err)
	}
	if _, err := a.WriteAt([]byte("again"), 4096); err != nil {
		t.Fatal(err)
	}
	n := be.flushes.Load()
	if err := pool.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := be.flushes.Load() - n; got != 1 {
		t.Errorf("pool flush after recovering served %d FLUSHes, want 1", got)
	}
}

// TestPoolFlushReportsDeadConnectionsLoss: a connection that gave up
// redialling a restarted lender with writes no flush had covered has lost
// them; a flush that another connection, reconnected to the lender, makes
// for the pool (multi-conn) does not cover them, and reports the loss.
func TestPoolFlushReportsDeadConnectionsLoss(t *testing.T) {
	be := &countingBackend{MemBackend: nbd.NewMemBackend(1 << 20), multiConn: true}
	l := startLenderWith(t, be)
	u, err := nbd.ParseURI(l.uri)
	if err != nil {
		t.Fatal(err)
	}
	var devs []Device
	var parts []*nbdPart
	for _, redial := range []time.Duration{50 * time.Millisecond, 5 * time.Second} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := u.Dial(ctx, nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		p := newPart(c, u, nil, nil, 0, 10*time.Second, redial, nil, slog.New(slog.DiscardHandler))
		t.Cleanup(func() { p.Close() })
		parts = append(parts, p)
		devs = append(devs, p)
	}
	pool, err := NewPool(devs...)
	if err != nil {
		t.Fatal(err)
	}
	j, i := parts[0], parts[1]
	if _, err := j.WriteAt([]byte("unflushed"), 0); err != nil {
		t.Fatal(err)
	}
	l.kill()
	if _, err := j.ReadAt(make([]byte, 9), 0); err == nil || j.Alive() {
		t.Fatalf("read while the lender is down: %v, alive %v; want an error and a dead connection", err, j.Alive())
	}
	l.restartOnSamePort(t)
	if _, err := i.ReadAt(make([]byte, 9), 0); err != nil { // i reconnects
		t.Fatalf("read after the restart: %v", err)
	}
	if err := pool.Flush(); !errors.Is(err, ErrLostWrites) {
		t.Fatalf("flush after the dead connection lost its unflushed write = %v, want ErrLostWrites", err)
	}
}

// TestConcurrentFlushesReportLoss: two flushes under way when a lender
// restart lost a write no flush had covered (as from two client
// connections: each answers for the writes acknowledged before it began)
// both report the loss, whichever ends first; a flush begun after that
// does not.
func TestConcurrentFlushesReportLoss(t *testing.T) {
	l := startLender(t, 1<<20)
	_, parts := poolOf(t, l, 1)
	p := parts[0]
	if _, err := p.WriteAt([]byte("unflushed"), 0); err != nil {
		t.Fatal(err)
	}
	l.kill()
	l.restartOnSamePort(t)
	if _, err := p.ReadAt(make([]byte, 9), 0); err != nil { // reconnects: the loss is found
		t.Fatalf("read after the restart: %v", err)
	}
	var (
		started atomic.Bool
		second  error
	)
	p.beforeReport = func() {
		if started.CompareAndSwap(false, true) {
			second = p.Flush() // begins and ends while the first is under way
		}
	}
	if err := p.Flush(); !errors.Is(err, ErrLostWrites) {
		t.Errorf("the first flush = %v, want ErrLostWrites", err)
	}
	if !errors.Is(second, ErrLostWrites) {
		t.Errorf("the flush begun while the first was under way = %v, want ErrLostWrites", second)
	}
	if err := p.Flush(); err != nil {
		t.Errorf("a flush begun after the loss was reported: %v", err)
	}
}

// TestPoolFlushReportsLossFoundSinceItBegan: a pool's flush that began
// before a connection's lost writes were reported reports them too, even
// when another flush, begun later, reached that connection first and
// reported them (each answers for the writes acknowledged before it
// began).
func TestPoolFlushReportsLossFoundSinceItBegan(t *testing.T) {
	be := &countingBackend{MemBackend: nbd.NewMemBackend(1 << 20), multiConn: true}
	l := startLenderWith(t, be)
	pool, parts := poolOf(t, l, 2)
	b, a := parts[0], parts[1] // flushEach flushes b, then a
	if _, err := a.WriteAt([]byte("unflushed"), 0); err != nil {
		t.Fatal(err)
	}
	l.kill()
	l.restartOnSamePort(t)
	for _, p := range parts { // both reconnect; a finds its write lost
		if _, err := p.ReadAt(make([]byte, 9), 0); err != nil {
			t.Fatalf("read after the restart: %v", err)
		}
	}
	var (
		started bool
		later   error
	)
	b.beforeReport = func() {
		if !started { // the first flush has begun and reached b, not yet a
			started = true
			later = pool.Flush()
		}
	}
	if err := pool.Flush(); !errors.Is(err, ErrLostWrites) {
		t.Errorf("the flush begun first = %v, want ErrLostWrites", err)
	}
	if !errors.Is(later, ErrLostWrites) {
		t.Errorf("the flush begun later = %v, want ErrLostWrites", later)
	}
	if err := pool.Flush(); err != nil {
		t.Errorf("a flush begun after the loss was reported: %v", err)
	}
}
