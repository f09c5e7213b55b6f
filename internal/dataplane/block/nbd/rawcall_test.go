package nbd

import (
	"bytes"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sockPair returns the two ends of a Unix stream socket pair, both
// non-blocking, with small send and receive buffers so that short writes
// come quickly. The caller closes them.
func sockPair(t *testing.T) (a, b int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4096)
	}
	return fds[0], fds[1]
}

// TestRawCalls: the raw helpers against a real socket: EAGAIN when there
// is nothing to read or no room, short writes reported as such, the end of
// the stream as 0 bytes, a closed peer as EPIPE, a closed descriptor as
// EBADF, and pollNow's readiness.
func TestRawCalls(t *testing.T) {
	a, b := sockPair(t)
	defer unix.Close(a)
	buf := make([]byte, 64)

	if pollNow(a, unix.POLLIN) {
		t.Fatal("pollNow: empty socket readable")
	}
	if !pollNow(a, unix.POLLOUT) {
		t.Fatal("pollNow: empty socket not writable")
	}
	if n, err := rawRead(a, buf); err != unix.EAGAIN || n != 0 {
		t.Fatalf("rawRead on an empty socket = %d, %v; want 0, EAGAIN", n, err)
	}
	if n, err := rawRead(a, nil); err != nil || n != 0 {
		t.Fatalf("rawRead of nothing = %d, %v", n, err)
	}

	// Two buffers in one writev arrive in order.
	p, q := []byte("hello, "), []byte("world")
	iov := make([]unix.Iovec, 2)
	iov[0].Base, iov[1].Base = &p[0], &q[0]
	iov[0].SetLen(len(p))
	iov[1].SetLen(len(q))
	if n, err := rawWritev(b, iov); err != nil || n != len(p)+len(q) {
		t.Fatalf("rawWritev = %d, %v", n, err)
	}
	if !pollNow(a, unix.POLLIN) {
		t.Fatal("pollNow: socket with data not readable")
	}
	if n, err := rawRead(a, buf); err != nil || string(buf[:n]) != "hello, world" {
		t.Fatalf("rawRead = %q, %v", buf[:n], err)
	}

	// Fill the socket: a write larger than the room left is short, the
	// next one gets EAGAIN, and pollNow says it is not writable.
	big := bytes.Repeat([]byte{0xa5}, 1<<20)
	iov = iov[:1]
	iov[0].Base = &big[0]
	iov[0].SetLen(len(big))
	sent, err := rawWritev(b, iov)
	if err != nil || sent <= 0 || sent >= len(big) {
		t.Fatalf("rawWritev of 1 MiB on a small socket = %d, %v; want a short write", sent, err)
	}
	for {
		n, err := rawWritev(b, iov)
		if err == unix.EAGAIN {
			break
		}
		if err != nil || n <= 0 {
			t.Fatalf("rawWritev on a full socket = %d, %v; want EAGAIN", n, err)
		}
		sent += n
	}
	if pollNow(b, unix.POLLOUT) {
		t.Fatal("pollNow: full socket writable")
	}
	got := 0
	for got < sent {
		n, err := rawRead(a, buf)
		if err != nil || n <= 0 {
			t.Fatalf("rawRead after %d of %d bytes = %d, %v", got, sent, n, err)
		}
		got += n
	}
	if n, err := rawRead(a, buf); err != unix.EAGAIN {
		t.Fatalf("rawRead past what was sent = %d, %v; want EAGAIN", n, err)
	}

	// Peer gone: the end of the stream, then EPIPE for a writer (Go
	// ignores SIGPIPE for descriptors other than 1 and 2).
	unix.Close(b)
	if !pollNow(a, unix.POLLIN) {
		t.Fatal("pollNow: hung-up socket not ready")
	}
	if n, err := rawRead(a, buf); n != 0 || err != nil {
		t.Fatalf("rawRead at the end of the stream = %d, %v; want 0, nil", n, err)
	}
	if n, err := rawWritev(a, iov); err != unix.EPIPE {
		t.Fatalf("rawWritev to a closed peer = %d, %v; want EPIPE", n, err)
	}

	// A closed descriptor: EBADF, not a hang or a success. (The raw
	// socket never lets a call reach a closed number: release closes it
	// once nothing uses it.)
	c, d := sockPair(t)
	unix.Close(d)
	unix.Close(c)
	if n, err := rawRead(c, buf); err != unix.EBADF {
		t.Fatalf("rawRead on a closed descriptor = %d, %v; want EBADF", n, err)
	}
	if n, err := rawWritev(c, iov); err != unix.EBADF {
		t.Fatalf("rawWritev on a closed descriptor = %d, %v; want EBADF", n, err)
	}
	if !pollNow(c, unix.POLLIN) {
		t.Fatal("pollNow on a closed descriptor: want ready (POLLNVAL), so the next call reports it")
	}
}

