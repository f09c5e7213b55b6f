package nbd

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd/nbdkittest"

	"golang.org/x/sys/unix"
)

// waitTransmitting polls until n NBD connections of this process are in
// the transmission phase.
func waitTransmitting(t *testing.T, n int32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for transmitting.Load() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections transmitting, want %d", transmitting.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPollOnlyWhenAlone: a connection's reader waits for the next request
// in poll(2) while it is the process's only served NBD connection, and in
// the netpoller as soon as there is another (a Client of the process
// dialling this server makes one; TestPollBesideOwnClients has Clients to
// servers elsewhere). The clients
// here speak the protocol on raw sockets, so that only the server's
// connections count.
func TestPollOnlyWhenAlone(t *testing.T) {
	waitTransmitting(t, 0)
	_, addr := startServer(t, Export{Name: "x", Backend: NewMemBackend(1 << 20)})
	reads := func(rc *rawConn) {
		t.Helper()
		for i := range 20 {
			rc.request(Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i) * 4096, Length: 4096}, nil)
			if r, err := rc.reply(4096); err != nil || r.errno != 0 {
				t.Fatalf("read %d: %v (errno %d)", i, err, r.errno)
			}
		}
	}
	c1 := openPlain(t, addr, "x")
	waitTransmitting(t, 1)
	p0 := polls.Load()
	reads(c1)
	if polls.Load() == p0 {
		t.Fatal("the only connection never waited in poll(2)")
	}

	c2 := openPlain(t, addr, "x")
	waitTransmitting(t, 2)
	p1 := polls.Load()
	reads(c1)
	reads(c2)
	if got := polls.Load() - p1; got != 0 {
		t.Fatalf("%d waits in poll(2) with two served connections", got)
	}

	c2.c.Close()
	waitTransmitting(t, 1)
	p2 := polls.Load()
	reads(c1)
	if polls.Load() == p2 {
		t.Fatal("alone again, the connection never waited in poll(2)")
	}

	// A Client of this process dialling this server makes a second
	// served connection.
	cl := dial(t, addr, "x")
	waitTransmitting(t, 3) // the Client's and the server's end of it
	p3 := polls.Load()
	reads(c1)
	if got := polls.Load() - p3; got != 0 {
		t.Fatalf("%d waits in poll(2) beside a dialled connection", got)
	}
	cl.Close()
	waitTransmitting(t, 1)
}

// TestTLSRawSocket: a TLS connection's socket leaves Go's netpoller as a
// plaintext one does: at queue depth 1 its reader waits for the next
// request in poll(2), crypto/tls reads and writes the raw socket, the
// bytes stay right across idle periods (back in the netpoller) and bursts,
// and the session still ends with close_notify. The client speaks the
// protocol on a socket of its own, so that only the server's connection
// counts.
func TestTLSRawSocket(t *testing.T) {
	waitTransmitting(t, 0)
	p := newTestPKI(t)
	s, addr := startTLSServer(t, p.server, false, Export{Name: "x", Backend: NewMemBackend(1 << 20)})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.starttls(p.clientConfig())
	rc.goTransmission("x", false, false)
	waitTransmitting(t, 1)
	rs := serverSock(t, s, "x")
	h := uint64(0)
	for round := range 3 {
		waitFor(t, "the idle connection waits in the netpoller", rs.polled)
		p0, d0 := polls.Load(), rs.drops.Load()
		rc.writeFlushRead(t, &h, byte(round*32), 20)
		if polls.Load() == p0 {
			t.Fatalf("round %d: the only connection, over TLS, never waited in poll(2)", round)
		}
		if rs.drops.Load() == d0 {
			t.Fatalf("round %d: requests one at a time, and the socket never left the netpoller", round)
		}
	}
	h++
	rc.request(Request{Type: CmdDisc, Handle: h}, nil)
	// close_notify: crypto/tls reports a clean end as io.EOF, a bare
	// hang-up as io.ErrUnexpectedEOF.
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := rc.r.ReadByte(); err != io.EOF {
		t.Fatalf("after DISC: %v, want io.EOF (close_notify)", err)
	}
	waitTransmitting(t, 0)
}

