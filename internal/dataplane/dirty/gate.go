package dirty

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrRetired refuses a write to a range whose move has switched over: the
// range is served elsewhere now.
var ErrRetired = errors.New("dirty: range retired (moved)")

// Writes is the write side of a range a lender serves (an NBD export, a
// memory region) as a move sees it: it counts the writes under way while
// no move is in progress, and holds the range's [Gate] while one is. The
// zero value is ready to use: no move, no write under way. Its methods are
// safe for concurrent use; Install and Remove are called under the
// caller's own lock of the range (so that two movers never install two
// gates).
//
// Without a move a write pays two atomic additions ([Writes.Begin],
// [Writes.EndUntracked]) and allocates nothing.
type Writes struct {
	untracked atomic.Int64 // writes that started without seeing a gate
	gate      atomic.Pointer[Gate]
}

// Begin counts a write that starts. It returns the range's gate (the
// caller then calls [Gate.Enter] and [Gate.Leave]) or nil (the caller
// then calls EndUntracked once the write has completed).
func (w *Writes) Begin() *Gate {
	w.untracked.Add(1)
	g := w.gate.Load()
	if g != nil {
		w.untracked.Add(-1)
	}
	return g
}

// EndUntracked ends a write Begin returned nil for.
func (w *Writes) EndUntracked() { w.untracked.Add(-1) }

// Gate returns the range's gate, nil when no move is in progress.
func (w *Writes) Gate() *Gate { return w.gate.Load() }

// Install returns the range's gate, creating it if there is none.
func (w *Writes) Install() *Gate {
	g := w.gate.Load()
	if g == nil {
		g = &Gate{wake: make(chan struct{})}
		w.gate.Store(g)
	}
	return g
}

// Remove takes the range's gate away (nil if there was none): writes from
// now on are untracked again.
func (w *Writes) Remove() *Gate { return w.gate.Swap(nil) }

// WaitUntracked waits until no write that started before the gate was
// installed is still under way, or ctx ends.
func (w *Writes) WaitUntracked(ctx context.Context) error {
	// Writes are short (one copy, one pwrite or fallocate) and nothing
	// signals the end of an untracked one: poll, backing off.
	wait := 50 * time.Microsecond
	for w.untracked.Load() != 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Millisecond)
	}
	return nil
}

// Track makes the writes that complete from now on mark m in g (nil stops
// marking) and returns once no write that could have missed m is still
// under way: everything written after it returns, or still under way then,
// is either in the copy the caller makes next or marked in m.
func (w *Writes) Track(ctx context.Context, g *Gate, m *Map) error {
	return w.TrackWithin(ctx, g, m, Stall{})
}

// TrackWithin is Track for writes a writer may stall once they started,
// as [Writes.PauseWithin]: while it waits for the untracked writes under
// way, s stops the writers of those that stall (their payload withheld,
// or, past s.Limit, still arriving), which must make them end promptly,
// and it goes on waiting for them until ctx ends. The zero Stall is
// Track.
func (w *Writes) TrackWithin(ctx context.Context, g *Gate, m *Map, s Stall) error {
	g.dirty.Store(m)
	return s.within(ctx, false, w.WaitUntracked)
}

// Pause holds the writes that have not started (they wait in
// [Gate.Enter]) and returns once every write under way has completed and
// been marked. If ctx ends first the writes are resumed and ctx's error
// returned.
func (w *Writes) Pause(ctx context.Context, g *Gate) error {
	return w.PauseWithin(ctx, g, Stall{})
}

// PauseWithin is Pause for writes a writer may stall once they started (a
// write admitted after its header waits for its payload): while it waits
// for the writes under way, s stops the writers of those that stall
// ([Stall]) — by closing their connections, which must make those writes
// end (fail) promptly — and it goes on waiting for them until ctx ends.
// The range's other writers are not stopped: their writes that have not
// started are held as by Pause. Like Pause it returns nil only once no
// write is under way: a write stopped has left the gate (and marked its
// range) before, and none can complete after. The zero Stall is Pause.
func (w *Writes) PauseWithin(ctx context.Context, g *Gate, s Stall) error {
	g.setPaused(true)
	err := s.within(ctx, true, func(ctx context.Context) error {
		if err := w.WaitUntracked(ctx); err != nil {
			return err
		}
		return g.Drain(ctx)
	})
	if err != nil {
		g.setPaused(false)
		return err
	}
	return nil
}

