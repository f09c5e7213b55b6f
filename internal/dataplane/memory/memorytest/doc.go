// Package memorytest runs memory donors for tests of the memory data plane
// and of the programs that use it: in process (Start), or in a child
// process that a test can stop and kill (StartChild; the test binary's
// TestMain calls RunChildIfAsked first). A child donor is also what a
// mapping under test needs: an in-process donor would need a scheduler P
// that a faulting goroutine holds. CheckOffNetpoller asserts that
// descriptors driven with raw syscalls stay off every epoll instance;
// AwaitChildParked waits until a child donor's end of a connection waits
// on its netpoller (idle for Donor.IdleWait).
// StartTLS and StartChildTLS serve donors that require TLS, with a
// certificate from a test CA (NewCA); ClientTLS is a borrower's
// configuration trusting it.
//
// Every donor serves one region under Credential on a loopback port and is
// stopped (its region wiped) by the test's cleanup. The helpers are safe
// for concurrent use by parallel tests.
package memorytest