// TestTLSRawSocketRemoveStuck: removing an export ends a TLS connection
// whose writer is stuck on the raw socket (the client stopped reading
// replies), and RemoveExport returns.
func TestTLSRawSocketRemoveStuck(t *testing.T) {
	waitTransmitting(t, 0)
	p := newTestPKI(t)
	s, addr := startTLSServer(t, p.server, false, Export{Name: "x", Backend: NewMemBackend(1 << 20)})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.starttls(p.clientConfig())
	rc.goTransmission("x", false, false)
	waitTransmitting(t, 1)
	serverSock(t, s, "x")
	// Requests for far more than the sockets buffer, never read back.
	var reqs bytes.Buffer
	for i := range 2048 {
		var b [requestHeaderLen]byte
		putRequest(b[:], Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i%32) * 32768, Length: 32768})
		reqs.Write(b[:])
	}
	go rc.c.Write(reqs.Bytes()) // ends when the connection does
	tc := rc.c.(*tls.Conn)
	tcp := tc.NetConn().(*net.TCPConn)
	// 64 MiB of replies cannot fit in the sockets' buffers: once the
	// client holds a good part of them unread, the server's writer is
	// (or soon will be) blocked on the raw socket.
	waitFor(t, "replies pile up unread", func() bool { return inq(t, tcp) >= 64<<10 })
	done := make(chan error, 1)
	go func() { done <- s.RemoveExport("x") }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("RemoveExport did not return")
	}
	waitTransmitting(t, 0)
}

// inq is how many bytes wait unread in c's receive queue.
func inq(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n
}

// TestPollBesideOwnClients: the process's own Clients to servers elsewhere
// (the parts of `rialto attach`) do not stop its sole served connection
// from waiting in poll(2) at queue depth 1: that reader forwards a request
// and reads the part's reply itself, on its own goroutine. The Client here
// reaches an nbdkit process; a second served connection still stops the
// polling.
func TestPollBesideOwnClients(t *testing.T) {
	if _, err := exec.LookPath("nbdkit"); err != nil {
		t.Skip("nbdkit not installed")
	}
	waitTransmitting(t, 0)
	part := dialNbdkit(t, "memory", "1M")

	_, addr := startServer(t, Export{Name: "x", Backend: NewMemBackend(1 << 20)})
	// Each request is forwarded to the part, as an attach would.
	reads := func(rc *rawConn) {
		t.Helper()
		buf := make([]byte, 4096)
		for i := range 20 {
			if _, err := part.ReadAt(buf, int64(i)*4096); err != nil {
				t.Fatalf("part read %d: %v", i, err)
			}
			rc.request(Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i) * 4096, Length: 4096}, nil)
			if r, err := rc.reply(4096); err != nil || r.errno != 0 {
				t.Fatalf("read %d: %v (errno %d)", i, err, r.errno)
			}
		}
	}
	c1 := openPlain(t, addr, "x")
	waitTransmitting(t, 2) // the served connection and the Client's
	p0 := polls.Load()
	reads(c1)
	if polls.Load() == p0 {
		t.Fatal("the only served connection, beside a Client of the process, never waited in poll(2)")
	}

	// While a call of a Client is in flight (a worker waiting on a part,
	// at depth), the reader keeps to the netpoller: the reply must reach
	// its caller, which may need the P a sleeping reader would hold.
	slow := dialNbdkit(t, "--filter=delay", "memory", "1M", "rdelay=1")
	done := make(chan error, 1)
	go func() {
		_, err := slow.ReadAt(make([]byte, 512), 0)
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for clientCalls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the slow read never counted as in flight")
		}
		time.Sleep(time.Millisecond)
	}
	p1 := polls.Load()
	for i := range 20 { // not forwarded: the slow read is the part's call
		c1.request(Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i) * 4096, Length: 4096}, nil)
		if r, err := c1.reply(4096); err != nil || r.errno != 0 {
			t.Fatalf("read %d: %v (errno %d)", i, err, r.errno)
		}
	}
	if got := polls.Load() - p1; got != 0 && clientCalls.Load() != 0 {
		t.Fatalf("%d waits in poll(2) while a Client's call was in flight", got)
	}
	if err := <-done; err != nil {
		t.Fatalf("slow read: %v", err)
	}
	slow.Close()

	c2 := openPlain(t, addr, "x")
	waitTransmitting(t, 3)
	p2 := polls.Load()
	reads(c1)
	if got := polls.Load() - p2; got != 0 {
		t.Fatalf("%d waits in poll(2) with two served connections", got)
	}
	c2.c.Close()
	c1.c.Close()
	part.Close()
	waitTransmitting(t, 0)
}

// dialNbdkit starts nbdkit with args on a Unix socket (socket activation,
// so no waiting for it) and dials it.
func dialNbdkit(t *testing.T, args ...string) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "nbdkit.sock")
	nbdkittest.Start(t, sock, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, "unix", sock, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// openPlain opens a plaintext connection to export name on addr, speaking
// the protocol on a raw socket, and enters transmission.
func openPlain(t *testing.T, addr, name string) *rawConn {
	t.Helper()
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission(name, false, false)
	return rc
}
