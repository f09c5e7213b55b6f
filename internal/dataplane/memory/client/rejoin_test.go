package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// waitUntil polls cond every millisecond until it holds, or fails the
// test at ctx's end.
func waitUntil(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// TestDonorClosesOneConnection: a donor moving a region closes the
// connection of a WRITE whose payload stalls, and only it; the session
// lives on (docs/memory-protocol.md, "A region that moved"). The
// borrower's following session re-establishes that connection alone and
// sends the write again on it: the write succeeds, the other channels'
// requests, under way all along from another goroutine, never fail and
// their connections are not dialled again (no session is opened again:
// one control connection in all), the lost channel serves again, and
// every acknowledged write is in the region. For each channel whose
// connection the donor closes, and each of a move's waits that close
// one (TrackWrites, and PauseWrites, which then holds the write sent
// again until the writes resume). The session dialled all its
// connections again, and so the other channels' requests in flight were
// cut off and retried on the new session.
func TestDonorClosesOneConnection(t *testing.T) {
	const size = 4 << 20
	const half = size / 2 // the stalled writes below, the other channels' load above
	targets := []struct {
		ch    Channel
		kind  uint8
		n     int // the stalled write's size
		other []Channel
	}{
		{ChannelSync, protocol.KindSync, 64 << 10, []Channel{ChannelBulk, ChannelQueue}},
		{ChannelBulk, protocol.KindBulk, 1 << 20, []Channel{ChannelSync, ChannelQueue}},
		{ChannelQueue, protocol.KindQueue, 256 << 10, []Channel{ChannelSync, ChannelBulk}},
	}
	moves := []struct {
		name  string
		pause bool
	}{{"TrackWrites", false}, {"PauseWrites", true}}
	for _, tg := range targets {
		for _, mv := range moves {
			t.Run(fmt.Sprintf("%v/%s", tg.ch, mv.name), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
				defer cancel()
				td := memorytest.Start(t, size, 0)
				td.D.RefusalWait = 50 * time.Millisecond
				relay := memorytest.StartRelay(t, td.Addr)
				w := &where{addr: td.Addr, cred: testCred}
				f, err := DialFollowing(ctx, td.Addr, testCred,
					Options{Dialer: relay.Dial, ChunkSize: 64 << 10, QueueChunk: 16 << 10},
					FollowConfig{Relocate: w.relocate})
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				c := f.Client()

				// The load: writes and reads on the other channels, each
				// read checked against the model of what was acknowledged.
				model := make([]byte, size)
				var mmu sync.Mutex
				var rounds atomic.Int64
				stop := make(chan struct{})
				loadErr := make(chan error, 1)
				var wg sync.WaitGroup
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(7, 8))
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						n := 4096 * (1 + rng.IntN(16))
						off := int64(half + 4096*rng.IntN((half-n)/4096))
						p := make([]byte, n)
						for j := range p {
							p[j] = byte(i) ^ byte(j>>12)
						}
						ch := tg.other[i%len(tg.other)]
						if err := f.Write(ctx, ch, p, off); err != nil {
							loadErr <- fmt.Errorf("%v write: %w", ch, err)
							return
						}
						mmu.Lock()
						copy(model[off:], p)
						mmu.Unlock()
						got := make([]byte, n)
						ch = tg.other[(i+1)%len(tg.other)]
						if err := f.Read(ctx, ch, got, off); err != nil {
							loadErr <- fmt.Errorf("%v read: %w", ch, err)
							return
						}
						if !bytes.Equal(got, p) {
							loadErr <- fmt.Errorf("%v read of [%d,+%d): not what was written", ch, off, n)
							return
						}
						rounds.Add(1)
					}
				})
				defer func() {
					select {
					case <-stop:
					default:
						close(stop)
					}
					wg.Wait()
				}()
				progress := func(what string) {
					t.Helper()
					base := rounds.Load()
					waitUntil(ctx, t, what, func() bool {
						select {
						case err := <-loadErr:
							t.Fatalf("the other channels' load failed: %v", err)
						default:
						}
						return rounds.Load() >= base+10
					})
				}
				progress("the load to start")

				m := dirty.New(size, 4096)
				if mv.pause {
					// The move tracks the writes before the stalled one
					// starts: PauseWrites waits for it.
					if err := td.D.TrackWrites(ctx, testCred, m); err != nil {
						t.Fatal(err)
					}
				}
				// The write whose payload stalls on its way.
				payload := make([]byte, tg.n)
				for j := range payload {
					payload[j] = 0xA5 ^ byte(j/4093)
				}
				const off = 4096
				stalled := relay.Arm(tg.kind)
				res := make(chan error, 1)
				go func() { res <- f.Write(ctx, tg.ch, payload, off) }()
				<-stalled
				// Its first bytes are in the region: the donor has the
				// write under way.
				at := relay.StallOffset()
				waitUntil(ctx, t, "the stalled write's first bytes in the region", func() bool {
					got := make([]byte, memorytest.StallSent)
					if _, err := td.D.ReadRegion(testCred, got, at); err != nil {
						t.Fatal(err)
					}
					return bytes.Equal(got, payload[at-off:at-off+memorytest.StallSent])
				})
				progress("the other channels to serve while one write stalls")
				before := relay.Dials()

				// The move gives up on the stalled payload: the donor
				// closes that connection, and only it.
				if mv.pause {
					if err := td.D.PauseWrites(ctx, testCred); err != nil {
						t.Fatal(err)
					}
					// The connection is re-established and the write sent
					// again is held, like any.
					waitUntil(ctx, t, "the write sent again to be held", func() bool {
						return relay.Dials()[tg.kind] > before[tg.kind] && td.D.Waiting(testCred) >= 1
					})
					if err := td.D.ResumeWrites(testCred); err != nil {
						t.Fatal(err)
					}
				} else if err := td.D.TrackWrites(ctx, testCred, m); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-res:
					if err != nil {
						t.Fatalf("the write whose connection the donor closed: %v", err)
					}
				case <-ctx.Done():
					t.Fatal("the write whose connection the donor closed did not complete")
				}
				progress("the other channels to serve after the connection's loss")
				if err := td.D.EndMove(testCred); err != nil {
					t.Fatal(err)
				}

				// Only the lost connection was dialled again.
				after := relay.Dials()
				for _, k := range []uint8{protocol.KindControl, protocol.KindSync, protocol.KindBulk, protocol.KindQueue} {
					want := before[k]
					if k == tg.kind {
						want++
					}
					if after[k] != want {
						t.Errorf("connections of kind %d: %d, then %d after the donor closed one of kind %d", k, before[k], after[k], tg.kind)
					}
				}
				if after[protocol.KindControl] != 1 || f.Client() != c || f.Moves() != 0 {
					t.Errorf("the session was opened again: %d control connections, moves %d", after[protocol.KindControl], f.Moves())
				}
				if c.Rejoins() != 1 {
					t.Errorf("rejoins %d, want 1", c.Rejoins())
				}

				// The lost channel serves again.
				again := bytes.Repeat([]byte{0x3C}, 8192)
				if err := f.Write(ctx, tg.ch, again, half-8192); err != nil {
					t.Fatalf("%v after its connection was re-established: %v", tg.ch, err)
				}
				got := make([]byte, len(payload))
				if err := f.Read(ctx, tg.ch, got, off); err != nil || !bytes.Equal(got, payload) {
					t.Fatalf("%v read of the write sent again: %v (equal %v)", tg.ch, err, bytes.Equal(got, payload))
				}
				close(stop)
				wg.Wait()
				select {
				case err := <-loadErr:
					t.Fatalf("the other channels' load failed: %v", err)
				default:
				}

				// Every acknowledged write is in the donor's region.
				region := make([]byte, size)
				if _, err := td.D.ReadRegion(testCred, region, 0); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(region[off:off+len(payload)], payload) {
					t.Error("the write sent again is not in the region")
				}
				if !bytes.Equal(region[half-8192:half], again) {
					t.Error("the write after the re-establishment is not in the region")
				}
				mmu.Lock()
				defer mmu.Unlock()
				if !bytes.Equal(region[half:], model[half:]) {
					t.Error("an acknowledged write of the other channels is not in the region")
				}
				if c.Rejoins() != 1 {
					t.Errorf("rejoins %d, want 1", c.Rejoins())
				}
			})
		}
	}
}

