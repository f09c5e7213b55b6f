package backoff

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
)

// Defaults of a zero Backoff.
const (
	DefaultMin = 100 * time.Millisecond
	DefaultMax = 10 * time.Second
)

// Backoff is exponential backoff with full jitter (see the package doc).
type Backoff struct {
	Min   time.Duration // the floor of every wait; 0: DefaultMin
	Max   time.Duration // the ceiling the waits grow to; 0: DefaultMax (raised to Min if below)
	Clock clock.Clock   // times Wait and Sleep; nil: the real clock

	n int // waits since the last Reset
}

// Next returns the wait before the next attempt, and counts it.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = DefaultMin
	}
	if hi <= 0 {
		hi = DefaultMax
	}
	hi = max(hi, lo)
	ceil := hi
	if b.n < 62 && lo <= hi>>(b.n+1) {
		ceil = lo << (b.n + 1)
	}
	b.n++
	return lo + time.Duration(rand.Int64N(int64(ceil-lo)+1))
}

// Reset starts the waits again from the first (after a success).
func (b *Backoff) Reset() { b.n = 0 }

// Wait waits Next() on the clock. It returns nil once the wait is over,
// or ctx's error if ctx ends first.
func (b *Backoff) Wait(ctx context.Context) error { return b.Sleep(ctx, b.Next()) }

// Sleep waits d on the clock (for a caller that logged Next's wait
// first). It returns nil once d has passed, or ctx's error if ctx ends
// first.
func (b *Backoff) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := clock.Or(b.Clock).NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}
