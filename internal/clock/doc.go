// Package clock is Rialto's one source of time: a Clock tells the time and
// makes timers, tickers and delayed calls (Now, Since, NewTimer, NewTicker,
// AfterFunc), after tailscale's tstime. Servers, agents and data planes
// take one in their Config (nil: Real) and never call time.Now, time.After,
// time.NewTimer, time.NewTicker or time.AfterFunc for what they schedule,
// so that tests drive them with a Fake instead of sleeping.
//
// Real is the wall clock (time's functions); its zero value is ready. Or
// returns a Config's clock or Real. TimerAt and AfterFuncAt arm a timer
// for a time rather than a duration (a deadline): on a Fake it fires at
// that time whatever the clock did while it was armed.
//
// Deadline is a time on a Clock that can be moved while data planes
// check it on every request (a lease's known expiry): Passed costs an
// atomic load and one reading of the clock.
//
// Fake is a manual clock for tests: it stands still until Advance (or Set)
// moves it, which fires every timer, ticker and AfterFunc that falls due,
// in the order of their times, before it returns; AfterFunc's function
// runs on the goroutine that calls Advance. BlockUntil waits until the code
// under test has armed a number of timers, tickers or AfterFuncs, so that a
// test advances the clock only once the code waits on it. Its zero value
// is a clock at the zero time; NewFake starts it at a given time.
//
// FakeNow tells a Fake's time but runs its timers in real time: for tests
// of a whole cluster that judge by a time the test moves while their loops
// keep their real cadence.
//
// Every Clock, Timer and Ticker here is safe for concurrent use.
//
// What is measured rather than scheduled (a round-trip time, a request's
// latency for a histogram) may use time.Now and time.Since directly: a
// fake clock would measure zero.
package clock
