package donor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// TestHelloRefusedBeforeItsPayload: an unauthenticated peer whose first
// frame is not a HELLO is answered at once, before its payload (up to
// protocol.MaxPayload) is read. The donor allocated and read the whole
// payload first, holding a MiB per connection for the handshake's 10 s:
// a few thousand connections from anyone on the network took gigabytes
// of the donor's memory, which holds every tenant's region.
func TestHelloRefusedBeforeItsPayload(t *testing.T) {
	_, addr := startDonor(t, 1<<20, 0)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var b [protocol.HeaderSize]byte
	(&protocol.Header{Op: protocol.OpWrite, Seq: 9, Length: protocol.MaxPayload, Payload: protocol.MaxPayload}).Encode(b[:])
	if _, err := c.Write(b[:]); err != nil {
		t.Fatal(err)
	}
	// Well within the donor's handshake limit (errHandshakeLimit), after
	// which it answered too, with the payload's timeout.
	_ = c.SetReadDeadline(time.Now().Add(errHandshakeLimit / 2))
	var rb [protocol.HeaderSize]byte
	if _, err := c.Read(rb[:1]); err != nil {
		t.Fatalf("no answer to a WRITE in place of a HELLO while its payload is withheld: %v", err)
	}
	st, msg, err := answer(&prefixConn{Conn: c, first: rb[0]})
	if err != nil {
		t.Fatal(err)
	}
	if st != protocol.StatusProto || !strings.Contains(string(msg), "HELLO") {
		t.Fatalf("answer %d %q, want a protocol error naming the HELLO", st, msg)
	}
}

// prefixConn is a connection with one byte already read back in front.
type prefixConn struct {
	net.Conn
	first byte
	done  bool
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if !c.done && len(b) > 0 {
		c.done = true
		b[0] = c.first
		return 1, nil
	}
	return c.Conn.Read(b)
}

// TestSessionConnectionLimit: one session (one lease's credential) opens
// at most MaxSessionConns data connections at once; the next HELLO is
// refused with StatusLimit and the session's connections serve on. A HELLO
// that replaces one of them is admitted. Each sync, bulk or fault
// connection holds a thread of the donor while it waits for its next
// request (poll(2) on a raw descriptor): with no limit, a tenant opening
// connections took the donor past the Go runtime's 10000 threads, which
// kills the process and every tenant's region with it.
func TestSessionConnectionLimit(t *testing.T) {
	d, addr := startDonor(t, 1<<20, 0)
	ctrl, sess := dialHello(t, addr, protocol.KindControl, 0, testCred)
	defer ctrl.Close()
	const tries = 2 * DefaultMaxSessionConns
	var first net.Conn
	var firstID uint32
	admitted := 0
	for i := 0; i < tries; i++ {
		kind := protocol.KindSync
		if i%2 == 1 {
			kind = protocol.KindQueue
		}
		c, st, id := helloReplacing(t, addr, kind, sess, 0)
		if st != protocol.StatusOK {
			if st != protocol.StatusLimit {
				t.Fatalf("HELLO %d refused with status %d, want the connection limit's", i, st)
			}
			break
		}
		if first == nil {
			first, firstID = c, id
		}
		admitted++
	}
	if admitted != DefaultMaxSessionConns {
		t.Fatalf("%d data connections of one session admitted, want %d", admitted, DefaultMaxSessionConns)
	}
	// The session lives: its first connection reads.
	st, data := request(t, first, protocol.Header{Op: protocol.OpRead, Seq: 1, Length: 16}, nil)
	if st != protocol.StatusOK || len(data) != 16 {
		t.Fatalf("read on an admitted connection: status %d, %d bytes", st, len(data))
	}
	// A connection that replaces one of the session's is admitted.
	if _, st, _ := helloReplacing(t, addr, protocol.KindSync, sess, firstID); st != protocol.StatusOK {
		t.Fatalf("a replacing HELLO at the limit: status %d", st)
	}
	var ne net.Error
	if _, _, err := answer(first); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the replaced connection still served: %v", err)
	}
	_ = d
}

