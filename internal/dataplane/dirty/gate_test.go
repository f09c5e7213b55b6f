package dirty

import (
	"context"
	"errors"
	"testing"
	"time"
)

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // polling, not synchronisation
	}
}

func TestGate(t *testing.T) {
	ctx := context.Background()
	var w Writes
	if w.Begin() != nil {
		t.Fatal("a range without a move has a gate")
	}
	// An untracked write under way holds Track back until it ends.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	g := w.Install()
	m := New(1<<20, 4096)
	if err := w.Track(short, g, m); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Track with an untracked write under way: %v", err)
	}
	w.EndUntracked()
	if err := w.Track(ctx, g, m); err != nil {
		t.Fatal(err)
	}

	// A write admitted marks its range when it leaves.
	if w.Begin() != g || g.Enter(ctx) != nil {
		t.Fatal("a write was not admitted")
	}
	paused := make(chan error, 1)
	go func() { paused <- w.Pause(ctx, g) }()
	waitFor(t, "the pause", g.Paused)
	select {
	case err := <-paused:
		t.Fatalf("Pause returned with a write under way: %v", err)
	default:
	}
	g.Leave(8192, 4096)
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if got := m.Take(); len(got) != 1 || got[0].Off != 8192 {
		t.Fatalf("dirty ranges %v, want the write's", got)
	}

	// A write that starts while paused is held; Retire refuses it.
	held := make(chan error, 1)
	go func() { held <- g.Enter(ctx) }()
	waitFor(t, "the held write", func() bool { return g.Waiting() == 1 })
	g.Retire()
	if err := <-held; !errors.Is(err, ErrRetired) {
		t.Fatalf("held write after Retire: %v", err)
	}
	if err := g.Enter(ctx); !errors.Is(err, ErrRetired) || !g.Retired() {
		t.Fatalf("write after Retire: %v", err)
	}

	// A held write whose connection ends gives up with ctx's error.
	w2 := Writes{}
	g2 := w2.Install()
	if err := w2.Pause(ctx, g2); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	held2 := make(chan error, 1)
	go func() { held2 <- g2.Enter(cctx) }()
	waitFor(t, "the second held write", func() bool { return g2.Waiting() == 1 })
	ccancel()
	if err := <-held2; !errors.Is(err, context.Canceled) || g2.Waiting() != 0 {
		t.Fatalf("held write whose context ended: %v (waiting %d)", err, g2.Waiting())
	}
	// The same with EnterUntil: the writer's end (a closed channel).
	ended := make(chan struct{})
	held3 := make(chan error, 1)
	go func() { held3 <- g2.EnterUntil(ended) }()
	waitFor(t, "the third held write", func() bool { return g2.Waiting() == 1 })
	close(ended)
	if err := <-held3; !errors.Is(err, ErrEnded) || g2.Waiting() != 0 {
		t.Fatalf("held write whose writer ended: %v (waiting %d)", err, g2.Waiting())
	}
	// End resumes: writes pass again, and Remove makes them untracked.
	g2.End()
	if err := g2.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	g2.Leave(0, 1)
	if w2.Remove() != g2 || w2.Begin() != nil {
		t.Fatal("Remove left the gate in place")
	}
	w2.EndUntracked()
}

