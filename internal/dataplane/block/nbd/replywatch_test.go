package nbd

import (
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"
)

// watchedErr is a backend's error that wants to know whether its reply
// was sent (ReplyWatcher).
type watchedErr struct{ sent chan bool }

func (e *watchedErr) Error() string       { return "watched: " + syscall.EIO.Error() }
func (e *watchedErr) Unwrap() error       { return syscall.EIO }
func (e *watchedErr) ReplySent(sent bool) { e.sent <- sent }

// heard returns what e heard, failing the test if it hears nothing.
func (e *watchedErr) heard(t *testing.T) bool {
	t.Helper()
	select {
	case sent := <-e.sent:
		return sent
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's error never heard whether its reply was sent")
		return false
	}
}

// watchedFlush fails every flush with a watchedErr; the first waits for
// hold, if set, after it has told entered.
type watchedFlush struct {
	*MemBackend
	err     *watchedErr
	entered chan struct{}
	hold    chan struct{}
	once    sync.Once
}

func (b *watchedFlush) Flush() error {
	b.once.Do(func() {
		if b.hold != nil {
			close(b.entered)
			<-b.hold
		}
	})
	return b.err
}

// TestReplyWatcher: an error a backend returns that implements
// ReplyWatcher hears true once its reply has been sent, and false when
// the connection ended before it could be.
func TestReplyWatcher(t *testing.T) {
	t.Run("sent", func(t *testing.T) {
		be := &watchedFlush{MemBackend: NewMemBackend(1 << 20), err: &watchedErr{sent: make(chan bool, 1)}}
		_, addr := startServer(t, Export{Name: "x", Backend: be})
		c := dial(t, addr, "x")
		var ne *Error
		if err := c.Flush(); !errors.As(err, &ne) || ne.Errno != EIO {
			t.Fatalf("Flush: %v, want EIO", err)
		}
		if !be.err.heard(t) {
			t.Fatal("the reply reached the client, but the backend heard it was not sent")
		}
	})
	t.Run("lost", func(t *testing.T) {
		be := &watchedFlush{MemBackend: NewMemBackend(1 << 20), err: &watchedErr{sent: make(chan bool, 1)},
			entered: make(chan struct{}), hold: make(chan struct{})}
		s, addr := startServer(t, Export{Name: "x", Backend: be})
		c := dial(t, addr, "x")
		flushed := make(chan error, 1)
		go func() { flushed <- c.Flush() }()
		<-be.entered
		removed := make(chan error, 1)
		go func() { removed <- s.RemoveExport("x") }() // ends the connection
		var ne *Error
		if err := <-flushed; err == nil || errors.As(err, &ne) {
			t.Fatalf("Flush as its connection ended: %v, want the connection's end", err)
		}
		close(be.hold)
		if be.err.heard(t) {
			t.Fatal("the backend heard that a reply was sent on a connection that had ended")
		}
		if err := <-removed; err != nil {
			t.Fatal(err)
		}
	})
}
