package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// TestFailedWriteOrderedBeforeOtherChannels: a WRITE that fails — its
// context cancelled, or no answer within the request timeout — while
// the rest of its payload is late on its way to the donor (a relay holds
// it) has an unknown effect, but once the failure is returned nothing
// of it may land any more: the caller's next WRITE to the same range,
// on another channel of the session, is acknowledged, then the late rest
// of the failed one reaches the donor, and the region must hold the
// acknowledged bytes. For the sync and bulk channels, and a queue
// pair's abandoned request (a cancelled Client.Write) and failed one (a
// timeout, which fails the pair). The failed WRITE's connection was
// re-established only by the next request on its own channel, and the
// late rest landed over the acknowledged write.
func TestFailedWriteOrderedBeforeOtherChannels(t *testing.T) {
	for _, tc := range []struct {
		ch      Channel
		kind    uint8
		timeout bool // the request times out (else its context is cancelled)
		next    Channel
	}{
		{ChannelSync, protocol.KindSync, false, ChannelQueue},
		{ChannelSync, protocol.KindSync, true, ChannelBulk},
		{ChannelBulk, protocol.KindBulk, false, ChannelQueue},
		{ChannelQueue, protocol.KindQueue, false, ChannelSync},
		{ChannelQueue, protocol.KindQueue, true, ChannelBulk},
	} {
		name := fmt.Sprintf("%v/cancelled/then-%v", tc.ch, tc.next)
		if tc.timeout {
			name = fmt.Sprintf("%v/timeout/then-%v", tc.ch, tc.next)
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			td := memorytest.Start(t, 4<<20, 0)
			relay := memorytest.StartRelay(t, td.Addr)
			opts := Options{Dialer: relay.Dial, Streams: 1, ChunkSize: 64 << 10}
			if tc.timeout {
				opts.Timeout = time.Second
			}
			c := dial(t, td.Addr, opts)
			const n = 64 << 10
			old := bytes.Repeat([]byte{0xAA}, n)
			before := relay.Dials()
			stalled, release, landed := relay.ArmHeld(tc.kind)
			wctx, wcancel := context.WithCancel(ctx)
			defer wcancel()
			res := make(chan error, 1)
			go func() { res <- c.Write(wctx, tc.ch, old, 0) }()
			<-stalled
			if !tc.timeout {
				wcancel()
			}
			err := <-res
			if tc.timeout && !errors.Is(err, protocol.ErrDonorLost) || !tc.timeout && !errors.Is(err, context.Canceled) {
				t.Fatalf("the failed write: %v", err)
			}

			// The next write to the range, on another channel, acknowledged.
			later := bytes.Repeat([]byte{0xBB}, n)
			if err := c.Write(ctx, tc.next, later, 0); err != nil {
				t.Fatalf("the next write, on the %v channel: %v", tc.next, err)
			}
			// The rest of the failed write arrives late.
			close(release)
			select {
			case <-landed:
			case <-ctx.Done():
				t.Fatal("the failed write's connection did not end")
			}
			got := make([]byte, n)
			if _, err := td.D.ReadRegion(testCred, got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, later) {
				t.Fatalf("the acknowledged %v write was overwritten by the %v write that failed before it (first 0xAA at %d)",
					tc.next, tc.ch, bytes.IndexByte(got, 0xAA))
			}
			// One new connection named the failed write's: the failed
			// request's re-established, or, for a queue pair that
			// failed, the one its next request goes on on (below).
			newConns := func(when string) {
				t.Helper()
				after := relay.Dials()
				for _, k := range []uint8{protocol.KindSync, protocol.KindBulk, protocol.KindQueue} {
					want := 0
					if k == tc.kind {
						want = 1
					}
					if d := after[k] - before[k]; d != want {
						t.Errorf("%s: %d new connection(s) of kind %d, want %d", when, d, k, want)
					}
				}
			}
			newConns("after the failure")
			if err := c.err(); err != nil {
				t.Fatalf("the session after the failed write: %v", err)
			}
			// And the failed write's channel serves (the client's queue
			// pair that timed out is re-established by this request).
			if err := c.Read(ctx, tc.ch, got, 0); err != nil || !bytes.Equal(got, later) {
				t.Fatalf("%v read: %v (equal %v)", tc.ch, err, bytes.Equal(got, later))
			}
			// A queue pair that timed out goes on on the connection that
			// ended the failed one: no HELLO more.
			newConns("after the channel served again")
			if c.Rejoins() != 1 {
				t.Errorf("rejoins %d, want 1", c.Rejoins())
			}
		})
	}
}

