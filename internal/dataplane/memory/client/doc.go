// Package client is the borrower's side of Rialto's remote-memory data
// plane (Venice, Dong et al.): a Client is a session with one donor region,
// reached over the memory protocol (package protocol,
// docs/memory-protocol.md).
//
// A Client reaches its region through three channels that mirror Venice's:
// a fine-grained synchronous channel (ChannelSync, ≈ CRMA), a bulk channel
// that splits large ranges into chunks over parallel streams (ChannelBulk,
// ≈ RDMA), and asynchronous queue pairs with sequence numbers, a completion
// queue and credit-based flow control whose credits travel on the session's
// low-latency control connection (ChannelQueue, ≈ QPair). ChannelAdaptive
// picks one per request from its size and the recent access pattern.
// Backend adapts a Client to the NBD server's Backend interface so a memory
// lease can be exported as a swap-style block device. Package mapping
// builds a transparent mapping on a Client (Join hands it a connection of
// the session).
//
// A data connection the donor ends while the session lives (a move
// closes the connection of a WRITE whose payload stalls) is re-established
// alone, joining the same session, and the requests in flight on it are
// sent again; the session's other connections serve on (rejoin.go,
// Client.Rejoins). A request that fails with its connection given up (a
// timeout, a cancelled context) returns its failure only once the donor
// has ended that connection: nothing of it lands after a request issued
// later, on any channel.
//
// A Following (DialFollowing) is a session that follows its region when
// the lease moves to another donor: a request that finds the region gone
// asks a Relocator (the control plane's record of the lease) where it is,
// opens a session there and is retried (follow.go).
//
// A session over TLS whose connections are registered with a revocation
// list (Options.Track) is lost as soon as a list the borrower takes
// revokes its donor's certificate: its connections are ended then, not
// when they break, and a Following opens no session on that donor again
// (it follows the region if it moved elsewhere).
//
// Errors wrap the sentinel errors of package protocol (ErrOutOfRange,
// ErrAuth, ErrBusy, ErrDonorLost, ErrClosed, …).
//
// Zero values: the zero Client, QueuePair and Following are not usable;
// build them with Dial, Client.NewQueuePair and DialFollowing. The zero Options is valid.
//
// Threads: the sync and bulk channels drive their sockets with raw
// non-blocking syscalls and poll(2) from the calling goroutine (no
// netpoller hop on the round trip; see internal/rawconn), the control
// connection and queue pairs use the Go netpoller, each with one reader
// goroutine that Close stops and waits for.
//
// Concurrency: Client methods are safe for concurrent use. A QueuePair may
// be used by several goroutines; its completions are delivered on one
// channel. Close a mapping built on a Client before the Client: closing the
// Client ends the session at the donor.
package client
