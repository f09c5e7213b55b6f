package nbd

import (
	"testing"
	"time"
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
// in poll(2) while it is the process's only NBD connection, and in the
// netpoller as soon as there is another, served or dialled (whose goroutine
// would otherwise wait for the P the sleeping reader holds). The clients
// here speak the protocol on raw sockets, so that only the server's
// connections count.
func TestPollOnlyWhenAlone(t *testing.T) {
	waitTransmitting(t, 0)
	_, addr := startServer(t, Export{Name: "x", Backend: NewMemBackend(1 << 20)})
	open := func() *rawConn {
		rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
		rc.goTransmission("x", false, false)
		return rc
	}
	reads := func(rc *rawConn) {
		t.Helper()
		for i := range 20 {
			rc.request(Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i) * 4096, Length: 4096}, nil)
			if r, err := rc.reply(4096); err != nil || r.errno != 0 {
				t.Fatalf("read %d: %v (errno %d)", i, err, r.errno)
			}
		}
	}
	c1 := open()
	waitTransmitting(t, 1)
	p0 := polls.Load()
	reads(c1)
	if polls.Load() == p0 {
		t.Fatal("the only connection never waited in poll(2)")
	}

	c2 := open()
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

	// A Client of this process counts as a connection too.
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

// TestTLSNeverPolls: a TLS connection's reader waits for the next request
// in the netpoller even when it is the process's only connection. Measured
// at queue depth 1 over TLS, the blocking poll(2) made reads slower
// (docs/bench/tls.md, "Follow-up: queue depth 1 over TLS"). The client
// speaks the protocol on a raw socket, so that only the server's
// connection counts.
func TestTLSNeverPolls(t *testing.T) {
	waitTransmitting(t, 0)
	p := newTestPKI(t)
	_, addr := startTLSServer(t, p.server, false, Export{Name: "x", Backend: NewMemBackend(1 << 20)})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.starttls(p.clientConfig())
	rc.goTransmission("x", false, false)
	waitTransmitting(t, 1)
	p0 := polls.Load()
	for i := range 20 {
		rc.request(Request{Type: CmdRead, Handle: uint64(i), Offset: uint64(i) * 4096, Length: 4096}, nil)
		if r, err := rc.reply(4096); err != nil || r.errno != 0 {
			t.Fatalf("read %d: %v (errno %d)", i, err, r.errno)
		}
	}
	if got := polls.Load() - p0; got != 0 {
		t.Fatalf("%d waits in poll(2) on a TLS connection", got)
	}
	rc.c.Close()
	waitTransmitting(t, 0)
}
