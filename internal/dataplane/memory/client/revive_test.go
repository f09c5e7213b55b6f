package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// next is the next completion on q, or the test fails at ctx's end.
func next(ctx context.Context, t *testing.T, q *QueuePair) Completion {
	t.Helper()
	select {
	case cp := <-q.Completions():
		return cp
	case <-ctx.Done():
		t.Fatal("no completion")
		return Completion{}
	}
}

// TestAppQueuePairRejoinedAfterTimeout: a queue pair the application
// opened, whose WRITE times out (its payload held on its way by a relay),
// fails the WRITE; the next Post re-establishes the pair's connection — a
// new queue connection naming the failed one — and its WRITE to the same
// range is acknowledged and read back, while the late rest of the failed
// WRITE, once delivered, does not land over it. The donor holds one
// credit window per queue connection served (the session's own pair's
// and this one's). Before, the pair stayed failed for the session's
// life: every later Post failed with the timeout's error.
func TestAppQueuePairRejoinedAfterTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	td := memorytest.Start(t, 4<<20, 0)
	relay := memorytest.StartRelay(t, td.Addr)
	c := dial(t, td.Addr, Options{Dialer: relay.Dial, Timeout: time.Second})
	q, err := c.NewQueuePair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	const n = 4 << 10
	before := relay.Dials()
	stalled, release, landed := relay.ArmHeld(protocol.KindQueue)
	if _, err := q.Post(ctx, Op{Write: true, Off: 0, Buf: bytes.Repeat([]byte{0xAA}, n), Tag: 1}); err != nil {
		t.Fatal(err)
	}
	<-stalled
	if cp := next(ctx, t, q); cp.Tag != 1 || !errors.Is(cp.Err, protocol.ErrDonorLost) {
		t.Fatalf("the write that timed out: %+v", cp)
	}

	later := bytes.Repeat([]byte{0xBB}, n)
	if _, err := q.Post(ctx, Op{Write: true, Off: 0, Buf: later, Tag: 2}); err != nil {
		t.Fatalf("the next Post: %v", err)
	}
	if cp := next(ctx, t, q); cp.Tag != 2 || cp.Err != nil {
		t.Fatalf("the next write: %+v", cp)
	}
	got := make([]byte, n)
	if _, err := q.Post(ctx, Op{Off: 0, Buf: got, Tag: 3}); err != nil {
		t.Fatal(err)
	}
	if cp := next(ctx, t, q); cp.Tag != 3 || cp.Err != nil || !bytes.Equal(got, later) {
		t.Fatalf("the read after it: %+v (equal %v)", cp, bytes.Equal(got, later))
	}
	close(release)
	select {
	case <-landed:
	case <-ctx.Done():
		t.Fatal("the failed write's connection did not end")
	}
	if _, err := td.D.ReadRegion(testCred, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, later) {
		t.Fatalf("the region does not hold the write acknowledged after the timeout (first 0xAA at %d)", bytes.IndexByte(got, 0xAA))
	}
	if d := relay.Dials()[protocol.KindQueue] - before[protocol.KindQueue]; d != 1 {
		t.Errorf("%d new queue connection(s), want 1", d)
	}
	if c.Rejoins() != 1 {
		t.Errorf("rejoins %d, want 1", c.Rejoins())
	}
	if w := td.D.QueueWindows(testCred); w != 2 {
		t.Errorf("the donor holds %d queue credit windows, want 2 (the session's pair's and this one's)", w)
	}
	if err := c.err(); err != nil {
		t.Fatalf("the session: %v", err)
	}
}

