// Package nbdtest serves Rialto's own NBD server for tests: a lender on a
// loopback port that lives until the test ends. It is imported only by
// tests.
//
// There is no state; functions are safe for concurrent use. The server's
// goroutine is owned by the test: it is stopped, and its error checked, in
// the test's cleanup.
package nbdtest
