// Package backoff is the one retry wait Rialto's loops share (an agent's
// join, an appliance's registration, a borrower's redials): exponential
// backoff with full jitter above a floor, timed by an injected clock.Clock
// and cut short by a context.
//
// The n-th wait after a Reset (n = 0, 1, ...) is drawn uniformly from
// [Min, min(Max, Min·2^(n+1))]: the ceiling doubles with every failure up
// to Max, and the jitter spreads the retries of many clients that failed
// together (a control plane restarting, a lender coming back) instead of
// having them retry in lockstep, while the floor keeps a loop from
// spinning.
//
// The zero value is ready: Min 100 ms, Max 10 s, the real clock. A
// Backoff is owned by one loop and is not safe for concurrent use.
package backoff