// Gate is the write gate of a range being moved: it marks the writes that
// complete in a dirty [Map], holds the writes that have not started while
// the copier takes its last pass ([Writes.Pause], [Gate.Resume]), and
// refuses them once the range is served elsewhere ([Gate.Retire]). The
// zero value is not usable: [Writes.Install] makes one. Safe for
// concurrent use.
type Gate struct {
	dirty atomic.Pointer[Map]

	mu       sync.Mutex
	paused   bool
	retired  bool
	ended    bool          // End was called: the gate is no longer the range's
	active   int           // writes admitted and not yet left
	waiting  int           // writes held by a pause
	refusing int           // writes EnterUntil refused, not yet Answered
	wake     chan struct{} // closed and replaced at every change of the above

	// The payload bytes of writes the lender has taken in while the
	// range moves and not yet written (Reserve, Unreserve): held by a
	// pause, or on their way to the range.
	pending     int64
	peak        int64 // the most pending has been
	reserveWait int   // writers waiting in Reserve
}

// changedLocked wakes the waiters; g.mu is held.
func (g *Gate) changedLocked() {
	close(g.wake)
	g.wake = make(chan struct{})
}

// Enter admits a write: it waits while writes are paused, and refuses it
// with [ErrRetired] once the range is retired, or with ctx's error when
// ctx (the connection) ends first.
func (g *Gate) Enter(ctx context.Context) error {
	if !g.enter(ctx.Done()) {
		return ctx.Err()
	}
	return g.admitted(false)
}

// ErrEnded is EnterUntil's error when its done channel closed first.
var ErrEnded = errors.New("dirty: the writer ended while its write was held")

// EnterUntil is Enter for a writer whose end is a closed channel (a
// session's) rather than a context: it refuses the write with [ErrEnded]
// once done is closed while the write is held.
//
// A write it refuses with [ErrRetired] still has a refusal to send, on a
// connection the retirer closes once [Gate.Drain] returns: the caller
// calls [Gate.Answered] once that refusal is sent (or could not be), and
// Drain waits for it.
func (g *Gate) EnterUntil(done <-chan struct{}) error {
	if !g.enter(done) {
		return ErrEnded
	}
	return g.admitted(true)
}

// Answered ends a write EnterUntil refused with [ErrRetired]: its refusal
// has been sent (or could not be).
func (g *Gate) Answered() {
	g.mu.Lock()
	g.refusing--
	if g.refusing == 0 {
		g.changedLocked()
	}
	g.mu.Unlock()
}

// enter waits while writes are paused and the range is not retired; false
// means done closed first. On true g.mu is held (admitted releases it).
func (g *Gate) enter(done <-chan struct{}) bool {
	g.mu.Lock()
	for first := true; g.paused && !g.retired; first = false {
		ch := g.wake
		g.waiting++
		if first {
			// A write newly held (WaitChange's watchers); one woken
			// and held again is not news, and must not wake the others
			// again, which would wake it again.
			g.changedLocked()
			ch = g.wake
		}
		g.mu.Unlock()
		select {
		case <-ch:
		case <-done:
			g.mu.Lock()
			g.waiting--
			if g.retired {
				g.changedLocked() // a Drain may wait for the held writes
			}
			g.mu.Unlock()
			return false
		}
		g.mu.Lock()
		g.waiting--
	}
	return true
}

// admitted ends a successful enter: ErrRetired (the write counted
// refusing if answer), or the write counted active; it releases g.mu.
func (g *Gate) admitted(answer bool) error {
	if g.retired {
		if answer {
			g.refusing++ // in place of its count in waiting, if it was held
		} else {
			g.changedLocked() // a Drain may wait for the held writes
		}
		g.mu.Unlock()
		return ErrRetired
	}
	g.active++
	g.mu.Unlock()
	return nil
}

// Leave ends a write Enter admitted, marking [off, off+n) dirty first.
func (g *Gate) Leave(off, n int64) {
	if d := g.dirty.Load(); d != nil {
		d.Mark(off, n)
	}
	g.mu.Lock()
	g.active--
	if g.active == 0 {
		g.changedLocked()
	}
	g.mu.Unlock()
}

func (g *Gate) setPaused(p bool) {
	g.mu.Lock()
	g.paused = p
	g.changedLocked()
	g.mu.Unlock()
}

