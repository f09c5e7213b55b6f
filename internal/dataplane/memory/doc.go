// Package memory is Rialto's remote-memory data plane (seed 001, Venice).
//
// A Donor reserves anonymous memory regions, one per memory lease, and serves
// them over the Rialto memory protocol (docs/memory-protocol.md): framed
// binary over TCP, authenticated by the lease credential in the first frame.
// A Client reaches a region through three channels that mirror Venice's:
// a fine-grained synchronous channel (ChannelSync, ≈ CRMA), a bulk channel
// that splits large ranges into chunks over parallel streams (ChannelBulk,
// ≈ RDMA), and asynchronous queue pairs with sequence numbers, a completion
// queue and credit-based flow control whose credits travel on the session's
// low-latency control connection (ChannelQueue, ≈ QPair). ChannelAdaptive
// picks one per request from its size and the recent access pattern.
//
// Map builds a transparent mapping on top of a Client: a []byte whose pages
// are fetched on first touch by a userfaultfd handler, cached locally (LRU,
// write-back of dirty pages tracked with userfaultfd write-protection) and
// flushed on Close. The handler is a separate process — the program's own
// binary re-executed — so a garbage collection in the program can never
// wait on a fault that only the program could serve; every binary that
// calls Map must call RunFaultHandlerIfChild first in main or TestMain. It
// runs in a process group of its own (a terminal's Ctrl-C is the program's
// to handle), fetches faults that arrive together with one write of
// requests, and wakes a sequential fault as soon as its own page of the
// readahead window has arrived.
// Backend adapts a Client to the NBD server's Backend interface so a memory
// lease can be exported as a swap-style block device.
//
// Zero values: the zero Donor, Client, QueuePair and Mapping are not usable;
// build them with NewDonor, Dial, Client.NewQueuePair and Map.
//
// Threads: the client's sync and bulk channels drive their sockets with raw
// non-blocking syscalls and poll(2) from the calling goroutine (no netpoller
// hop on the round trip), and a Mapping's fault handler process does the
// same on its main thread. The donor serves each sync connection, bulk
// stream and mapping's fault connection on its own thread the same way, and
// control and queue connections on the Go netpoller. Every raw descriptor is
// a duplicate the netpoller does not know (see pager), so that segments
// arriving on it do not wake an idle runtime thread.
//
// Lifetimes: close a Mapping before its Client. Closing the Client ends the
// session at the donor, which closes the mapping's connection; the mapping
// then fails (see Mapping.Err) and touching it faults.
//
// Concurrency: Donor and Client methods are safe for concurrent use. A
// QueuePair may be used by several goroutines; its completions are delivered
// on one channel. A Mapping's Bytes may be read and written by any number of
// goroutines as ordinary memory; Flush and Close may be called from any
// goroutine that is not touching the mapping at the same time as Close.
package memory
