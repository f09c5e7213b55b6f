package donor

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// poll waits for cond, checking every millisecond, until the test's
// context ends.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-time.After(time.Millisecond):
		case <-t.Context().Done():
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// withheldWrite starts a donor of a size-byte region (RefusalWait 50 ms)
// and a session of it (sess, its control connection ctrl) with a
// connection c of kind, runs before (if any), then sends on c a WRITE of
// n bytes at off with its first sent bytes (0xAB) and never the rest, and
// waits until those are in the region; got holds the write's range as
// read then.
func withheldWrite(t *testing.T, size int64, kind uint8, off, n, sent int, before func(*Donor)) (d *Donor, addr string, ctrl, c net.Conn, sess uint64, got []byte) {
	t.Helper()
	d, addr = startDonor(t, size, 0)
	d.RefusalWait = 50 * time.Millisecond
	ctrl, sess = dialHello(t, addr, protocol.KindControl, 0, testCred)
	t.Cleanup(func() { ctrl.Close() })
	c, _ = dialHello(t, addr, kind, sess, testCred)
	t.Cleanup(func() { c.Close() })
	if before != nil {
		before(d)
	}
	frame := make([]byte, protocol.HeaderSize+sent)
	(&protocol.Header{Op: protocol.OpWrite, Seq: 1, Offset: uint64(off), Length: uint32(n), Payload: uint32(n)}).Encode(frame)
	copy(frame[protocol.HeaderSize:], bytes.Repeat([]byte{0xAB}, sent))
	if _, err := c.Write(frame); err != nil { // and never the rest
		t.Fatal(err)
	}
	got = make([]byte, n)
	poll(t, "the write's first bytes in the region", func() bool {
		_, err := d.ReadRegion(testCred, got, int64(off))
		return err == nil && got[sent-1] == 0xAB
	})
	return d, addr, ctrl, c, sess, got
}

// sendRestUnanswered sends the withheld rest (0xCD) of a write's payload on
// c, which the donor closed, and checks that no answer comes.
func sendRestUnanswered(t *testing.T, c net.Conn, rest int) {
	t.Helper()
	_, _ = c.Write(bytes.Repeat([]byte{0xCD}, rest))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, protocol.HeaderSize)); err == nil {
		t.Error("the connection of the withheld write answered")
	}
}

// TestPauseDoesNotWaitForAWithheldPayload: a borrower sends a WRITE's
// header and part of its payload, and withholds the rest, while a move
// tracks the region's writes. The write is under way (admitted after its
// header), and PauseWrites waits for the writes under way; it waited for
// this one until its context ended (the transfer's: only an abort ended
// it). It waits RefusalWait at most for a payload that does not arrive,
// then closes the write's connection: the write fails unacknowledged and
// leaves before PauseWrites returns — its part in the region is marked,
// and nothing of it lands afterwards. The session lives on: its next
// connection is admitted and its writes are held.
func TestPauseDoesNotWaitForAWithheldPayload(t *testing.T) {
	const size = 1 << 20
	const off, n, sent = 5 * 4096, 4096, 100
	for _, k := range dataKinds {
		kind := k.kind
		t.Run(k.name, func(t *testing.T) {
			ctx := context.Background()
			m := dirty.New(size, 4096)
			d, addr, _, c, sess, got := withheldWrite(t, size, kind, off, n, sent, func(d *Donor) {
				if err := d.TrackWrites(ctx, testCred, m); err != nil {
					t.Fatal(err)
				}
			})

			// Long enough to tell the bound from the context's end.
			pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if err := d.PauseWrites(pctx, testCred); err != nil {
				t.Fatalf("PauseWrites waited for the withheld payload until its context ended: %v", err)
			}
			// No write is under way: Drain returns at once, even with a
			// context that has ended.
			_, g, err := d.moving(testCred)
			if err != nil {
				t.Fatal(err)
			}
			done, stop := context.WithCancel(ctx)
			stop()
			if err := g.Drain(done); err != nil {
				t.Fatalf("a write is still under way once PauseWrites returned: %v", err)
			}
			if r := m.Take(); len(r) != 1 || r[0] != (dirty.Range{Off: off, Len: n}) {
				t.Errorf("dirty = %v, want the withheld write's range", r)
			}
			snap := make([]byte, n)
			if _, err := d.ReadRegion(testCred, snap, off); err != nil {
				t.Fatal(err)
			}
			// The write's connection was closed, the write never
			// acknowledged, and the rest of its payload does not land
			// (its handler is gone once the region is suspended).
			sendRestUnanswered(t, c, n-sent)

			// The session's next connection is admitted; its writes
			// are held by the pause, and go on once it is lifted.
			c2, _ := dialHello(t, addr, kind, sess, testCred)
			defer c2.Close()
			full := make([]byte, protocol.HeaderSize+n)
			(&protocol.Header{Op: protocol.OpWrite, Seq: 2, Offset: 2 * off, Length: n, Payload: n}).Encode(full)
			if _, err := c2.Write(full); err != nil {
				t.Fatal(err)
			}
			poll(t, "the next session's write to be held", func() bool { return d.Waiting(testCred) == 1 })
			if err := d.ResumeWrites(testCred); err != nil {
				t.Fatal(err)
			}
			_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(c2, full[:protocol.HeaderSize]); err != nil {
				t.Fatal(err)
			}
			if st := binary.BigEndian.Uint16(full[6:]); st != protocol.StatusOK {
				t.Errorf("the next session's write: status %d", st)
			}

			if err := d.SuspendRegion(testCred); err != nil { // waits for the handlers
				t.Fatal(err)
			}
			if _, err := d.ReadRegion(testCred, got, off); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, snap) {
				t.Error("the withheld write landed after PauseWrites returned")
			}
		})
	}
}

// TestTrackDoesNotWaitForAWithheldPayload: as above, with the write under
// way before the move starts: TrackWrites waits for the writes that
// started untracked, and waited for this one until its context ended. It
// waits RefusalWait at most for a payload that does not arrive, then
// closes the write's connection: the write fails unacknowledged, and
// nothing of it lands after TrackWrites returns.
func TestTrackDoesNotWaitForAWithheldPayload(t *testing.T) {
	const size = 1 << 20
	const off, n, sent = 5 * 4096, 4096, 100
	for _, k := range dataKinds {
		kind := k.kind
		t.Run(k.name, func(t *testing.T) {
			ctx := context.Background()
			d, _, _, c, _, got := withheldWrite(t, size, kind, off, n, sent, nil)
			tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if err := d.TrackWrites(tctx, testCred, dirty.New(size, 4096)); err != nil {
				t.Fatalf("TrackWrites waited for the withheld payload until its context ended: %v", err)
			}
			// No write that started untracked is under way: the wait
			// returns at once, even with a context that has ended.
			r, _, err := d.moving(testCred)
			if err != nil {
				t.Fatal(err)
			}
			done, stop := context.WithCancel(ctx)
			stop()
			if err := r.writes.WaitUntracked(done); err != nil {
				t.Fatalf("a write is still under way once TrackWrites returned: %v", err)
			}
			snap := make([]byte, n)
			if _, err := d.ReadRegion(testCred, snap, off); err != nil {
				t.Fatal(err)
			}
			sendRestUnanswered(t, c, n-sent)
			if err := d.SuspendRegion(testCred); err != nil { // waits for the handlers
				t.Fatal(err)
			}
			if _, err := d.ReadRegion(testCred, got, off); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, snap) {
				t.Error("the withheld write landed after TrackWrites returned")
			}
		})
	}
}
