package placement

import (
	"fmt"
	"math"
)

// req is a validated request with derived figures.
type req struct {
	Request
	demand   float64 // +Inf when elastic
	need     float64 // rate that meets the requirement (0: none)
	hard     bool    // need comes from a deadline
	tight    bool
	align    int64
	strategy string
}

func (x *Index) validate(r Request) (req, error) {
	q := req{Request: r, demand: demandOf(r.Bandwidth), align: defaultAlignBytes, strategy: r.Strategy}
	switch r.Kind {
	case KindBlock, KindMemory:
	case KindAccel:
		q.align = 1
	default:
		return q, fmt.Errorf("%w: unknown kind %q", ErrInvalid, r.Kind)
	}
	switch {
	case r.Whole && r.Size < 0:
		return q, fmt.Errorf("%w: size must not be negative", ErrInvalid)
	case !r.Whole && r.Size <= 0:
		return q, fmt.Errorf("%w: size must be positive (or ask for a whole device)", ErrInvalid)
	}
	if r.StripeUnit < 0 {
		return q, fmt.Errorf("%w: stripe unit must not be negative", ErrInvalid)
	}
	switch r.Mode {
	case "", ModeDedicated, ModeShared, ModeComposed:
	default:
		return q, fmt.Errorf("%w: unknown mode %q", ErrInvalid, r.Mode)
	}
	if r.Whole && r.Mode != "" && r.Mode != ModeDedicated {
		return q, fmt.Errorf("%w: a whole device is dedicated, not %s (a %s lease needs a size)", ErrInvalid, r.Mode, r.Mode)
	}
	switch r.Strategy {
	case "":
		q.strategy = Binpack
	case Binpack, Spread:
	default:
		return q, fmt.Errorf("%w: unknown strategy %q", ErrInvalid, r.Strategy)
	}
	if r.Width < 0 || r.Width == 1 || (r.Width > 0 && r.Mode != ModeComposed) {
		return q, fmt.Errorf("%w: width %d needs mode composed and at least 2", ErrInvalid, r.Width)
	}
	if r.Deadline < 0 || r.Work < 0 || r.Bandwidth < 0 || r.MaxLatency < 0 {
		return q, fmt.Errorf("%w: negative deadline, work, bandwidth or latency", ErrInvalid)
	}
	if r.Deadline > 0 && r.Work == 0 {
		return q, fmt.Errorf("%w: a deadline needs work", ErrInvalid)
	}
	if r.Deadline > 0 {
		q.need = float64(r.Work) / r.Deadline.Seconds()
		q.hard = true
		if !math.IsInf(q.demand, 1) && q.need >= TightDeadlineRatio*q.demand {
			q.tight = true
		}
	} else if !math.IsInf(q.demand, 1) {
		q.need = q.demand
	}
	return q, nil
}

func roundUp(n, a int64) int64 { return (n + a - 1) / a * a }

// lcm is the least common multiple of two positive numbers.
func lcm(a, b int64) int64 {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}
