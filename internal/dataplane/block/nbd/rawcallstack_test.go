package nbd

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

// stackRead is what readOnStack read.
type stackRead struct {
	buf [32]byte
	n   int
	err error
}

// descend calls readOnStack depth frames (small ones) below its caller.
//
//go:noinline
func descend(depth, fd int, out *stackRead) {
	if depth > 0 {
		descend(depth-1, fd, out)
		return
	}
	readOnStack(fd, out)
}

// readOnStack reads fd with rawRead into a buffer on its own stack (as
// rawSock.writev has its iovec array there) and copies it to out.
//
//go:noinline
func readOnStack(fd int, out *stackRead) {
	var buf [32]byte // does not escape
	out.n, out.err = rawRead(fd, buf[:])
	out.buf = buf
}

// TestRawCallsAcrossStackGrowth: the raw system calls take buffers on the
// caller's stack (rawSock.writev's iovec array does not escape). Wherever
// the goroutine's stack has to grow on the way to the system call, the
// kernel must read and write the buffer where it is once the stack has
// moved. An address carried as a uintptr through an ordinary Go function
// (rawCall, as it was) is not updated when the runtime copies the stack:
// the kernel then used the old, freed stack, which another goroutine may
// be using already. For writev that sent another connection's request
// (its header and payload, from the iovec array of another goroutine
// writing at the same depth) on this connection, and lost this one's:
// nbdcopy through a composed volume read back a part's write in another
// part's place and a hole where it belonged (TestNbdcopyThroughLeases).
// A read shows it without the race: the bytes land in the old stack and
// the buffer stays empty. Each depth runs on a new goroutine, so that over
// the depths the system call meets the end of the stack at every offset.
func TestRawCallsAcrossStackGrowth(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	want := []byte("0123456789abcdefghijklmnopqrstuv")
	for depth := range 2000 {
		if n, err := unix.Write(p[1], want); err != nil || n != len(want) {
			t.Fatalf("write: %d, %v", n, err)
		}
		var got stackRead
		done := make(chan struct{})
		go func() {
			defer close(done)
			descend(depth, p[0], &got)
		}()
		<-done
		if got.err != nil || got.n != len(want) {
			t.Fatalf("depth %d: read %d bytes, %v", depth, got.n, got.err)
		}
		if !bytes.Equal(got.buf[:], want) {
			t.Fatalf("depth %d: the buffer on the stack holds %q after reading %q", depth, got.buf[:], want)
		}
	}
}
