package letgo

import (
	"errors"
	"net"
	"os"
	"testing"

	"github.com/rialto-project/rialto/internal/sharertest"
	"golang.org/x/sys/unix"
)

// shared starts a child process (cat) given a copy of ln's socket, as a
// child that any goroutine forks has one until its exec; it ends with the
// test.
func shared(t *testing.T, ln net.Listener) {
	t.Helper()
	f, err := ln.(interface{ File() (*os.File, error) }).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sharertest.Share(t, f)
	// Start took f's descriptor out of non-blocking mode (File.Fd), and
	// with it the listener's, whose open file description it shares: an
	// Accept would block in accept(2), and Close wait for it. A child
	// forked by another goroutine changes nothing: back as it was.
	if err := unix.SetNonblock(int(f.Fd()), true); err != nil {
		t.Fatal(err)
	}
}

// TestPortLetGoWhileAChildSharesIt: the port of a listener closed while a
// child process shares its socket is bound again at once, and an Accept
// under way returns net.ErrClosed. A closed net.Listen listener's port
// stayed in use (EADDRINUSE) until the child let go.
func TestPortLetGoWhileAChildSharesIt(t *testing.T) {
	ln, err := Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	shared(t, ln)
	accepted := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		accepted <- err
	}()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept under way at Close: %v, want net.ErrClosed", err)
	}
	again, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the port of a listener closed while a child shares it: %v", err)
	}
	again.Close()
}
