package clock

import (
	"sync/atomic"
	"time"
)

// Deadline is a time on a Clock that may be moved while it is checked
// (a lease's known expiry, which renewals move): Passed is one atomic load
// and, while a time is set, one reading of the clock (time.Now on Real,
// tens of nanoseconds), cheap enough for every request of a data plane.
// Its methods are safe for concurrent use; a nil *Deadline never passes.
type Deadline struct {
	c  Clock
	at atomic.Pointer[time.Time] // nil: none
}

// NewDeadline returns a Deadline on c (nil: Real) with no time set.
func NewDeadline(c Clock) *Deadline {
	return &Deadline{c: Or(c)}
}

// Set makes t the deadline; the zero time removes it (never passes).
func (d *Deadline) Set(t time.Time) {
	if t.IsZero() {
		d.at.Store(nil)
		return
	}
	if cur := d.at.Load(); cur != nil && cur.Equal(t) {
		return
	}
	d.at.Store(&t)
}

// At is the deadline (zero: none).
func (d *Deadline) At() time.Time {
	if d == nil {
		return time.Time{}
	}
	if p := d.at.Load(); p != nil {
		return *p
	}
	return time.Time{}
}

// Passed reports whether the clock's time has reached the deadline.
func (d *Deadline) Passed() bool {
	if d == nil {
		return false
	}
	p := d.at.Load()
	return p != nil && !d.c.Now().Before(*p)
}
