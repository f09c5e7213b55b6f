package donor

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// stallMoves are the two waits of a move for the writes under way: the
// withheld write is untracked when TrackWrites waits for it, admitted by
// the gate (tracking started before it) when PauseWrites does.
var stallMoves = []struct {
	name   string
	before func(t *testing.T, d *Donor, m *dirty.Map) // before the write
	move   func(ctx context.Context, d *Donor, m *dirty.Map) error
}{
	{"TrackWrites", nil, func(ctx context.Context, d *Donor, m *dirty.Map) error {
		return d.TrackWrites(ctx, testCred, m)
	}},
	{"PauseWrites", func(t *testing.T, d *Donor, m *dirty.Map) {
		if err := d.TrackWrites(context.Background(), testCred, m); err != nil {
			t.Fatal(err)
		}
	}, func(ctx context.Context, d *Donor, _ *dirty.Map) error {
		return d.PauseWrites(ctx, testCred)
	}},
}

// dataKinds are the kinds of data connection a borrower opens, named for
// subtests.
var dataKinds = []struct {
	kind uint8
	name string
}{{protocol.KindSync, "sync"}, {protocol.KindQueue, "queue"}}

const stallSize, stallOff, stallLen, stallSent = 1 << 20, 5 * 4096, 4096, 100

// eachStall runs f as a subtest for each move (stallMoves, mv its index)
// and kind of data connection (dataKinds), with a dirty map m of the
// region's size.
func eachStall(t *testing.T, f func(t *testing.T, mv int, kind uint8, m *dirty.Map)) {
	for mv, mk := range stallMoves {
		for _, k := range dataKinds {
			t.Run(mk.name+"/"+k.name, func(t *testing.T) { f(t, mv, k.kind, dirty.New(stallSize, 4096)) })
		}
	}
}

// stalledWrite is withheldWrite of stallLen bytes at stallOff, with
// stallSent sent, after mv's before.
func stalledWrite(t *testing.T, kind uint8, mv int, m *dirty.Map, setup func(*Donor)) (d *Donor, addr string, ctrl, c net.Conn, sess uint64) {
	t.Helper()
	d, addr, ctrl, c, sess, _ = withheldWrite(t, stallSize, kind, stallOff, stallLen, stallSent, func(d *Donor) {
		if setup != nil {
			setup(d)
		}
		if b := stallMoves[mv].before; b != nil {
			b(t, d, m)
		}
	})
	return d, addr, ctrl, c, sess
}

// send sends h with payload on c.
func send(t *testing.T, c net.Conn, h protocol.Header, payload []byte) {
	t.Helper()
	h.Payload = uint32(len(payload))
	b := make([]byte, protocol.HeaderSize, protocol.HeaderSize+len(payload))
	h.Encode(b)
	if _, err := c.Write(append(b, payload...)); err != nil {
		t.Fatalf("op %d: %v", h.Op, err)
	}
}

// answer reads an answer on c: its status and payload.
func answer(c net.Conn) (uint16, []byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	var b [protocol.HeaderSize]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, nil, err
	}
	rh, err := protocol.DecodeHeader(b[:])
	if err != nil {
		return 0, nil, err
	}
	data := make([]byte, rh.Payload)
	if _, err := io.ReadFull(c, data); err != nil {
		return 0, nil, err
	}
	return binary.BigEndian.Uint16(b[6:]), data, nil
}

// request sends h with payload on c and reads the answer.
func request(t *testing.T, c net.Conn, h protocol.Header, payload []byte) (uint16, []byte) {
	t.Helper()
	send(t, c, h, payload)
	st, data, err := answer(c)
	if err != nil {
		t.Fatalf("op %d: %v", h.Op, err)
	}
	return st, data
}