// TestQueueWindowsBoundedAcrossRejoins: a queue pair whose connection is
// re-established again and again (each time a malformed reply fails it,
// and the next Post re-establishes it) leaves the donor one credit window
// for it, not one per connection it ever had; once the session's pairs
// are closed, none. The donor kept every replaced connection's window.
func TestQueueWindowsBoundedAcrossRejoins(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	td := memorytest.Start(t, 4<<20, 0)
	relay := memorytest.StartRelay(t, td.Addr)
	c := dial(t, td.Addr, Options{Dialer: relay.Dial})
	q, err := c.NewQueuePair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const rejoins = 10
	buf := make([]byte, 4096)
	for i := range rejoins {
		spoilt := relay.Corrupt(protocol.KindQueue, memorytest.CorruptOpcode)
		if _, err := q.Post(ctx, Op{Off: 0, Buf: buf, Tag: uint64(i)}); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		<-spoilt
		if cp := next(ctx, t, q); !errors.Is(cp.Err, protocol.ErrBadFrame) {
			t.Fatalf("round %d: the read whose reply was spoilt: %+v", i, cp)
		}
		if _, err := q.Post(ctx, Op{Off: 0, Buf: buf, Tag: 100}); err != nil {
			t.Fatalf("round %d: the next Post: %v", i, err)
		}
		if cp := next(ctx, t, q); cp.Err != nil {
			t.Fatalf("round %d: the next read: %+v", i, cp)
		}
		if w := td.D.QueueWindows(testCred); w != 2 {
			t.Fatalf("after %d re-established connection(s), the donor holds %d queue credit windows, want 2", i+1, w)
		}
	}
	if c.Rejoins() != rejoins {
		t.Errorf("rejoins %d, want %d", c.Rejoins(), rejoins)
	}
	_ = q.Close()
	_ = c.qp.Close()
	waitUntil(ctx, t, "the closed pairs' windows to go", func() bool { return td.D.QueueWindows(testCred) == 0 })
}

// TestMalformedReplyReplacesConnection: a reply the relay spoils (another
// request's sequence number, a payload length over the limit, an
// unknown opcode) fails the request it concerns with ErrBadFrame, naming
// the connection; the channel's next request re-establishes the
// connection (one new connection of that kind, naming the one it
// replaces; for a queue pair, a sync connection too, which had the donor
// end the failed one before the failure was returned) and is served, and every acknowledged write is in the region
// — the one before, and the one after the failure over the failed
// write's range, which nothing of the failed write overwrote. For the
// sync, bulk and queue channels. Before, the sync and bulk connections,
// and the client's queue pair, failed every later request with the
// malformed frame's error.
func TestMalformedReplyReplacesConnection(t *testing.T) {
	targets := []struct {
		ch   Channel
		kind uint8
	}{{ChannelSync, protocol.KindSync}, {ChannelBulk, protocol.KindBulk}, {ChannelQueue, protocol.KindQueue}}
	hows := []memorytest.Corruption{memorytest.CorruptSeq, memorytest.CorruptLength, memorytest.CorruptOpcode}
	for _, tg := range targets {
		for _, how := range hows {
			t.Run(fmt.Sprintf("%v/%v", tg.ch, how), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
				defer cancel()
				td := memorytest.Start(t, 4<<20, 0)
				relay := memorytest.StartRelay(t, td.Addr)
				c := dial(t, td.Addr, Options{Dialer: relay.Dial, Streams: 1, ChunkSize: 64 << 10, QueueChunk: 16 << 10})
				const n = 256 << 10
				// An acknowledged write, elsewhere.
				first := bytes.Repeat([]byte{0x11}, n)
				if err := c.Write(ctx, tg.ch, first, 1<<20); err != nil {
					t.Fatal(err)
				}
				before := relay.Dials()
				spoilt := relay.Corrupt(tg.kind, how)
				err := c.Write(ctx, tg.ch, bytes.Repeat([]byte{0x22}, n), 0)
				<-spoilt
				if !errors.Is(err, protocol.ErrBadFrame) {
					t.Fatalf("the write whose reply was spoilt: %v", err)
				}
				if tg.ch != ChannelQueue && !strings.Contains(err.Error(), kindName(tg.kind)+" connection") {
					t.Errorf("the error does not name the connection: %v", err)
				}

				later := bytes.Repeat([]byte{0x33}, n)
				if err := c.Write(ctx, tg.ch, later, 0); err != nil {
					t.Fatalf("the next %v write: %v", tg.ch, err)
				}
				got := make([]byte, n)
				if err := c.Read(ctx, tg.ch, got, 0); err != nil || !bytes.Equal(got, later) {
					t.Fatalf("the next %v read: %v (equal %v)", tg.ch, err, bytes.Equal(got, later))
				}
				for _, w := range []struct {
					off  int64
					want []byte
				}{{0, later}, {1 << 20, first}} {
					if _, err := td.D.ReadRegion(testCred, got, w.off); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, w.want) {
						t.Errorf("the region at %d does not hold the write acknowledged there", w.off)
					}
				}
				after := relay.Dials()
				for _, k := range []uint8{protocol.KindControl, protocol.KindSync, protocol.KindBulk, protocol.KindQueue} {
					want := before[k]
					if k == tg.kind {
						want++
					}
					// The pair that failed with WRITEs in flight had
					// the donor end its connection with a new queue
					// connection (fail), which it serves on (revive): one
					// HELLO. There were two: a sync connection closed
					// once answered, then the pair's new one.
					if after[k] != want {
						t.Errorf("connections of kind %d: %d, then %d (want %d)", k, before[k], after[k], want)
					}
				}
				if c.Rejoins() != 1 {
					t.Errorf("rejoins %d, want 1", c.Rejoins())
				}
				if err := c.err(); err != nil {
					t.Fatalf("the session: %v", err)
				}
			})
		}
	}
}

