// Package gateway is a batching front for accelerator slots: one service
// that many clients call, which gathers their requests into executions
// (dynamic batching with a maximum batch size, preferred batch sizes and a
// maximum queue delay, as NVIDIA Triton does), runs them on a number of
// workers against a number of slot instances (the p/w/k/e knobs of the
// ERBIUM paper, Maschi and Alonso),
// bounds its queue with clear rejections, and exports Prometheus metrics:
// requests, executions (hence average batch size), queue time and compute
// time. Items a caller submits together (CallGroup) always run in the same
// execution, and separate calls sharing a batch key (CallKeyed) are pulled
// into the same execution: related-query batching.
//
// Build a Gateway with New and run its scheduler and workers with Run; Call
// and CallGroup may be used from any goroutine while Run runs. The zero
// value is not usable. Time comes from Config.Clock (internal/clock) so
// tests drive the queue-delay logic with a clock.Fake, without sleeping.
//
// A gateway shared by several leases is served with SharedTarget over a
// Credentials set (zero value: empty, no per-credential limit; safe for
// concurrent use): each borrower presents its own lease credential, added
// with a non-secret lease name (the label of the per-lease metrics) and a
// weight (AddWeighted, SetWeight). Each lease has its own queues — a batch
// never mixes leases, so one lease's bad items never split another's
// batches — and the scheduler serves the leases by start-time fair
// queueing on their weights. An execution whose callers have all gone (a
// deadline, a revoked lease) is cancelled, on its slot too (the accel
// CANCEL frame); Revoke closes the credential's connections, cancels its
// queued and running work and waits a bounded time (RevokeWait) for it.
// Executions go to the instance with the fewest executions under way.
// SetInstances replaces the slot instances while Run runs; executions
// running on an instance taken out are cancelled there and run again on
// the others.
package gateway
