package accept_test

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/accept"
	"github.com/rialto-project/rialto/internal/accept/accepttest"
)

func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&net.OpError{Op: "accept", Err: syscall.EMFILE}, true},
		{&net.OpError{Op: "accept", Err: syscall.ENFILE}, true},
		{&net.OpError{Op: "accept", Err: syscall.ENOBUFS}, true},
		{&net.OpError{Op: "accept", Err: syscall.ENOMEM}, true},
		{net.ErrClosed, false},
		{errors.New("something else"), false},
	} {
		if got := accept.Transient(tc.err); got != tc.want {
			t.Errorf("Transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	// Retry gives up at once on the others, and when ctx has ended.
	var b accept.Backoff
	if b.Retry(context.Background(), net.ErrClosed, nil) {
		t.Error("Retry after the listener closed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if b.Retry(ctx, &net.OpError{Op: "accept", Err: syscall.EMFILE}, nil) {
		t.Error("Retry with ctx ended")
	}
}

// TestLoopOutlivesDescriptorShortage: an accept loop with a Backoff goes
// on through a real EMFILE, and accepts the connection that waited in the
// backlog once descriptors are free. Not parallel: it lowers the
// process's descriptor limit.
func TestLoopOutlivesDescriptorShortage(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	failed := make(chan error, 16)
	accepted := make(chan net.Conn, 1)
	done := make(chan error, 1)
	go func() {
		var b accept.Backoff
		for {
			c, err := ln.Accept()
			if err != nil {
				select {
				case failed <- err:
				default:
				}
				if b.Retry(ctx, err, nil) {
					continue
				}
				done <- err
				return
			}
			b.Reset()
			accepted <- c
		}
	}()
	restore := accepttest.ExhaustFds(t, 1) // the client's socket
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		restore()
		t.Fatal(err)
	}
	defer nc.Close()
	select {
	case err := <-failed:
		if !errors.Is(err, syscall.EMFILE) {
			restore()
			t.Fatalf("the accept failed with %v; want EMFILE", err)
		}
	case err := <-done:
		restore()
		t.Fatalf("the loop ended: %v", err)
	case c := <-accepted:
		c.Close()
		restore()
		t.Fatal("accepted with no descriptor left")
	}
	restore()
	select {
	case c := <-accepted:
		c.Close()
	case err := <-done:
		t.Fatalf("the loop ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the connection was not accepted once descriptors were free")
	}
}
