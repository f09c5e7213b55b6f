package backoff

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
)

// Each wait lies in [Min, min(Max, Min·2^(n+1))], the ceiling reaching
// Max; over many draws the jitter spans that whole range.
func TestNextBounds(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		name     string
		b        Backoff
		ceilings []time.Duration // the n-th wait's ceiling; the floor is the min
		min      time.Duration
	}{
		{"zero value", Backoff{}, []time.Duration{200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 6400 * ms, 10 * time.Second, 10 * time.Second}, 100 * ms},
		{"agent join", Backoff{Min: 100 * ms, Max: 5 * time.Second}, []time.Duration{200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 5 * time.Second, 5 * time.Second}, 100 * ms},
		{"max below min", Backoff{Min: time.Second, Max: ms}, []time.Duration{time.Second, time.Second}, time.Second},
		{"max equals min", Backoff{Min: 50 * ms, Max: 50 * ms}, []time.Duration{50 * ms}, 50 * ms},
	} {
		t.Run(c.name, func(t *testing.T) {
			for n, ceil := range c.ceilings {
				lo, hi := time.Duration(1<<62), time.Duration(0)
				for range 2000 {
					b := c.b
					for range n {
						b.Next()
					}
					d := b.Next()
					if d < c.min || d > ceil {
						t.Fatalf("wait %d: %v outside [%v, %v]", n, d, c.min, ceil)
					}
					lo, hi = min(lo, d), max(hi, d)
				}
				// The draws spread over the range (2000 uniform draws
				// land within 1% of each end with overwhelming odds).
				if span := ceil - c.min; span > 0 && (lo > c.min+span/100 || hi < ceil-span/100) {
					t.Errorf("wait %d: draws span [%v, %v] of [%v, %v]: not full jitter", n, lo, hi, c.min, ceil)
				}
			}
		})
	}
}

// Many failures do not overflow the ceiling, and Reset starts over.
func TestManyAttemptsAndReset(t *testing.T) {
	b := Backoff{Min: time.Nanosecond, Max: time.Hour}
	for range 200 {
		if d := b.Next(); d < time.Nanosecond || d > time.Hour {
			t.Fatalf("wait %v outside [1ns, 1h]", d)
		}
	}
	b.Reset()
	if d := b.Next(); d > 2*time.Nanosecond {
		t.Fatalf("first wait after Reset %v, want at most 2ns", d)
	}
}

// Wait waits on the clock it is given, and a done ctx cuts it short.
func TestWaitOnClock(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	b := Backoff{Min: time.Second, Max: time.Second, Clock: fake}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Wait(ctx) }()
	if err := fake.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	fake.Advance(999 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v before its second", err)
	default:
	}
	fake.Advance(time.Millisecond)
	if err := <-done; err != nil {
		t.Fatalf("Wait: %v", err)
	}

	wctx, wcancel := context.WithCancel(ctx)
	go func() { done <- b.Wait(wctx) }()
	if err := fake.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wcancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled ctx: %v", err)
	}
	if n := fake.Waiters(); n != 0 {
		t.Fatalf("%d timers left armed", n)
	}
	if err := b.Sleep(wctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep with a done ctx: %v", err)
	}
}
