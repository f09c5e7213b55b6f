package clock

import (
	"context"
	"sync"
	"time"
)

// Fake is a clock that moves only when told to (Advance). Timers, tickers
// and AfterFuncs armed on it fire when Advance reaches their time, in the
// order of their times (those due at the same time in the order they were
// armed); AfterFunc's function runs on the goroutine that calls Advance,
// without the clock's lock held, so that it may use the clock. A timer
// armed for a duration of 0 or less fires at once (an AfterFunc's function
// then runs in a goroutine of its own, as on the real clock).
//
// The zero value is a clock at the zero time, ready to use.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	seq     uint64
	waiting []*fakeWaiter // armed timers, tickers and AfterFuncs
	changed chan struct{} // closed (and replaced) when one is armed
}

// NewFake returns a Fake clock set to t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now is the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Since is Now().Sub(t).
func (f *Fake) Since(t time.Time) time.Duration { return f.Now().Sub(t) }

// NewTimer returns a timer that fires once the clock has advanced by d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	w := &fakeWaiter{f: f, ch: make(chan time.Time, 1)}
	w.Reset(d)
	return w
}

// AfterFunc calls fn once the clock has advanced by d.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	w := &fakeWaiter{f: f, fn: fn}
	w.Reset(d)
	return w
}

// armAt arms a timer (fn nil) or an AfterFunc for the fake time at:
// TimerAt and AfterFuncAt.
func (f *Fake) armAt(at time.Time, fn func()) Timer {
	w := &fakeWaiter{f: f, fn: fn}
	if fn == nil {
		w.ch = make(chan time.Time, 1)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !at.After(f.now) {
		if fn != nil {
			go fn()
		} else {
			w.ch <- f.now
		}
		return w
	}
	w.when = at
	f.addLocked(w)
	return w
}

// NewTicker returns a ticker that ticks every d of fake time. It panics if
// d is not positive, as time.NewTicker does.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	w := &fakeWaiter{f: f, ch: make(chan time.Time, 1), period: d}
	w.Reset(d)
	return fakeTicker{w}
}

// Advance moves the clock forward by d (a negative d is taken as 0),
// firing what falls due on the way, and returns once every AfterFunc due
// has returned. A timer armed by an AfterFunc, or a ticker's next tick,
// that falls due before the new time fires in the same call.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	end := f.now.Add(max(d, 0))
	for {
		w := f.earliestLocked()
		if w == nil || w.when.After(end) {
			break
		}
		if w.when.After(f.now) {
			f.now = w.when
		}
		if w.period > 0 {
			w.when = w.when.Add(w.period)
		} else {
			f.removeLocked(w)
		}
		if w.fn != nil {
			fn := w.fn
			f.mu.Unlock()
			fn()
			f.mu.Lock()
			continue
		}
		select {
		case w.ch <- f.now:
		default: // a tick the reader has not taken yet: this one is dropped
		}
	}
	f.now = end
}

// Waiters is the number of timers, tickers and AfterFuncs armed and not
// yet fired or stopped.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiting)
}

// Next is the time the earliest armed timer, ticker or AfterFunc fires;
// false if none is armed.
func (f *Fake) Next() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w := f.earliestLocked(); w != nil {
		return w.when, true
	}
	return time.Time{}, false
}

// BlockUntil waits until at least n timers, tickers or AfterFuncs are
// armed (Waiters() >= n), or ctx is done: a test calls it before Advance
// so that the code under test is waiting on the clock when it moves.
func (f *Fake) BlockUntil(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		if len(f.waiting) >= n {
			f.mu.Unlock()
			return nil
		}
		ch := f.changedLocked()
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

func (f *Fake) changedLocked() chan struct{} {
	if f.changed == nil {
		f.changed = make(chan struct{})
	}
	return f.changed
}

func (f *Fake) earliestLocked() *fakeWaiter {
	var e *fakeWaiter
	for _, w := range f.waiting {
		if e == nil || w.when.Before(e.when) || (w.when.Equal(e.when) && w.seq < e.seq) {
			e = w
		}
	}
	return e
}

func (f *Fake) addLocked(w *fakeWaiter) {
	f.seq++
	w.seq = f.seq
	f.waiting = append(f.waiting, w)
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// removeLocked disarms w; it reports whether w was armed.
func (f *Fake) removeLocked(w *fakeWaiter) bool {
	for i, o := range f.waiting {
		if o == w {
			f.waiting = append(f.waiting[:i], f.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// fakeWaiter is a Fake's timer, ticker (period > 0) or AfterFunc (fn).
type fakeWaiter struct {
	f      *Fake
	when   time.Time
	seq    uint64
	period time.Duration
	ch     chan time.Time
	fn     func()
}

func (w *fakeWaiter) C() <-chan time.Time { return w.ch }

func (w *fakeWaiter) Stop() bool {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	w.drain()
	return w.f.removeLocked(w)
}

func (w *fakeWaiter) Reset(d time.Duration) bool {
	f := w.f
	f.mu.Lock()
	defer f.mu.Unlock()
	was := f.removeLocked(w)
	w.drain()
	if d <= 0 && w.period == 0 {
		if w.fn != nil {
			go w.fn()
		} else {
			w.ch <- f.now
		}
		return was
	}
	w.when = f.now.Add(d)
	f.addLocked(w)
	return was
}

// drain drops a time sent and not received, so that none is received
// after Stop or Reset (as with time.Timer since Go 1.23).
func (w *fakeWaiter) drain() {
	if w.ch == nil {
		return
	}
	select {
	case <-w.ch:
	default:
	}
}

type fakeTicker struct{ w *fakeWaiter }

func (t fakeTicker) C() <-chan time.Time { return t.w.ch }
func (t fakeTicker) Stop()               { t.w.Stop() }

func (t fakeTicker) Reset(d time.Duration) {
	if d <= 0 {
		panic("clock: non-positive interval for Ticker.Reset")
	}
	t.w.f.mu.Lock()
	t.w.period = d
	t.w.f.mu.Unlock()
	t.w.Reset(d)
}

// FakeNow is a clock whose time is a Fake's, which tests move with
// Advance, and whose timers, tickers and AfterFuncs run in real time. It
// is for tests of a whole system (a control plane with its agents) that
// judge by the time the test moves (liveness, expiries, TTLs) while their
// loops (heartbeats, polls) keep their real cadence between Advances:
// Advance fires no timer. It does not suit code that arms a timer for a
// deadline computed from Now and then checks Now against it (a gateway's
// queue delay): Now stands still while the timer runs, so the deadline is
// never reached. The zero value is not usable; use NewFakeNow.
type FakeNow struct{ f *Fake }

// NewFakeNow returns a FakeNow set to t.
func NewFakeNow(t time.Time) *FakeNow { return &FakeNow{f: NewFake(t)} }

// Now is the fake time.
func (c *FakeNow) Now() time.Time { return c.f.Now() }

// Since is Now().Sub(t), in fake time.
func (c *FakeNow) Since(t time.Time) time.Duration { return c.f.Since(t) }

// Advance moves the fake time forward by d.
func (c *FakeNow) Advance(d time.Duration) { c.f.Advance(d) }

// NewTimer is a real timer.
func (c *FakeNow) NewTimer(d time.Duration) Timer { return Real{}.NewTimer(d) }

// NewTicker is a real ticker.
func (c *FakeNow) NewTicker(d time.Duration) Ticker { return Real{}.NewTicker(d) }

// AfterFunc calls f after d of real time.
func (c *FakeNow) AfterFunc(d time.Duration, f func()) Timer { return Real{}.AfterFunc(d, f) }