// TestDonorConnectionLimit: the donor serves at most MaxConns data
// connections of every session together; the next HELLO is refused with
// StatusLimit (ErrConnLimit, not ErrBusy) saying so, though its session is well under
// MaxSessionConns, while one that replaces a connection of its session is
// admitted, and a connection that ends makes room for another.
// MaxSessionConns alone bounded each tenant: some 40 of them at their
// limit took the donor past the Go runtime's 10000 threads (a sync, bulk
// or fault connection holds one while it waits), which kills the process
// and every tenant's region with it.
func TestDonorConnectionLimit(t *testing.T) {
	const limit = 8
	creds := []string{testCred, testCred + "-b", testCred + "-c"}
	d, addr := startDonorWith(t, 1<<20, 0, func(d *Donor) { d.MaxConns = limit })
	for _, cred := range creds[1:] {
		if err := d.AddRegion(cred, 1<<20); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.RemoveRegion(cred) })
	}
	sess := make([]uint64, len(creds))
	for i, cred := range creds {
		ctrl, s := dialHello(t, addr, protocol.KindControl, 0, cred)
		t.Cleanup(func() { ctrl.Close() })
		sess[i] = s
	}
	kinds := []uint8{protocol.KindSync, protocol.KindQueue, protocol.KindBulk, protocol.KindFault}
	type conn struct {
		c    net.Conn
		sess int
		id   uint32
	}
	var conns []conn
	for i := 0; i < limit; i++ {
		s := i % len(creds)
		c, st, id, msg := helloAs(t, addr, kinds[i%len(kinds)], creds[s], sess[s], 0)
		if st != protocol.StatusOK {
			t.Fatalf("data connection %d (session %d) refused under the donor's limit: status %d %q", i, s, st, msg)
		}
		conns = append(conns, conn{c, s, id})
	}
	// refused checks that a new data connection of session s is refused
	// for the donor's limit.
	refused := func(s int) {
		t.Helper()
		_, st, _, msg := helloAs(t, addr, protocol.KindSync, creds[s], sess[s], 0)
		err := protocol.StatusError(st, []byte(msg))
		if st == protocol.StatusOK || !errors.Is(err, protocol.ErrConnLimit) || errors.Is(err, protocol.ErrBusy) {
			t.Fatalf("a data connection past the donor's %d (session %d) admitted or not refused for the limit: status %d %q",
				limit, s, st, msg)
		}
		if want := fmt.Sprintf("the donor serves its limit of %d data connections", limit); !strings.Contains(msg, want) {
			t.Fatalf("refusal %q, want it to say %q", msg, want)
		}
	}
	refused(2) // session 2 has 2 connections, far from MaxSessionConns
	// The connections at the limit serve.
	if st, _ := request(t, conns[0].c, protocol.Header{Op: protocol.OpRead, Seq: 1, Length: 16}, nil); st != protocol.StatusOK {
		t.Fatalf("read on an admitted connection: status %d", st)
	}
	// A HELLO that replaces one of its session's connections is admitted
	// (answered once the replaced one's handler has returned), and takes
	// its place: the donor is still at its limit.
	old := conns[0]
	nc, st, id, msg := helloAs(t, addr, protocol.KindSync, creds[old.sess], sess[old.sess], old.id)
	if st != protocol.StatusOK {
		t.Fatalf("a replacing HELLO at the donor's limit: status %d %q", st, msg)
	}
	conns[0] = conn{nc, old.sess, id}
	refused(1)
	// A connection that ends makes room for one, of any session.
	gone := conns[1]
	d.mu.Lock()
	w := d.regions[credKey(creds[gone.sess])].sess.links[gone.id]
	d.mu.Unlock()
	if w == nil {
		t.Fatalf("no handler for connection %d of session %d", gone.id, gone.sess)
	}
	gone.c.Close()
	select {
	case <-w.left:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler of a closed connection did not return")
	}
	if _, st, _, msg := helloAs(t, addr, protocol.KindQueue, creds[2], sess[2], 0); st != protocol.StatusOK {
		t.Fatalf("a HELLO after a connection ended, under the donor's limit again: status %d %q", st, msg)
	}
	refused(0)
}

