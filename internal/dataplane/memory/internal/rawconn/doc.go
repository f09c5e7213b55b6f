// Package rawconn drives a memory-protocol connection with raw syscalls on
// a descriptor that Go's netpoller does not know: the client's synchronous
// channel and bulk streams, the donor's threads serving them, and a
// mapping's fault handler process all use it, so that a round trip never
// waits for a netpoller wake-up (docs/memory-protocol.md).
//
// The zero Conn is not usable; build one with New on a descriptor from
// Detach. A Conn carries one request at a time from one goroutine (or
// thread); Shutdown may be called concurrently from anywhere, to wake it.
package rawconn
