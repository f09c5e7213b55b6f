package placement

import (
	"testing"
	"time"
)

// TestIndexClock: Advance moves work forward at predicted rates, so a
// running lease's deadline is judged on what is left.
func TestIndexClock(t *testing.T) {
	s := seed000Snapshot(1, 2) // two writers sharing one device, 477 MB/s each
	s.Leases[0].Deadline = 400 * time.Second
	x := NewIndex(s)
	p, ok := x.Prediction("w0")
	if !ok || p.Bandwidth != SMUFINWriterDemand || p.Late {
		t.Fatalf("before: %+v", p)
	}
	x.Advance(100 * time.Second)
	if x.Now() != 100*time.Second {
		t.Fatalf("now %v", x.Now())
	}
	p, _ = x.Prediction("w0")
	secs := (SMUFINWriterWork - 100*SMUFINWriterDemand) / SMUFINWriterDemand
	want := time.Duration(int64(secs * 1e9))
	if d := p.Completion - want; d < -time.Millisecond || d > time.Millisecond {
		t.Fatalf("completion after 100 s: %v, want %v", p.Completion, want)
	}
	// A third writer would slow w0 to 417 MB/s: 102.3 GB left takes 245 s,
	// finishing at 345 s < 400 s, so it is placed.
	r := Request{Kind: KindBlock, Size: 1 << 30, Borrower: "c0", Bandwidth: SMUFINWriterDemand, Mode: ModeShared}
	if _, err := x.Place(r); err != nil {
		t.Fatalf("place after advance: %v", err)
	}
	// At time 0 the same placement would push w0 to 360 s: still fine; with
	// a 350 s deadline it would not be.
	s.Leases[0].Deadline = 350 * time.Second
	if _, err := Place(s, r); err == nil {
		t.Fatal("placement pushing w0 past its deadline accepted")
	}
	x.Advance(50 * time.Second) // earlier: ignored
	if x.Now() != 100*time.Second {
		t.Fatal("clock went back")
	}
	if _, ok := x.Prediction("nope"); ok {
		t.Fatal("unknown lease")
	}
}