// TestQueueLateReplyOfGivenUpRequest: the reply to a queue READ its
// caller gave up (its context cancelled while the reply was on its way,
// held by a relay) arrives late and is skipped: the pair serves on, its
// connection neither failed nor re-established. Replies no request is
// waiting for, and none was given up for, fail the pair at once
// (TestMalformedReplyReplacesConnection, queue/seq): the given-up
// sequence numbers tell the two apart.
func TestQueueLateReplyOfGivenUpRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	td := memorytest.Start(t, 4<<20, 0)
	relay := memorytest.StartRelay(t, td.Addr)
	c := dial(t, td.Addr, Options{Dialer: relay.Dial, QueueChunk: 16 << 10})
	want := bytes.Repeat([]byte{0x5a}, 32<<10)
	if err := c.Write(ctx, ChannelQueue, want, 0); err != nil {
		t.Fatal(err)
	}
	before := relay.Dials()
	held, release := relay.Hold(protocol.KindQueue)
	rctx, rcancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Read(rctx, ChannelQueue, make([]byte, len(want)), 0) }()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the READ's reply never came")
	}
	rcancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the READ given up: %v, want its context's end", err)
	}
	close(release)
	// Its replies come first on the connection, then this READ's.
	got := make([]byte, len(want))
	if err := c.Read(ctx, ChannelQueue, got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the next queue read: %v (equal %v)", err, bytes.Equal(got, want))
	}
	if n := c.Rejoins(); n != 0 {
		t.Errorf("%d connections re-established, want none", n)
	}
	if after := relay.Dials(); after[protocol.KindQueue] != before[protocol.KindQueue] || after[protocol.KindSync] != before[protocol.KindSync] {
		t.Errorf("connections opened: %v, then %v", before, after)
	}
	if err := c.err(); err != nil {
		t.Fatalf("the session: %v", err)
	}
}

// TestFailedQueuePairRevivedAtConnectionLimit: a queue pair that fails
// with WRITEs in flight (a malformed reply) while its session holds the
// donor's MaxSessionConns data connections is re-established by its next
// request, which succeeds. The one HELLO that has the donor end the
// failed connection replaces it, and is admitted at the limit; the pair
// goes on on that connection. It was a sync connection closed once
// answered, and the pair's new connection, a HELLO of its own that
// replaced nothing any more, was refused at the limit (ErrConnLimit):
// the queue channel failed until another connection of the session
// ended.
func TestFailedQueuePairRevivedAtConnectionLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	// A sync connection, a bulk stream, the queue pair: the session's
	// limit.
	td := memorytest.StartWith(t, 4<<20, 0, func(d *donor.Donor) { d.MaxSessionConns = 3 })
	relay := memorytest.StartRelay(t, td.Addr)
	c := dial(t, td.Addr, Options{Dialer: relay.Dial, Streams: 1, QueueChunk: 16 << 10})
	const n = 64 << 10
	spoilt := relay.Corrupt(protocol.KindQueue, memorytest.CorruptLength)
	if err := c.Write(ctx, ChannelQueue, bytes.Repeat([]byte{0x44}, n), 0); !errors.Is(err, protocol.ErrBadFrame) {
		t.Fatalf("the write whose reply was spoilt: %v", err)
	}
	<-spoilt
	want := bytes.Repeat([]byte{0x55}, n)
	if err := c.Write(ctx, ChannelQueue, want, 0); err != nil {
		t.Fatalf("the next queue write, the session at its connection limit: %v", err)
	}
	got := make([]byte, n)
	if err := c.Read(ctx, ChannelQueue, got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the next queue read: %v (equal %v)", err, bytes.Equal(got, want))
	}
	if err := c.err(); err != nil {
		t.Fatalf("the session: %v", err)
	}
}
