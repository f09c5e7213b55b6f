package nbd

import (
	"context"
	"sync"
	"time"
)

// RateLimit caps the bandwidth and the operation rate of an export (for
// instance one partition of a shared device). It is a pair of token buckets
// shared by every connection to the export. The zero value imposes no limit.
// A RateLimit must not be copied after first use.
type RateLimit struct {
	// BytesPerSec caps payload bytes per second (reads and writes); 0 = none.
	BytesPerSec float64
	// IOPS caps requests per second; 0 = none.
	IOPS float64
	// Burst is the bucket depth expressed as time at the configured rate;
	// 0 means 100ms.
	Burst time.Duration
	// Now is the clock; nil means time.Now. Tests inject a fake clock.
	Now func() time.Time

	mu      sync.Mutex
	started bool
	last    time.Time
	bytes   float64 // tokens available (may go negative: debt)
	ops     float64
}

func (r *RateLimit) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *RateLimit) burst() float64 {
	if r.Burst <= 0 {
		return 0.1
	}
	return r.Burst.Seconds()
}

// Reserve accounts for one request carrying n payload bytes and returns how
// long the caller must wait before performing it (0 if it may go now).
func (r *RateLimit) Reserve(n int64) time.Duration {
	if r == nil || (r.BytesPerSec <= 0 && r.IOPS <= 0) {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	b := r.burst()
	if !r.started {
		r.started = true
		r.last = now
		r.bytes = r.BytesPerSec * b
		r.ops = r.IOPS * b
	}
	el := now.Sub(r.last).Seconds()
	if el > 0 {
		r.last = now
	} else {
		el = 0
	}
	var wait float64
	if r.BytesPerSec > 0 {
		r.bytes = min(r.bytes+el*r.BytesPerSec, r.BytesPerSec*b)
		r.bytes -= float64(n)
		if r.bytes < 0 {
			wait = -r.bytes / r.BytesPerSec
		}
	}
	if r.IOPS > 0 {
		r.ops = min(r.ops+el*r.IOPS, max(r.IOPS*b, 1))
		r.ops--
		if r.ops < 0 {
			wait = max(wait, -r.ops/r.IOPS)
		}
	}
	return time.Duration(wait * float64(time.Second))
}

// Wait reserves capacity for a request of n bytes and blocks until it may
// proceed or ctx is done.
func (r *RateLimit) Wait(ctx context.Context, n int64) error {
	d := r.Reserve(n)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
