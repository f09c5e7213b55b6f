// Package donor is the lender's side of Rialto's remote-memory data plane
// (Venice, Dong et al.): a Donor reserves anonymous memory regions, one per
// memory lease, and serves them over the memory protocol (package
// protocol, docs/memory-protocol.md), authenticated by the lease
// credential in the first frame of every connection. A region has one
// subscriber at a time, and is wiped before it is freed.
//
// The zero Donor is not usable; build one with New. Set Credits, Spin,
// FaultSpin, IdleWait and the limits before Serve.
//
// Threads: the donor serves each sync connection, bulk stream and
// mapping's fault connection (under TLS, every connection) on a thread of
// its own with raw syscalls on a descriptor the netpoller does not know
// (internal/rawconn), so segments arriving on it do not wake an idle
// runtime thread; control and queue connections are served on the Go
// netpoller. A raw connection idle for IdleWait lets its thread go and
// waits on the netpoller until its next request, and MaxPollThreads
// bounds the threads the others hold; one whose reply waits for a peer
// that does not read lets it go too, while it waits on the netpoller.
// Every write of the donor is bounded by SendWait: a connection whose
// peer took none of a reply (or of a credit update) for that long
// stopped reading, and ends (a control connection with its session).
// Serve owns every goroutine it starts and waits for them before it
// returns.
//
// Concurrency: Donor methods are safe for concurrent use.
package donor