// Resume lets the writes held by a pause proceed.
func (g *Gate) Resume() { g.setPaused(false) }

// End stops marking and resumes the writes (a move given up or removed);
// writers waiting in Reserve go on, unreserved.
func (g *Gate) End() {
	g.dirty.Store(nil)
	g.mu.Lock()
	g.ended = true
	g.mu.Unlock()
	g.Resume()
}

// Retire refuses the writes held and every write to come with ErrRetired.
func (g *Gate) Retire() {
	g.mu.Lock()
	g.retired = true
	g.changedLocked()
	g.mu.Unlock()
}

// Retired reports whether Retire was called.
func (g *Gate) Retired() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.retired
}

// Drain waits until no admitted write is under way and, once the range is
// retired, until the writes held then have left the gate and those
// EnterUntil refused are answered ([Gate.Answered]), or ctx ends (its
// error is returned then).
func (g *Gate) Drain(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.active > 0 || g.refusing > 0 || (g.retired && g.waiting > 0) {
		ch := g.wake
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			g.mu.Lock()
			return ctx.Err()
		}
		g.mu.Lock()
	}
	return nil
}

// Paused reports whether writes are paused.
func (g *Gate) Paused() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.paused
}

// Waiting reports how many writes a pause holds right now.
func (g *Gate) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}

// Reserve counts n bytes of a write's payload that the lender is about to
// take in (read off its connection into memory) while the range moves,
// until [Gate.Unreserve]: the write is then held by a pause, or on its way
// to the range. It first waits while limit bytes or more would be
// pending, which back-pressures the writer (it takes nothing more in; its
// client's sends wait): a pause that holds the writes for long, or a
// borrower writing faster than the range takes it, then costs the lender
// at most limit bytes, whatever the number of connections. A write
// larger than limit is taken in alone (with nothing else pending). It
// waits until ctx ends (its error is returned then, nothing reserved), or
// the gate is retired or ended: it then reserves nothing and reports
// false (the write is refused, or untracked, when it reaches the gate),
// as it does without waiting once it is. A limit of zero or less does
// not bound.
func (g *Gate) Reserve(ctx context.Context, n, limit int64) (bool, error) {
	g.mu.Lock()
	for first := true; limit > 0 && g.pending > 0 && g.pending+n > limit && !g.retired && !g.ended; first = false {
		ch := g.wake
		g.reserveWait++
		if first {
			g.changedLocked() // a writer newly waiting (WaitChange)
			ch = g.wake
		}
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			g.mu.Lock()
			g.reserveWait--
			g.mu.Unlock()
			return false, ctx.Err()
		}
		g.mu.Lock()
		g.reserveWait--
	}
	defer g.mu.Unlock()
	if g.retired || g.ended {
		return false, nil
	}
	g.pending += n
	g.peak = max(g.peak, g.pending)
	return true, nil
}

// Unreserve ends n bytes Reserve counted: the write has been written to
// the range (or refused, or dropped).
func (g *Gate) Unreserve(n int64) {
	g.mu.Lock()
	g.pending -= n
	if g.reserveWait > 0 {
		g.changedLocked()
	}
	g.mu.Unlock()
}

// Stats is a gate's state, as [Gate.Stats] reports it.
type Stats struct {
	// Held is how many writes a pause holds.
	Held int
	// Pending is the bytes reserved now ([Gate.Reserve]), Peak the most
	// they have been.
	Pending, Peak int64
	// Reserving is how many writers wait in Reserve.
	Reserving int
}

// Stats reports g's writes held and bytes pending.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return Stats{Held: g.waiting, Pending: g.pending, Peak: g.peak, Reserving: g.reserveWait}
}

// WaitChange waits until cond holds for g's [Stats], or ctx ends (its
// error is returned then). cond is looked at again whenever a write is
// newly held, a writer newly waits in Reserve, bytes are unreserved with
// writers waiting, or the gate's pause, retirement or writes admitted
// change; not at every reservation.
func (g *Gate) WaitChange(ctx context.Context, cond func(Stats) bool) error {
	for {
		g.mu.Lock()
		ch := g.wake
		st := Stats{Held: g.waiting, Pending: g.pending, Peak: g.peak, Reserving: g.reserveWait}
		g.mu.Unlock()
		if cond(st) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