// TestDrainWaitsForRefusals: once the range is retired, Drain waits for
// the writes held then to be refused and for EnterUntil's refusals to be
// answered (their connections close when it returns), not only for the
// writes admitted.
func TestDrainWaitsForRefusals(t *testing.T) {
	var w Writes
	g := w.Install()
	if err := w.Pause(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	held := make(chan error, 1)
	go func() { held <- g.EnterUntil(ended) }()
	waitFor(t, "the held write", func() bool { return g.Waiting() == 1 })
	// A Drain that would have to wait returns the (ended) context's error.
	over, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Drain(over); err != nil {
		t.Fatalf("Drain of a paused gate waited for a held write: %v", err)
	}
	g.Retire()
	// Whether or not the held write has woken yet, it is to be answered.
	if err := g.Drain(over); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain right after Retire: %v, want it to wait for the held write", err)
	}
	if err := <-held; !errors.Is(err, ErrRetired) {
		t.Fatalf("held write after Retire: %v", err)
	}
	if err := g.Drain(over); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain with a refusal unanswered: %v, want it to wait", err)
	}
	drained := make(chan error, 1)
	go func() { drained <- g.Drain(context.Background()) }()
	g.Answered()
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	// A write refused without being held, answered: nothing to wait for.
	if err := g.EnterUntil(ended); !errors.Is(err, ErrRetired) {
		t.Fatalf("write after Retire: %v", err)
	}
	g.Answered()
	if err := g.Drain(over); err != nil {
		t.Fatalf("Drain with every refusal answered: %v", err)
	}

	// A held write whose writer ends at the retirement has nothing to
	// answer; Drain does not wait for it once it has left.
	var w2 Writes
	g2 := w2.Install()
	if err := w2.Pause(context.Background(), g2); err != nil {
		t.Fatal(err)
	}
	ended3 := make(chan struct{})
	held3 := make(chan error, 1)
	go func() { held3 <- g2.EnterUntil(ended3) }()
	waitFor(t, "the third held write", func() bool { return g2.Waiting() == 1 })
	drained2 := make(chan error, 1)
	go func() {
		g2.Retire()
		drained2 <- g2.Drain(context.Background())
	}()
	close(ended3)
	err := <-held3
	if errors.Is(err, ErrRetired) {
		g2.Answered() // it saw the retirement before its end
	} else if !errors.Is(err, ErrEnded) {
		t.Fatalf("held write whose writer ended: %v", err)
	}
	if err := <-drained2; err != nil {
		t.Fatal(err)
	}
}

// TestGateReserve: Reserve waits while the bytes pending would pass the
// limit (a write larger than it goes alone), until bytes are unreserved,
// its context ends, or the gate is retired or ended (then it reserves
// nothing); WaitChange sees a writer wait.
func TestGateReserve(t *testing.T) {
	ctx := context.Background()
	var w Writes
	g := w.Install()
	reserve := func(n int64) <-chan error {
		ch := make(chan error, 1)
		go func() {
			ok, err := g.Reserve(ctx, n, 100)
			if err == nil && !ok {
				err = errors.New("not reserved")
			}
			ch <- err
		}()
		return ch
	}
	if ok, err := g.Reserve(ctx, 150, 100); !ok || err != nil {
		t.Fatalf("a write over the limit, alone: %v %v", ok, err)
	}
	g.Unreserve(150)
	if ok, _ := g.Reserve(ctx, 60, 100); !ok {
		t.Fatal("not reserved")
	}
	second := reserve(60)
	if err := g.WaitChange(ctx, func(st Stats) bool { return st.Reserving == 1 }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-second:
		t.Fatalf("reserved past the limit: %v", err)
	default:
	}
	g.Unreserve(60)
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if st := g.Stats(); st.Pending != 60 || st.Peak != 150 || st.Reserving != 0 {
		t.Fatalf("stats %+v", st)
	}

	// Its context ends: nothing reserved.
	short, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := g.Reserve(short, 60, 100); done <- err }()
	if err := g.WaitChange(ctx, func(st Stats) bool { return st.Reserving == 1 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Reserve after its context ended: %v", err)
	}

	// Retired (or ended): the waiter goes on, unreserved.
	go func() {
		ok, err := g.Reserve(ctx, 60, 100)
		done <- errors.Join(err, map[bool]error{true: errors.New("reserved")}[ok])
	}()
	if err := g.WaitChange(ctx, func(st Stats) bool { return st.Reserving == 1 }); err != nil {
		t.Fatal(err)
	}
	g.Retire()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := g.Stats(); st.Pending != 60 {
		t.Fatalf("pending %d after the retirement, want the 60 reserved before", st.Pending)
	}

	var w2 Writes
	g2 := w2.Install()
	g2.Reserve(ctx, 100, 100)
	go func() {
		ok, err := g2.Reserve(ctx, 1, 100)
		done <- errors.Join(err, map[bool]error{true: errors.New("reserved")}[ok])
	}()
	if err := g2.WaitChange(ctx, func(st Stats) bool { return st.Reserving == 1 }); err != nil {
		t.Fatal(err)
	}
	w2.Remove().End()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