// TestCancelledHeldWriteDoesNotLand: a WRITE a move's pause holds
// (Donor.PauseWrites) whose context is cancelled fails, and by then the
// donor holds it no more — its connection was ended, the write given up
// — so that it cannot land when the writes resume, after a WRITE to the
// same range the caller issued on another channel once it had the
// failure (held by the same pause, then acknowledged). Over TLS too (a
// queue pair's connection is ended for reading through its TLS session's
// TCP connection). The cancelled write stayed held until the writes
// resumed.
func TestCancelledHeldWriteDoesNotLand(t *testing.T) {
	for _, tc := range []struct {
		ch, next Channel
		n        int // the connections the write is held on
		tls      bool
	}{
		{ChannelSync, ChannelQueue, 1, false},
		{ChannelBulk, ChannelSync, 2, false},
		{ChannelQueue, ChannelBulk, 1, false},
		{ChannelSync, ChannelBulk, 1, true},
		{ChannelQueue, ChannelSync, 1, true},
	} {
		name := fmt.Sprintf("%v/then-%v", tc.ch, tc.next)
		if tc.tls {
			name += "/tls"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			opts := Options{ChunkSize: 64 << 10, QueueChunk: 64 << 10}
			var td *memorytest.Donor
			if tc.tls {
				ca := memorytest.NewCA(t)
				td = memorytest.StartTLS(t, memorytest.ServerTLS(t, ca), 4<<20, 0)
				opts.TLS = memorytest.ClientTLS(t, ca)
			} else {
				td = memorytest.Start(t, 4<<20, 0)
			}
			c := dial(t, td.Addr, opts)
			if err := td.D.PauseWrites(ctx, testCred); err != nil {
				t.Fatal(err)
			}
			old := bytes.Repeat([]byte{0xAA}, 64<<10*tc.n)
			wctx, wcancel := context.WithCancel(ctx)
			res := make(chan error, 1)
			go func() { res <- c.Write(wctx, tc.ch, old, 0) }()
			waitUntil(ctx, t, "the write to be held", func() bool { return td.D.Waiting(testCred) == tc.n })
			wcancel()
			if err := <-res; !errors.Is(err, context.Canceled) {
				t.Fatalf("the cancelled write: %v", err)
			}
			if w := td.D.Waiting(testCred); w != 0 {
				t.Fatalf("the cancelled write has failed, and the donor still holds %d write(s): they land when the writes resume", w)
			}

			later := bytes.Repeat([]byte{0xBB}, len(old))
			next := make(chan error, 1)
			go func() { next <- c.Write(ctx, tc.next, later, 0) }()
			waitUntil(ctx, t, "the next write to be held", func() bool { return td.D.Waiting(testCred) > 0 })
			if err := td.D.ResumeWrites(testCred); err != nil {
				t.Fatal(err)
			}
			if err := <-next; err != nil {
				t.Fatalf("the next write, on the %v channel: %v", tc.next, err)
			}
			got := make([]byte, len(old))
			if _, err := td.D.ReadRegion(testCred, got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, later) {
				t.Fatalf("the acknowledged write was overwritten by the cancelled one (first 0xAA at %d)", bytes.IndexByte(got, 0xAA))
			}
			if err := c.Read(ctx, tc.ch, got, 0); err != nil || !bytes.Equal(got, later) {
				t.Fatalf("%v read: %v (equal %v)", tc.ch, err, bytes.Equal(got, later))
			}
		})
	}
}
