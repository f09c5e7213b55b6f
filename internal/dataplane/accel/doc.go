// Package accel is the Rialto accelerator protocol: a framed binary mailbox
// protocol over TCP (docs/accel-protocol.md). A borrower writes input into
// slot memory, starts a task naming the role's entry and the buffer
// addresses, receives the completion (pushed, or polled) and reads the
// result; many tasks may be outstanding on one connection, and the first
// frame of every connection presents the lease credential.
//
// Server serves the protocol for any Target (an appliance slot, a batching
// gateway). Dial returns a Conn, the client. The zero value of Server is not
// usable without Target; the zero Conn is not usable (use Dial). Conn and
// Server are safe for concurrent use by multiple goroutines. Every goroutine
// they start is stopped by Conn.Close or by cancelling Serve's context, and
// waited for before those return.
//
// The subpackages hold the rest of the accelerator data plane: roles (the
// kernels), appliance (the shell and its slots) and gateway (dynamic
// batching in front of slot instances).
package accel