// TestConnectionLimitFairShare: tenant A, holding a few leases, opens
// data connections on each until the donor refuses them; tenant B then
// opens a session with a real client and does I/O on every channel. A
// session's first MinSessionConns connections are its guaranteed share
// and the donor keeps room for them: A is refused (ErrConnLimit, never
// ErrBusy) before it takes the donor's whole MaxConns. A took all of
// MaxConns, and B's session was refused its data connections (the
// client's Dial failed) until A let some go.
func TestConnectionLimitFairShare(t *testing.T) {
	const limit, perSession, share = 128, 48, 8
	d, addr := startDonorWith(t, 1<<20, 0, func(d *Donor) {
		d.MaxConns, d.MaxSessionConns, d.MinSessionConns = limit, perSession, share
	})
	credsA := []string{testCred, testCred + "-a1", testCred + "-a2"}
	credB := testCred + "-b"
	for _, cred := range append(credsA[1:], credB) {
		if err := d.AddRegion(cred, 1<<20); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.RemoveRegion(cred) })
	}
	total, shareRefused := 0, false
	for _, cred := range credsA {
		ctrl, sess := dialHello(t, addr, protocol.KindControl, 0, cred)
		t.Cleanup(func() { ctrl.Close() })
		for n := 0; ; n++ {
			// Queue connections: served from the netpoller, no thread
			// each.
			_, st, _, msg := helloAs(t, addr, protocol.KindQueue, cred, sess, 0)
			if st == protocol.StatusOK {
				total++
				if total > limit {
					t.Fatalf("the donor admitted %d data connections, over its limit of %d", total, limit)
				}
				continue
			}
			err := protocol.StatusError(st, []byte(msg))
			if !errors.Is(err, protocol.ErrConnLimit) || errors.Is(err, protocol.ErrBusy) {
				t.Fatalf("tenant A's connection %d of %s refused with %v, want the connection limit's error", n, cred, err)
			}
			if n < share {
				t.Fatalf("tenant A's session %s refused its connection %d, within its guaranteed %d: %v", cred, n, share, err)
			}
			if strings.Contains(msg, fmt.Sprintf("keeps the rest for other sessions' first %d", share)) {
				shareRefused = true
			}
			break
		}
	}
	if !shareRefused {
		t.Errorf("no refusal of tenant A named the share kept for other sessions")
	}
	// Tenant B: a session of its own, with the client's defaults (a sync
	// connection, bulk streams, a queue pair), reads and writes.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, credB, client.Options{})
	if err != nil {
		t.Fatalf("tenant B's session, with tenant A at the donor's limits (%d data connections): %v", total, err)
	}
	defer c.Close()
	for i, ch := range []client.Channel{client.ChannelSync, client.ChannelBulk, client.ChannelQueue} {
		want := bytes.Repeat([]byte{byte(i + 1)}, 64<<10)
		if err := c.Write(ctx, ch, want, int64(i)<<16); err != nil {
			t.Fatalf("tenant B's %v write: %v", ch, err)
		}
		got := make([]byte, len(want))
		if err := c.Read(ctx, ch, got, int64(i)<<16); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("tenant B's %v read: %v (equal %v)", ch, err, bytes.Equal(got, want))
		}
	}
}

// TestConnectionLimitError: a client whose data connection the donor
// refuses for a connection limit reads that limit (ErrConnLimit), not
// that the region has another subscriber (ErrBusy): the refusal was
// answered BUSY, and the client's error read "memory: region has
// another subscriber: the session has 4 data connections, the donor's
// limit".
func TestConnectionLimitError(t *testing.T) {
	const perSession = 4 // a sync connection, two bulk streams, a queue pair
	_, addr := startDonorWith(t, 1<<20, 0, func(d *Donor) { d.MaxSessionConns = perSession })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, testCred, client.Options{Streams: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.NewQueuePair(ctx)
	if !errors.Is(err, protocol.ErrConnLimit) || errors.Is(err, protocol.ErrBusy) {
		t.Fatalf("a queue pair past the session's limit: %v, want ErrConnLimit and not ErrBusy", err)
	}
	if want := fmt.Sprintf("the donor's connection limit is reached: %d data connections per session", perSession); !strings.Contains(err.Error(), want) ||
		strings.Contains(err.Error(), "subscriber") {
		t.Fatalf("a queue pair past the session's limit: %q, want it to say %q (and nothing of a subscriber)", err, want)
	}
	// The session serves on.
	if err := c.Write(ctx, client.ChannelSync, []byte("still"), 0); err != nil {
		t.Fatal(err)
	}
}