// TestBrokenConnectionRejoinedByNextRequest: a request whose context
// ends while it waits (here: a write a move holds) breaks its connection
// — its reply would come later, out of turn. That connection alone is
// re-established (before the failure is returned: see
// TestCancelledHeldWriteDoesNotLand) and the next request on that
// channel is served; no other connection is dialled again. That channel
// failed every later request of the session, with the first one's error.
func TestBrokenConnectionRejoinedByNextRequest(t *testing.T) {
	for _, tc := range []struct {
		ch   Channel
		kind uint8
		n    int // connections the held write breaks
	}{{ChannelSync, protocol.KindSync, 1}, {ChannelBulk, protocol.KindBulk, 2}} {
		t.Run(tc.ch.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			td := memorytest.Start(t, 4<<20, 0)
			relay := memorytest.StartRelay(t, td.Addr)
			c := dial(t, td.Addr, Options{Dialer: relay.Dial, ChunkSize: 64 << 10})
			if err := td.D.PauseWrites(ctx, testCred); err != nil {
				t.Fatal(err)
			}
			before := relay.Dials()
			wctx, wcancel := context.WithCancel(ctx)
			res := make(chan error, 1)
			go func() { res <- c.Write(wctx, tc.ch, make([]byte, 256<<10), 0) }()
			waitUntil(ctx, t, "the write to be held", func() bool { return td.D.Waiting(testCred) == tc.n })
			wcancel()
			if err := <-res; !errors.Is(err, context.Canceled) {
				t.Fatalf("the cancelled write: %v", err)
			}
			if err := td.D.ResumeWrites(testCred); err != nil {
				t.Fatal(err)
			}
			p := bytes.Repeat([]byte{0x77}, 128<<10)
			if err := c.Write(ctx, tc.ch, p, 1<<20); err != nil {
				t.Fatalf("the next %v write: %v", tc.ch, err)
			}
			got := make([]byte, len(p))
			if err := c.Read(ctx, tc.ch, got, 1<<20); err != nil || !bytes.Equal(got, p) {
				t.Fatalf("the next %v read: %v (equal %v)", tc.ch, err, bytes.Equal(got, p))
			}
			after := relay.Dials()
			for _, k := range []uint8{protocol.KindControl, protocol.KindSync, protocol.KindBulk, protocol.KindQueue} {
				want := before[k]
				if k == tc.kind {
					want += tc.n
				}
				if after[k] != want {
					t.Errorf("connections of kind %d: %d, then %d", k, before[k], after[k])
				}
			}
			if c.Rejoins() != int64(tc.n) {
				t.Errorf("rejoins %d, want %d", c.Rejoins(), tc.n)
			}
		})
	}
}

