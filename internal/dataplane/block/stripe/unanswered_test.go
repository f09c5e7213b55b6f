package stripe

import (
	"slices"
	"testing"
)

// TestUnansweredWritesNamesHeldPart: a write whose lender holds it is
// counted against its part, and only that part, until the lender answers
// it; with a write-back cache too, which has acknowledged it already.
func TestUnansweredWritesNamesHeldPart(t *testing.T) {
	for _, wb := range []bool{false, true} {
		name := "write-through"
		if wb {
			name = "write-back"
		}
		t.Run(name, func(t *testing.T) {
			const unit = 64 << 10
			m0, m1 := newGatedMem(4<<20), newGatedMem(4<<20)
			l0, l1 := startLenderWith(t, m0), startLenderWith(t, m1)
			a := attach(t, AttachConfig{URIs: []string{l0.uri, l1.uri}, StripeUnit: unit, ConnsPerPart: 1, WriteBack: wb})
			c := dialAttachment(t, a)
			if got := a.Volume().UnansweredWrites(); !slices.Equal(got, []int64{0, 0}) {
				t.Fatalf("unanswered writes before any write: %v, want [0 0]", got)
			}
			release := m1.hold(t)
			written := make(chan error, 1)
			go func() {
				_, err := c.WriteAt(pattern(4096, 7), unit) // part 1's first unit
				written <- err
			}()
			waitFor(t, "the write to reach part 1's lender", func() bool { return m1.in.Load() == 1 })
			if got := a.Volume().UnansweredWrites(); !slices.Equal(got, []int64{0, 1}) {
				t.Errorf("unanswered writes while part 1's lender holds one: %v, want [0 1]", got)
			}
			release()
			if err := <-written; err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the write to be answered", func() bool { return slices.Equal(a.Volume().UnansweredWrites(), []int64{0, 0}) })
		})
	}
}

// TestUnansweredFinalFlushNamesHeldPart: once every write was answered,
// the close's final flush to a part whose lender does not answer it is
// reported against that part, and only that part (the one with writes to
// flush), until the lender answers.
func TestUnansweredFinalFlushNamesHeldPart(t *testing.T) {
	for _, wb := range []bool{false, true} {
		name := "write-through"
		if wb {
			name = "write-back"
		}
		t.Run(name, func(t *testing.T) {
			const unit = 64 << 10
			m0, m1 := newGatedMem(4<<20), newGatedMem(4<<20)
			l0, l1 := startLenderWith(t, m0), startLenderWith(t, m1)
			a := attach(t, AttachConfig{URIs: []string{l0.uri, l1.uri}, StripeUnit: unit, ConnsPerPart: 1, WriteBack: wb})
			c := dialAttachment(t, a)
			if _, err := c.WriteAt(pattern(4096, 9), unit); err != nil { // part 1's first unit
				t.Fatal(err)
			}
			release := m1.holdFlushes(t)
			closed := make(chan error, 1)
			go func() { closed <- a.Close() }()
			waitFor(t, "the final flush to reach part 1's lender", func() bool {
				return slices.Equal(a.Volume().UnansweredFinalFlush(), []bool{false, true})
			})
			if got := a.Volume().UnansweredWrites(); !slices.Equal(got, []int64{0, 0}) {
				t.Errorf("unanswered writes while the final flush waits: %v, want [0 0]", got)
			}
			release()
			if err := <-closed; err != nil {
				t.Fatalf("close once the flush was answered: %v", err)
			}
			if got := a.Volume().UnansweredFinalFlush(); !slices.Equal(got, []bool{false, false}) {
				t.Errorf("unanswered final flush after it was answered: %v, want [false false]", got)
			}
		})
	}
}