// TestRawSockShortWrites: a rawSock's writev over a real Unix stream connection
// whose reader is slower than the writer: short writes and EAGAIN are
// resumed where they stopped (waiting in the netpoller), so every byte of
// several buffers arrives once and in order; a read of a drained socket
// waits instead of failing with EAGAIN; Close wakes a blocked reader and
// writer with net.ErrClosed; after release, calls fail cleanly.
func TestRawSockShortWrites(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	nc, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	defer peer.Close()
	// A writev that loses bytes must fail the test, not hang it.
	peer.SetDeadline(time.Now().Add(time.Minute))
	peer.(*net.UnixConn).SetReadBuffer(4096)
	nc.(*net.UnixConn).SetWriteBuffer(4096)
	s, err := newRawSock(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer s.release()
	if fl, err := unix.FcntlInt(uintptr(s.fd), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
		t.Fatalf("raw socket descriptor flags %#x, %v: not non-blocking", fl, err)
	}

	// Three buffers, 6 MiB in all, far more than the socket holds.
	var want []byte
	var v net.Buffers
	for i, size := range []int{3 << 20, 1, 3<<20 - 1} {
		b := bytes.Repeat([]byte{byte(i + 1)}, size)
		for j := 0; j < size; j += 4093 {
			b[j] = byte(j)
		}
		v = append(v, b)
		want = append(want, b...)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(want))))
		got <- b
	}()
	n, err := s.writev(&v)
	if err != nil || n != int64(len(want)) || len(v) != 0 {
		t.Fatalf("writev = %d, %v, %d buffers left; want %d", n, err, len(v), len(want))
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("peer got %d bytes, not the %d written in order", len(b), len(want))
	}

	// A read on the drained socket waits for the peer's bytes (EAGAIN is
	// not an error).
	read := make(chan error, 1)
	go func() {
		buf := make([]byte, 16)
		n, err := s.Read(buf)
		if err == nil && string(buf[:n]) != "ping" {
			err = errors.New("read " + string(buf[:n]))
		}
		read <- err
	}()
	if _, err := peer.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatalf("Read: %v", err)
	}

	// A reader waiting on an empty socket and a writer on a full one:
	// Close wakes both with net.ErrClosed.
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, err := s.Read(make([]byte, 16))
		errs <- err
	}()
	go func() {
		defer wg.Done()
		big := net.Buffers{make([]byte, 16<<20)}
		_, err := s.writev(&big)
		errs <- err
	}()
	// Wait until the writer has filled the socket (the peer reads
	// nothing now), then close.
	deadline := time.Now().Add(10 * time.Second)
	for pollNow(s.fd, unix.POLLOUT) {
		if time.Now().After(deadline) {
			t.Fatal("the socket never filled up")
		}
		time.Sleep(time.Millisecond)
	}
	s.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.EPIPE) {
			t.Errorf("wait on a closed socket: %v; want net.ErrClosed", err)
		}
	}
	s.release()
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after release: %v; want net.ErrClosed", err)
	}
	if _, err := s.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after release: %v; want net.ErrClosed", err)
	}
}