// TestQueuePairRejoin: a queue pair of the application's own whose
// connection the donor closes (a move giving up on a stalled write's
// payload) is re-established alone: the requests pending on it are sent
// again on the new connection, and each completes once, without error,
// under the sequence number Post returned; the pair serves on. They
// failed with ErrDonorLost, and so did the pair.
func TestQueuePairRejoin(t *testing.T) {
	const size = 1 << 20
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	td := memorytest.Start(t, size, 0)
	td.D.RefusalWait = 50 * time.Millisecond
	relay := memorytest.StartRelay(t, td.Addr)
	c := dial(t, td.Addr, Options{Dialer: relay.Dial})
	q, err := c.NewQueuePair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := c.Write(ctx, ChannelBulk, bytes.Repeat([]byte{0x11}, 64<<10), 512<<10); err != nil {
		t.Fatal(err)
	}
	stalled := relay.Arm(protocol.KindQueue)
	const ops = 8
	bufs := make([][]byte, ops)
	seqs := map[uint64]uint32{}
	for i := range ops {
		op := Op{Tag: uint64(i)}
		if i%2 == 0 { // writes, the first one stalled
			op.Write, op.Off, op.Buf = true, int64(i)*8192, bytes.Repeat([]byte{byte(0x80 + i)}, 8192)
		} else { // reads of what the bulk write put there
			op.Off, op.Buf = 512<<10+int64(i)*4096, make([]byte, 4096)
		}
		bufs[i] = op.Buf
		seq, err := q.Post(ctx, op)
		if err != nil {
			t.Fatal(err)
		}
		seqs[op.Tag] = seq
	}
	<-stalled
	waitUntil(ctx, t, "the stalled write's first bytes in the region", func() bool {
		got := make([]byte, memorytest.StallSent)
		_, err := td.D.ReadRegion(testCred, got, 0)
		return err == nil && got[memorytest.StallSent-1] == 0x80
	})
	if err := td.D.TrackWrites(ctx, testCred, dirty.New(size, 4096)); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]Completion{}
	for len(got) < ops {
		select {
		case cp := <-q.Completions():
			if _, dup := got[cp.Tag]; dup {
				t.Fatalf("op %d completed twice", cp.Tag)
			}
			got[cp.Tag] = cp
		case <-ctx.Done():
			t.Fatalf("completions: %v", got)
		}
	}
	if err := td.D.EndMove(testCred); err != nil {
		t.Fatal(err)
	}
	for tag, cp := range got {
		if cp.Err != nil || cp.Seq != seqs[tag] {
			t.Errorf("op %d: seq %d (posted as %d), %v", tag, cp.Seq, seqs[tag], cp.Err)
		}
		if tag%2 == 1 && !bytes.Equal(bufs[tag], bytes.Repeat([]byte{0x11}, 4096)) {
			t.Errorf("read %d: not the region's bytes", tag)
		}
	}
	region := make([]byte, ops*8192)
	if _, err := td.D.ReadRegion(testCred, region, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < ops; i += 2 {
		if !bytes.Equal(region[i*8192:(i+1)*8192], bufs[i]) {
			t.Errorf("write %d is not in the region", i)
		}
	}
	// The pair serves on, on its new connection.
	if _, err := q.Post(ctx, Op{Off: 0, Buf: make([]byte, 4096), Tag: 99}); err != nil {
		t.Fatal(err)
	}
	if cp := <-q.Completions(); cp.Err != nil || cp.Tag != 99 {
		t.Fatalf("a request after the re-establishment: %+v", cp)
	}
	// The session's own queue pair, this one, and this one's new
	// connection.
	if c.Rejoins() != 1 || relay.Dials()[protocol.KindQueue] != 3 {
		t.Errorf("rejoins %d, queue connections %d (want 1, 3)", c.Rejoins(), relay.Dials()[protocol.KindQueue])
	}
}

