// Package mapping is the transparent view of a remote-memory region (Venice,
// Dong et al.): Map builds, on a session (a client.Client, or a
// client.Following that follows the region when its lease moves), a []byte
// whose pages are fetched on first touch by a userfaultfd handler, cached
// locally (LRU, write-back of dirty pages tracked with userfaultfd
// write-protection) and flushed on Close.
//
// The fault handler is a separate process — the program's own binary
// re-executed — so a garbage collection in the program can never wait on a
// fault that only the program could serve; every binary that calls Map
// must call RunFaultHandlerIfChild first in main or TestMain. It runs in a
// process group of its own (a terminal's Ctrl-C is the program's to
// handle), fetches faults that arrive together with one write of requests,
// and wakes a sequential fault as soon as its own page of the readahead
// window has arrived. The handler drives its connection to the donor with
// raw syscalls on its main thread (internal/rawconn).
//
// On a Follower (client.Following) the mapping follows its region to
// another donor: when the fault connection ends (GONE, closed, or a
// request on it timed out), the handler asks the program for a new
// connection of the session at the region's new place (over the control
// socket, the descriptor passed with SCM_RIGHTS) and serves again what
// was under way. A new connection of the same session names the old one,
// which the donor ends before it answers: a write-back given up on the
// old one never lands after the page's next one. Over TLS the handler runs each
// connection's TLS session itself: the program opens the session at the
// new place (verifying the new donor's certificate against the CA) and
// passes a bare connection with a handoff that pins the key it verified,
// as for the first connection. Only while following does a fault wait on
// the program (see docs/memory-protocol.md, "A region that moved", for the one
// limit this brings).
//
// Zero values: the zero Mapping is not usable; build it with Map. The zero
// Options maps the whole region with a cache of 10% of it.
//
// Lifetimes: close a Mapping before its session. Closing the session ends
// it at the donor, which closes the mapping's connection; the mapping
// then fails (see Mapping.Err) and touching it faults.
//
// Concurrency: a Mapping's Bytes may be read and written by any number of
// goroutines as ordinary memory; Flush, Stats and Err may be called from
// any goroutine, and Close from any goroutine that is not touching the
// mapping at the same time.
package mapping