// TestMoveClosesOnlyTheWithholdingConnection: a move that gives up on a
// withheld payload closes that write's connection, and only it: the
// session lives (its control connection answers PING) and its other
// connections are served on, a READ at once, a WRITE held by the pause
// until it is lifted (or, while the move tracks, marked). It ended the
// whole session.
func TestMoveClosesOnlyTheWithholdingConnection(t *testing.T) {
	eachStall(t, func(t *testing.T, mv int, kind uint8, m *dirty.Map) {
		mk := stallMoves[mv]
		d, addr, ctrl, c, sess := stalledWrite(t, kind, mv, m, nil)
		other, _ := dialHello(t, addr, kind, sess, testCred)
		defer other.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := mk.move(ctx, d, m); err != nil {
			t.Fatal(err)
		}
		sendRestUnanswered(t, c, stallLen-stallSent)

		if st, _ := request(t, ctrl, protocol.Header{Op: protocol.OpPing, Seq: 7}, nil); st != protocol.StatusOK {
			t.Errorf("PING on the session's control connection: status %d", st)
		}
		st, data := request(t, other, protocol.Header{Op: protocol.OpRead, Seq: 8, Offset: stallOff, Length: stallLen}, nil)
		if st != protocol.StatusOK || len(data) != stallLen {
			t.Fatalf("READ on the session's other connection: status %d, %d bytes", st, len(data))
		}
		const off2 = 8 * 4096
		payload := bytes.Repeat([]byte{0x5A}, 4096)
		if mk.name == "PauseWrites" {
			send(t, other, protocol.Header{Op: protocol.OpWrite, Seq: 9, Offset: off2, Length: 4096}, payload)
			poll(t, "the other connection's write to be held", func() bool { return d.Waiting(testCred) == 1 })
			if err := d.ResumeWrites(testCred); err != nil {
				t.Fatal(err)
			}
			if st, _, err := answer(other); err != nil || st != protocol.StatusOK {
				t.Fatalf("the other connection's held WRITE: status %d, %v", st, err)
			}
		} else {
			if st, _ := request(t, other, protocol.Header{Op: protocol.OpWrite, Seq: 9, Offset: off2, Length: 4096}, payload); st != protocol.StatusOK {
				t.Fatalf("the other connection's WRITE: status %d", st)
			}
			if r := m.Take(); len(r) == 0 || r[len(r)-1] != (dirty.Range{Off: off2, Len: 4096}) {
				t.Errorf("dirty = %v, want the other connection's write last", r)
			}
		}
		got := make([]byte, len(payload))
		if _, err := d.ReadRegion(testCred, got, off2); err != nil || !bytes.Equal(got, payload) {
			t.Errorf("the other connection's write is not in the region (%v)", err)
		}
	})
}

// busyWriter is the handler of the region's data connection with a write
// under way.
func busyWriter(t *testing.T, d *Donor) *writer {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for w := range d.regions[credKey(testCred)].writers {
		if busy, _ := w.Writing(true); busy {
			return w
		}
	}
	t.Fatal("no write under way")
	return nil
}

// trickler sends a withheld write's payload a chunk at a time on c and
// moves the donor's fake clock.
type trickler struct {
	t    *testing.T
	c    net.Conn
	w    *writer
	fc   *clock.Fake
	t0   time.Time
	at   int
	done <-chan error // the move's
}

const trickleChunk = 100

// chunk sends the next trickleChunk bytes (0xAB) of the payload and waits
// until the handler has received them; the move must not return
// meanwhile.
func (tr *trickler) chunk() {
	t := tr.t
	t.Helper()
	if tr.at+trickleChunk >= stallLen {
		t.Fatal("the payload ran out")
	}
	_, rcv := tr.w.Writing(true)
	if _, err := tr.c.Write(bytes.Repeat([]byte{0xAB}, trickleChunk)); err != nil {
		t.Fatal(err)
	}
	tr.at += trickleChunk
	poll(t, "the chunk to be received", func() bool {
		select {
		case err := <-tr.done:
			t.Fatalf("the move returned (%v) with the write's payload arriving", err)
		default:
		}
		_, n := tr.w.Writing(true)
		return n > rcv
	})
}

// until sends a chunk per step of the clock until step would take it to
// until (from t0) or beyond.
func (tr *trickler) until(step, until time.Duration) {
	for tr.fc.Since(tr.t0)+step < until {
		tr.chunk()
		tr.fc.Advance(step)
	}
}

