// Package uptest runs the real rialto binary for tests outside cmd/rialto:
// it builds the binary once per test process and starts `rialto up`
// clusters in temporary state dirs, stopped (SIGTERM, then kill) when the
// test ends. It is imported only by tests.
//
// The zero value of Up is not usable; StartUp returns one. Functions are
// safe for concurrent use; each Up belongs to the test that started it.
package uptest
