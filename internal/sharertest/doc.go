// Package sharertest gives tests a child process that shares descriptors
// of the test's process, as a child that any goroutine forks (an
// exec.Command) shares every descriptor until its exec closes its copies:
// tens of milliseconds on a loaded machine, during which a lock, a block
// device claim, a listening port or a TUN interface the process closed
// stays held by the child. Tests of the code that lets such things go
// (internal/filelock, internal/letgo, the agent's locks, the NIC lender)
// hold them in a sharer for as long as they need.
//
// It is test code: the rialto binary never imports it (internal/deptest).
// Share has no state; parallel tests each end their own child (their
// cleanup, or the end function it returns).
package sharertest
