package dirty

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
)

// testWriter is a writer (a connection, to the lenders) whose write under
// way the test drives.
type testWriter struct {
	mu       sync.Mutex
	writing  int // 0: none, 1: untracked, 2: admitted by the gate
	received int64
	stops    []error
	onStop   func() // the stopped write ends (in a goroutine of its own)
}

const (
	noWrite = iota
	untrackedWrite
	trackedWrite
)

func (w *testWriter) Writing(tracked bool) (bool, int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writing == untrackedWrite || (tracked && w.writing == trackedWrite), w.received
}

func (w *testWriter) Stop(why error) {
	w.mu.Lock()
	w.stops = append(w.stops, why)
	end := w.onStop
	w.mu.Unlock()
	if end != nil {
		go end()
	}
}

func (w *testWriter) receive(n int64) {
	w.mu.Lock()
	w.received += n
	w.mu.Unlock()
}

func (w *testWriter) stopped() []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]error(nil), w.stops...)
}

func writers(ws ...*testWriter) func() []Writer {
	return func() []Writer {
		out := make([]Writer, len(ws))
		for i, w := range ws {
			out[i] = w
		}
		return out
	}
}

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// startWait runs wait in a goroutine once the test's clock has its watch
// armed; the channel gets its error.
func startWait(t *testing.T, fc *clock.Fake, wait func() error) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- wait() }()
	if err := fc.BlockUntil(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	return done
}

func notYet(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned (%v) with a write under way", what, err)
	default:
	}
}

