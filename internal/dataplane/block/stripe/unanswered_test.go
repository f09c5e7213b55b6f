package stripe

import (
	"slices"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// gatedUnit is the stripe unit of twoGatedParts's attachments.
const gatedUnit = 64 << 10

// forCacheModes runs f as a subtest without, then with, a write-back
// cache.
func forCacheModes(t *testing.T, f func(t *testing.T, wb bool)) {
	for _, wb := range []bool{false, true} {
		name := "write-through"
		if wb {
			name = "write-back"
		}
		t.Run(name, func(t *testing.T) { f(t, wb) })
	}
}

// twoGatedParts attaches a volume of two parts over gated memory lenders
// and dials it; m1 is part 1's lender's memory.
func twoGatedParts(t *testing.T, wb bool) (*Attachment, *nbd.Client, *gatedMem) {
	t.Helper()
	m0, m1 := newGatedMem(4<<20), newGatedMem(4<<20)
	l0, l1 := startLenderWith(t, m0), startLenderWith(t, m1)
	a := attach(t, AttachConfig{URIs: []string{l0.uri, l1.uri}, StripeUnit: gatedUnit, ConnsPerPart: 1, WriteBack: wb})
	return a, dialAttachment(t, a), m1
}

// TestUnansweredWritesNamesHeldPart: a write whose lender holds it is
// counted against its part, and only that part, until the lender answers
// it; with a write-back cache too, which has acknowledged it already.
func TestUnansweredWritesNamesHeldPart(t *testing.T) {
	forCacheModes(t, func(t *testing.T, wb bool) {
		a, c, m1 := twoGatedParts(t, wb)
		if got := a.Volume().UnansweredWrites(); !slices.Equal(got, []int64{0, 0}) {
			t.Fatalf("unanswered writes before any write: %v, want [0 0]", got)
		}
		release := m1.hold(t)
		written := make(chan error, 1)
		go func() {
			_, err := c.WriteAt(pattern(4096, 7), gatedUnit) // part 1's first unit
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

// TestUnansweredFinalFlushNamesHeldPart: once every write was answered,
// the close's final flush to a part whose lender does not answer it is
// reported against that part, and only that part (the one with writes to
// flush), until the lender answers.
func TestUnansweredFinalFlushNamesHeldPart(t *testing.T) {
	forCacheModes(t, func(t *testing.T, wb bool) {
		a, c, m1 := twoGatedParts(t, wb)
		if _, err := c.WriteAt(pattern(4096, 9), gatedUnit); err != nil { // part 1's first unit
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
