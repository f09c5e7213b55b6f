package accel

import (
	"bufio"
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"
)

// A READ is 12 bytes and its reply up to MaxPayload: a client that sends
// whole-memory READs and never reads its socket must not make the server
// queue a reply per READ (256 queued replies of 16 MiB per connection).
// The server holds at most its reply budget of READ replies; past it the
// connection's reader waits (back-pressure), and once the client reads,
// every reply arrives and the budget is given back. A server stopping
// while a reader waits for the budget still stops.
func TestReadRepliesWithinBudget(t *testing.T) {
	const mem = 1 << 20
	const budget = 3 * mem
	const reads = 64
	srv := &Server{Target: &memTarget{mem: make([]byte, mem)}, MaxPayload: mem, MaxQueuedReplies: budget}
	nc, br := serveHello(t, srv, mem)
	sendReads := func(tag0 uint32) {
		t.Helper()
		var b []byte
		for i := range reads {
			p := binary.LittleEndian.AppendUint64(nil, 0)
			p = binary.LittleEndian.AppendUint32(p, mem)
			b = AppendFrame(b, Frame{Op: OpRead, Tag: tag0 + uint32(i), Payload: p})
		}
		if _, err := nc.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	// stalls waits until the connection's reader waits for the budget
	// (the socket's buffers full of replies, the budget spent), failing
	// as soon as the server holds more than its budget.
	stalls := func() {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			c, held, waiting := srv.ReplyBudget()
			if c != budget {
				t.Fatalf("reply budget %d, want %d", c, budget)
			}
			if held > c {
				t.Fatalf("the server holds %d MiB of READ replies nobody reads, above its %d MiB budget", held>>20, c>>20)
			}
			if waiting > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the reader never waited for the reply budget (%d bytes held)", held)
			}
			time.Sleep(time.Millisecond) // polling, not synchronisation
		}
	}
	sendReads(100)
	stalls()
	// The client reads again: every reply arrives, in order.
	for i := range reads {
		f, err := ReadFrame(br, mem)
		if err != nil {
			t.Fatal(err)
		}
		if f.Op != OpData || f.Tag != 100+uint32(i) || len(f.Payload) != mem {
			t.Fatalf("reply %d: op %#x tag %d, %d bytes", i, f.Op, f.Tag, len(f.Payload))
		}
	}
	// The writer gives a reply's share back just after the reply left.
	waitUntil(t, "the budget given back after every reply was read", func() bool {
		_, held, waiting := srv.ReplyBudget()
		return held == 0 && waiting == 0
	})
	// Stalled again, then the server stops (the deferred cancel): the
	// waiting reader must not keep Serve from returning.
	sendReads(1000)
	stalls()
}

// serveHello serves srv on a loopback port for the test's length and
// returns a raw connection to it past its HELLO (credential
// "lease-secret") and READY, with a reader of frames up to max bytes.
func serveHello(t *testing.T, srv *Server, max uint32) (net.Conn, *bufio.Reader) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(nc)
	cred := []byte("lease-secret")
	hello := binary.LittleEndian.AppendUint16(nil, Version)
	hello = binary.LittleEndian.AppendUint16(hello, uint16(len(cred)))
	hello = append(hello, cred...)
	if _, err := nc.Write(AppendFrame(nil, Frame{Op: OpHello, Tag: 1, Payload: hello})); err != nil {
		t.Fatal(err)
	}
	if f, err := ReadFrame(br, max); err != nil || f.Op != OpReady {
		t.Fatalf("hello: %+v %v", f, err)
	}
	return nc, br
}