// startTrickle starts mv's move of d, whose write under way on c waits for
// its payload, and returns once the move waits on fc.
func startTrickle(t *testing.T, d *Donor, c net.Conn, fc *clock.Fake, t0 time.Time, mv int, m *dirty.Map) *trickler {
	t.Helper()
	w := busyWriter(t, d)
	done := make(chan error, 1)
	go func() { done <- stallMoves[mv].move(t.Context(), d, m) }()
	if err := fc.BlockUntil(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	return &trickler{t: t, c: c, w: w, fc: fc, t0: t0, at: stallSent, done: done}
}

// TestMoveWaitsWhileThePayloadArrives: a WRITE whose payload arrives
// slowly, a chunk every 3/4 of RefusalWait, is waited for well past
// RefusalWait (the fake clock's): the move returns once it is in the
// region, acknowledged and marked. The move gave up on it after
// RefusalWait, as on a withheld one.
func TestMoveWaitsWhileThePayloadArrives(t *testing.T) {
	const wait = time.Second
	eachStall(t, func(t *testing.T, mv int, kind uint8, m *dirty.Map) {
		t0 := time.Unix(1e9, 0)
		fc := clock.NewFake(t0)
		d, _, _, c, _ := stalledWrite(t, kind, mv, m, func(d *Donor) { d.RefusalWait, d.Clock = wait, fc })
		tr := startTrickle(t, d, c, fc, t0, mv, m)
		tr.until(wait*3/4, 6*wait)
		if _, err := c.Write(bytes.Repeat([]byte{0xAB}, stallLen-tr.at)); err != nil {
			t.Fatal(err)
		}
		if err := <-tr.done; err != nil {
			t.Fatal(err)
		}
		if st, _, err := answer(c); err != nil || st != protocol.StatusOK {
			t.Fatalf("the slow write's answer: status %d, %v", st, err)
		}
		got := make([]byte, stallLen)
		if _, err := d.ReadRegion(testCred, got, stallOff); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{0xAB}, stallLen)) {
			t.Errorf("the slow write is not in the region (%v)", err)
		}
		if stallMoves[mv].name == "PauseWrites" {
			if r := m.Take(); len(r) != 1 || r[0] != (dirty.Range{Off: stallOff, Len: stallLen}) {
				t.Errorf("dirty = %v, want the slow write's range", r)
			}
		}
	})
}

// TestMoveWaitLimit: a WRITE whose payload trickles in is waited for up
// to RefusalWaitLimit only: its connection is closed then, and the rest
// of its payload never lands.
func TestMoveWaitLimit(t *testing.T) {
	const wait, limit = time.Second, 4 * time.Second
	eachStall(t, func(t *testing.T, mv int, kind uint8, m *dirty.Map) {
		t0 := time.Unix(1e9, 0)
		fc := clock.NewFake(t0)
		d, _, _, c, _ := stalledWrite(t, kind, mv, m, func(d *Donor) {
			d.RefusalWait, d.RefusalWaitLimit, d.Clock = wait, limit, fc
		})
		tr := startTrickle(t, d, c, fc, t0, mv, m)
		tr.until(wait*3/4, limit)
		// One more chunk: the limit runs out within this step.
		tr.chunk()
		fc.Advance(wait * 3 / 4)
		if fc.Since(t0) < limit {
			t.Fatalf("the fake clock is at %v, before the limit", fc.Since(t0))
		}
		if err := <-tr.done; err != nil {
			t.Fatal(err)
		}
		snap := make([]byte, stallLen)
		if _, err := d.ReadRegion(testCred, snap, stallOff); err != nil {
			t.Fatal(err)
		}
		sendRestUnanswered(t, c, stallLen-tr.at)
		if err := d.SuspendRegion(testCred); err != nil { // waits for the handlers
			t.Fatal(err)
		}
		got := make([]byte, stallLen)
		if _, err := d.ReadRegion(testCred, got, stallOff); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, snap) {
			t.Error("the slow write landed after the move stopped it")
		}
	})
}