// TestRejoinAfterOwnBreakKeepsLaterWrite: a WRITE whose context ends
// while its payload is on its way fails, and the client breaks its
// connection; the next request re-establishes it. The donor still had
// the first WRITE under way on the old connection (the rest of its
// payload late in the network, or the write held by a move's pause):
// once the new connection's WRITE to the same range is acknowledged,
// nothing of the failed one may land over it. The donor admitted the new
// connection without knowing the old one was given up, and the late rest
// of the failed write landed over the acknowledged one.
func TestRejoinAfterOwnBreakKeepsLaterWrite(t *testing.T) {
	for _, tc := range []struct {
		ch   Channel
		kind uint8
	}{{ChannelSync, protocol.KindSync}, {ChannelBulk, protocol.KindBulk}} {
		t.Run(tc.ch.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			td := memorytest.Start(t, 4<<20, 0)
			relay := memorytest.StartRelay(t, td.Addr)
			c := dial(t, td.Addr, Options{Dialer: relay.Dial, Streams: 1, ChunkSize: 64 << 10})
			const n = 64 << 10
			old := bytes.Repeat([]byte{0xAA}, n)
			stalled, release, landed := relay.ArmHeld(tc.kind)
			wctx, wcancel := context.WithCancel(ctx)
			res := make(chan error, 1)
			go func() { res <- c.Write(wctx, tc.ch, old, 0) }()
			<-stalled
			wcancel()
			if err := <-res; !errors.Is(err, context.Canceled) || !errors.Is(err, protocol.ErrDonorLost) {
				t.Fatalf("the cancelled write: %v", err)
			}

			// The next write to the range, acknowledged.
			later := bytes.Repeat([]byte{0xBB}, n)
			if err := c.Write(ctx, tc.ch, later, 0); err != nil {
				t.Fatalf("the next %v write: %v", tc.ch, err)
			}
			if c.Rejoins() != 1 {
				t.Errorf("rejoins %d, want 1", c.Rejoins())
			}
			// The rest of the failed write arrives late.
			close(release)
			select {
			case <-landed:
			case <-ctx.Done():
				t.Fatal("the old connection did not end")
			}
			got := make([]byte, n)
			if _, err := td.D.ReadRegion(testCred, got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, later) {
				k := bytes.IndexByte(got, 0xAA)
				t.Fatalf("the acknowledged write was overwritten by the one that failed before it (first 0xAA at %d)", k)
			}
			// And the channel serves.
			if err := c.Read(ctx, tc.ch, got, 0); err != nil || !bytes.Equal(got, later) {
				t.Fatalf("read: %v (equal %v)", err, bytes.Equal(got, later))
			}
		})
	}
}

// TestOwnQueuePairRejoinedAfterTimeout: the client's own queue pair,
// whose WRITE times out (its payload held on its way by a relay), fails;
// the next request on the queue channel re-establishes it — a new queue
// connection naming the failed one — and succeeds, its write read back,
// while the late rest of the failed WRITE, once delivered, does not land
// over it. Before, the pair stayed failed for the session's life.
func TestOwnQueuePairRejoinedAfterTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	td := memorytest.Start(t, 4<<20, 0)
	relay := memorytest.StartRelay(t, td.Addr)
	c := dial(t, td.Addr, Options{Dialer: relay.Dial, Timeout: time.Second})
	const n = 4 << 10
	before := relay.Dials()
	stalled, release, landed := relay.ArmHeld(protocol.KindQueue)
	res := make(chan error, 1)
	go func() { res <- c.Write(ctx, ChannelQueue, bytes.Repeat([]byte{0xAA}, n), 0) }()
	<-stalled
	if err := <-res; !errors.Is(err, protocol.ErrDonorLost) {
		t.Fatalf("the write that timed out: %v", err)
	}

	later := bytes.Repeat([]byte{0xBB}, n)
	if err := c.Write(ctx, ChannelQueue, later, 0); err != nil {
		t.Fatalf("the next queue write: %v", err)
	}
	got := make([]byte, n)
	if err := c.Read(ctx, ChannelQueue, got, 0); err != nil || !bytes.Equal(got, later) {
		t.Fatalf("the next queue read: %v (equal %v)", err, bytes.Equal(got, later))
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
	if err := c.err(); err != nil {
		t.Fatalf("the session: %v", err)
	}
}
