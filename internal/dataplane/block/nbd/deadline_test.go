package nbd

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/dirty"
)

// TestDeadlineRefusesLateRequests: an export's deadline (a lease's known
// expiry) refuses, ESHUTDOWN and without touching the backend, every
// request that arrives once it has passed, though nobody has suspended or
// removed the export (the agent's expiry timer has not fired); a request
// read before it but taken up by a worker after it is refused too. A
// moved deadline (a renewal) serves the export again.
func TestDeadlineRefusesLateRequests(t *testing.T) {
	const size = 1 << 20
	t0 := time.Date(2025, 3, 1, 13, 40, 18, 65_600_000, time.UTC)
	clk := clock.NewFake(t0.Add(-time.Second))
	dl := clock.NewDeadline(clk)
	dl.Set(t0)
	be := NewMemBackend(size)
	s := &Server{}
	if err := s.AddExport(Export{Name: "x", Backend: be, Deadline: dl}); err != nil {
		t.Fatal(err)
	}
	// Armed below: moves the clock as a worker takes up its first group.
	var armed atomic.Bool
	var groups atomic.Int32
	s.testHookGroup = func() {
		if armed.Load() && groups.Add(1) == 1 {
			clk.Advance(time.Second)
		}
	}
	addr := serveOn(t, s)
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission("x", false, false)
	h := uint64(0)
	do := func(typ uint16, off uint64, n int, payload []byte) rawReply {
		t.Helper()
		h++
		rc.request(Request{Type: typ, Handle: h, Offset: off, Length: uint32(n)}, payload)
		readLen := 0
		if typ == CmdRead {
			readLen = n
		}
		r, err := rc.reply(readLen)
		if err != nil {
			t.Fatal(err)
		}
		if r.handle != h {
			t.Fatalf("reply to %d, want %d", r.handle, h)
		}
		return r
	}
	ones, twos := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
	if r := do(CmdWrite, 0, len(ones), ones); r.errno != 0 {
		t.Fatalf("a write before the deadline: errno %d", r.errno)
	}

	clk.Advance(time.Second) // the deadline, to the nanosecond
	for _, c := range []struct {
		name    string
		typ     uint16
		n       int
		payload []byte
	}{
		{"write", CmdWrite, len(twos), twos},
		{"read", CmdRead, 4096, nil},
		{"flush", CmdFlush, 0, nil},
		{"write zeroes", CmdWriteZeroes, 4096, nil},
	} {
		if r := do(c.typ, 0, c.n, c.payload); r.errno != ESHUTDOWN {
			t.Errorf("a %s at the deadline: errno %d, want ESHUTDOWN", c.name, r.errno)
		}
	}
	got := make([]byte, 4096)
	if _, err := be.ReadAt(got, 0); err != nil || !bytes.Equal(got, ones) {
		t.Fatalf("after the deadline the backend holds %x... (%v), want the write before it", got[:4], err)
	}

	// Renewed: served again, on the same connection.
	dl.Set(t0.Add(time.Second))
	if r := do(CmdRead, 0, 4096, nil); r.errno != 0 || !bytes.Equal(r.data, ones) {
		t.Fatalf("a read after the renewal: errno %d", r.errno)
	}

	// Read before the deadline, taken up by a worker after it: while the
	// export moves its writes go to a worker, which finds the deadline
	// passed (the hook moves the clock as the worker takes it up).
	d := dirty.New(size, 4096)
	if err := s.TrackWrites(context.Background(), "x", d); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	if r := do(CmdWrite, 0, len(twos), twos); r.errno != ESHUTDOWN {
		t.Errorf("a write taken up after the deadline: errno %d, want ESHUTDOWN", r.errno)
	}
	if groups.Load() != 1 {
		t.Fatalf("the write went to %d workers' groups, want 1", groups.Load())
	}
	if _, err := be.ReadAt(got, 0); err != nil || !bytes.Equal(got, ones) {
		t.Fatalf("the backend holds %x... (%v), want the write before the deadline", got[:4], err)
	}
	if r := d.Take(); len(r) != 0 {
		t.Errorf("the refused write was marked for the move: %v", r)
	}
}
