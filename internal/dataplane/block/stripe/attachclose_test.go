package stripe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
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

// serveHeld attaches a volume over uris (one connection per part) and
// serves it through a heldListener (hold: its connections' Close waits
// for let).
func serveHeld(t *testing.T, uris []string, writeBack, hold bool) (*Attachment, *heldListener) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	vol, err := Dial(ctx, AttachConfig{URIs: uris, ConnsPerPart: 1, RequestTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	hl := &heldListener{}
	if hold {
		hl.hold = make(chan struct{})
	}
	a, err := Serve(ctx, vol, ServeConfig{WriteBack: writeBack, wrapListener: func(ln net.Listener) net.Listener {
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
	a, hl := serveHeld(t, []string{l.uri}, false, true)
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
	a, hl := serveHeld(t, []string{l.uri}, true, false)
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
// and the write is not acknowledged.
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
}
