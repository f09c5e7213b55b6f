package clock

import "time"

// Clock tells the time and schedules work after durations.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// Since is Now().Sub(t).
	Since(t time.Time) time.Duration
	// NewTimer returns a Timer that sends the time on its channel once d
	// has passed.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a Ticker that sends the time on its channel every
	// d (d must be positive), dropping ticks a slow reader misses.
	NewTicker(d time.Duration) Ticker
	// AfterFunc calls f once d has passed (in its own goroutine on the
	// real clock; on the goroutine that advances a Fake). The Timer's C is
	// nil.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a one-shot timer, like *time.Timer.
type Timer interface {
	// C is the channel the time is sent on when the timer fires (nil for
	// an AfterFunc).
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it stopped
	// it (false: it had fired or was stopped).
	Stop() bool
	// Reset makes the timer fire after d from now; it reports whether the
	// timer had been active. As with time.Timer (Go 1.23 on), no stale
	// time is received after Stop or Reset returns.
	Reset(d time.Duration) bool
}

// Ticker is a periodic timer, like *time.Ticker.
type Ticker interface {
	// C is the channel the ticks are sent on.
	C() <-chan time.Time
	// Stop turns the ticker off.
	Stop()
	// Reset stops the ticker and restarts it with period d (positive).
	Reset(d time.Duration)
}

// Or returns c, or Real if c is nil: what a Config's zero Clock means.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// TimerAt returns a timer of c that fires once c's time reaches at (at
// once if it has). On a Fake it is armed for at itself: a timer armed for
// at.Sub(c.Now()) fires late by what an Advance between the reading and
// the arming moved the clock, and never if the test then advances only
// up to at.
func TimerAt(c Clock, at time.Time) Timer {
	if f, ok := c.(*Fake); ok {
		return f.armAt(at, nil)
	}
	return c.NewTimer(max(at.Sub(c.Now()), 0))
}

// AfterFuncAt calls f once c's time reaches at, as AfterFunc does (see
// TimerAt).
func AfterFuncAt(c Clock, at time.Time, f func()) Timer {
	if fc, ok := c.(*Fake); ok {
		return fc.armAt(at, f)
	}
	return c.AfterFunc(max(at.Sub(c.Now()), 0), f)
}

// Real is the wall clock.
type Real struct{}

// Now is time.Now.
func (Real) Now() time.Time { return time.Now() }

// Since is time.Since.
func (Real) Since(t time.Time) time.Duration { return time.Since(t) }

// NewTimer is time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// NewTicker is time.NewTicker.
func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

// AfterFunc is time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time   { return r.t.C }
func (r realTicker) Stop()                 { r.t.Stop() }
func (r realTicker) Reset(d time.Duration) { r.t.Reset(d) }