// TestPauseWithinStopsTheStalledWriter: a write admitted whose payload
// does not arrive for the wait has its writer stopped, and PauseWithin
// returns once it has left (marked), not before; the range's other
// writers are not stopped.
func TestPauseWithinStopsTheStalledWriter(t *testing.T) {
	var w Writes
	g := w.Install()
	m := New(1<<16, 4096)
	if err := w.Track(context.Background(), g, m); err != nil {
		t.Fatal(err)
	}
	if err := g.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	stalled := &testWriter{writing: trackedWrite, received: 100}
	stalled.onStop = func() {
		if got := m.Take(); len(got) != 0 {
			t.Errorf("dirty before the write left: %v", got)
		}
		g.Leave(4096, 100) // the stopped write fails and leaves
	}
	idle := &testWriter{}
	fc := clock.NewFake(t0)
	s := Stall{Wait: time.Second, Writers: writers(stalled, idle), Clock: fc}
	done := startWait(t, fc, func() error { return w.PauseWithin(context.Background(), g, s) })
	fc.Advance(999 * time.Millisecond)
	notYet(t, done, "PauseWithin")
	if got := stalled.stopped(); len(got) != 0 {
		t.Fatalf("stopped before the wait ran out: %v", got)
	}
	fc.Advance(time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := stalled.stopped(); len(got) != 1 || !errors.Is(got[0], ErrStalled) {
		t.Errorf("the stalled writer's stops: %v", got)
	}
	if got := idle.stopped(); len(got) != 0 {
		t.Errorf("a writer with no write under way was stopped: %v", got)
	}
	if got := m.Take(); len(got) != 1 || got[0] != (Range{Off: 4096, Len: 4096}) {
		t.Errorf("dirty = %v, want the stopped write's page", got)
	}
	if !g.Paused() {
		t.Error("not paused")
	}
	if fc.Waiters() != 0 {
		t.Errorf("%d timers left armed", fc.Waiters())
	}
	g.Resume()

	// Nothing under way: nothing stopped, however short the wait.
	s.Wait = time.Nanosecond
	if err := w.PauseWithin(context.Background(), g, s); err != nil {
		t.Fatal(err)
	}
	g.Resume()

	// The context ends first: not stopped, resumed.
	if err := g.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Wait = time.Hour
	if err := w.PauseWithin(ctx, g, s); !errors.Is(err, context.Canceled) {
		t.Errorf("PauseWithin = %v, want the context's error", err)
	}
	if g.Paused() {
		t.Error("still paused after the context ended")
	}
	g.Leave(0, 1)
	if got := stalled.stopped(); len(got) != 1 {
		t.Errorf("stopped again: %v", got)
	}
}

// TestStallWaitsWhileThePayloadArrives: a write whose payload keeps
// arriving, however slowly, is waited for well past the wait; only the
// limit stops it.
func TestStallWaitsWhileThePayloadArrives(t *testing.T) {
	var w Writes
	g := w.Install()
	if err := g.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	slow := &testWriter{writing: trackedWrite}
	slow.onStop = func() { g.Leave(0, 1) }
	fc := clock.NewFake(t0)
	const wait, limit = time.Second, 10 * time.Second
	s := Stall{Wait: wait, Limit: limit, Writers: writers(slow), Clock: fc}
	done := startWait(t, fc, func() error { return w.PauseWithin(context.Background(), g, s) })
	// A byte every 3/4 of the wait: never stopped for a stall.
	for fc.Since(t0) < limit-wait {
		slow.receive(1)
		fc.Advance(wait * 3 / 4)
		notYet(t, done, "PauseWithin")
		if got := slow.stopped(); len(got) != 0 {
			t.Fatalf("stopped after %v with its payload arriving: %v", fc.Since(t0), got)
		}
	}
	for len(slow.stopped()) == 0 && fc.Since(t0) < 2*limit {
		slow.receive(1)
		fc.Advance(wait / 4)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := slow.stopped(); len(got) != 1 || !errors.Is(got[0], ErrSlow) {
		t.Fatalf("the slow writer's stops: %v", got)
	}
	if d := fc.Since(t0); d < limit || d > limit+wait/4 {
		t.Errorf("stopped after %v, want the limit %v", d, limit)
	}
}

// TestTrackWithin: an untracked write under way whose payload does not
// arrive has its writer stopped, and TrackWithin returns once it has
// ended; a write the gate admitted is not what TrackWithin waits for, and
// its writer is not stopped.
func TestTrackWithin(t *testing.T) {
	var w Writes
	if w.Begin() != nil {
		t.Fatal("a gate before Install")
	}
	g := w.Install()
	if err := g.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	untracked := &testWriter{writing: untrackedWrite}
	untracked.onStop = w.EndUntracked // the stopped write fails and ends
	admitted := &testWriter{writing: trackedWrite}
	fc := clock.NewFake(t0)
	s := Stall{Wait: time.Second, Writers: writers(untracked, admitted), Clock: fc}
	done := startWait(t, fc, func() error { return w.TrackWithin(context.Background(), g, New(1<<16, 4096), s) })
	fc.Advance(time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := untracked.stopped(); len(got) != 1 || !errors.Is(got[0], ErrStalled) {
		t.Errorf("the untracked writer's stops: %v", got)
	}
	if got := admitted.stopped(); len(got) != 0 {
		t.Errorf("the admitted write's writer was stopped: %v", got)
	}
	g.Leave(0, 1)
	if err := w.TrackWithin(context.Background(), g, nil, s); err != nil {
		t.Fatal(err)
	}
}

// TestWritersIn: the listing is the set's at each call, a writer added or
// removed since it was made seen, and an empty one while the set is nil.
func TestWritersIn(t *testing.T) {
	var mu sync.Mutex
	var set map[*testWriter]struct{}
	list := WritersIn(&mu, &set)
	if ws := list(); len(ws) != 0 {
		t.Fatalf("a nil set lists %v", ws)
	}
	a, b := &testWriter{}, &testWriter{}
	mu.Lock()
	set = map[*testWriter]struct{}{a: {}, b: {}}
	mu.Unlock()
	if ws := list(); len(ws) != 2 || ws[0] == ws[1] || (ws[0] != a && ws[0] != b) || (ws[1] != a && ws[1] != b) {
		t.Fatalf("listed %v, want a and b", ws)
	}
	mu.Lock()
	delete(set, a)
	mu.Unlock()
	if ws := list(); len(ws) != 1 || ws[0] != b {
		t.Fatalf("listed %v after a left, want b", ws)
	}
}
