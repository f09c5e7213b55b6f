package testcluster

import (
	"time"

	"github.com/rialto-project/rialto/internal/clock"
)

// Clock is the cluster's clock. What the control plane and the agents
// judge by (Now: liveness, leases' expiries and TTLs) is a clock.Fake that
// tests move with Advance; what paces their loops (timers, tickers: the
// agents' heartbeats every HeartbeatInterval) is real time, so that the
// cluster runs by itself between Advances. Advance fires no timer.
//
// The zero value is not usable; use NewClock. It is safe for concurrent
// use.
type Clock struct {
	fake *clock.Fake
	real clock.Real
}

var _ clock.Clock = (*Clock)(nil)

// NewClock returns a clock set to t.
func NewClock(t time.Time) *Clock { return &Clock{fake: clock.NewFake(t)} }

// Now returns the fake time.
func (c *Clock) Now() time.Time { return c.fake.Now() }

// Since is Now().Sub(t), in fake time.
func (c *Clock) Since(t time.Time) time.Duration { return c.fake.Since(t) }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.fake.Advance(d) }

// NewTimer is a real timer.
func (c *Clock) NewTimer(d time.Duration) clock.Timer { return c.real.NewTimer(d) }

// NewTicker is a real ticker.
func (c *Clock) NewTicker(d time.Duration) clock.Ticker { return c.real.NewTicker(d) }

// AfterFunc calls f after d of real time.
func (c *Clock) AfterFunc(d time.Duration, f func()) clock.Timer { return c.real.AfterFunc(d, f) }
