package accepttest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ExhaustFds lowers the process's descriptor limit to a little above the
// descriptors it has open and opens descriptors until no more can be
// (EMFILE), then closes leave of them: the next descriptors the process
// makes past those fail with EMFILE. The returned function (also run at
// the test's end) closes them and restores the limit. The limit is the
// whole process's: tests that call it must not run in parallel.
func ExhaustFds(t testing.TB, leave int) (restore func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	top := 0
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > top {
			top = n
		}
	}
	lim := syscall.Rlimit{Cur: uint64(top) + 64, Max: old.Max}
	if lim.Cur > old.Cur {
		t.Skipf("descriptor limit %d too low", old.Cur)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	var fds []int
	done := false
	restore = func() {
		if done {
			return
		}
		done = true
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(restore)
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.EMFILE) {
			break
		}
		if err != nil {
			restore()
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	for range leave {
		_ = unix.Close(fds[len(fds)-1])
		fds = fds[:len(fds)-1]
	}
	return restore
}

// DialThroughShortage serves ln with serve until the test ends (an error
// serve returns then fails the test) and dials ln with the process out of
// descriptors but the client's socket (ExhaustFds), so that the server's
// accept of the connection fails (EMFILE). It returns the connection once
// the failed accept was logged to seen (by Failures' logger, the
// server's) and descriptors are free again. serve returning during the
// shortage, or no failure logged within 10 s, fails the test.
func DialThroughShortage(t testing.TB, ln net.Listener, seen <-chan string, serve func(context.Context, net.Listener) error) net.Conn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	restore := ExhaustFds(t, 1) // the client's socket
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		restore()
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	select {
	case err := <-done:
		restore()
		done <- nil
		t.Fatalf("Serve returned, out of descriptors: %v", err)
	case <-seen: // the accept failed, and the server goes on
	case <-time.After(10 * time.Second):
		restore()
		t.Fatal("the server did not try to accept the connection")
	}
	restore()
	return nc
}

// Failures returns a logger whose records about a failed accept (the
// warning Backoff.Retry logs) are sent to the channel it returns, which
// holds one; later ones are dropped while it is full.
func Failures() (*slog.Logger, <-chan string) {
	seen := make(chan string, 1)
	return slog.New(failures{seen: seen}), seen
}

type failures struct{ seen chan<- string }

func (h failures) Enabled(context.Context, slog.Level) bool { return true }

func (h failures) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "accept") {
		select {
		case h.seen <- r.Message:
		default:
		}
	}
	return nil
}

func (h failures) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h failures) WithGroup(string) slog.Handler      { return h }
