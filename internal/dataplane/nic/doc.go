// Package nic lends network interfaces: the virtual NIC of Venice (Dong et
// al., "Venice: Exploring Server Architectures for Effective Resource
// Sharing"), whose front-end and back-end drivers carry IP packets over
// a queue-pair channel, here carried over TCP (docs/nic.md).
//
// A Lender (on the node that owns the interface) gives each lease a TUN
// interface of its own and configures its kernel so that what the
// borrower sends leaves only through the lent interface, translated to
// its address (NAT, nftables masquerade), that only replies come back, and
// that a borrower reaches neither the lender's own addresses nor another
// borrower; it enforces each lease's rate in both directions (a token
// bucket), and its known expiry (LeaseSpec.Deadline, SetLeaseDeadline): a packet it would
// forward from then on, either way, is dropped and ends the borrower's
// session (an ERROR of StatusGone saying so). Attach (on the borrower) creates a TUN interface in the
// caller's network namespace, gives it the address the lender assigned
// and routes what the lent interface reaches through it. Several lenders
// attached together form a bond: each flow is pinned to one of the lenders
// that are up (a new flow to the one with the fewest flows for its rate),
// so bandwidth adds over flows and losing a lender moves only its flows; ModePacket also stripes packets
// over several connections to each lender, the receiver restoring order.
//
// The tunnel runs under TLS 1.3 with the lender's node certificate
// (LenderConfig.TLS, Mux.UseTLS; rialto-nics:// URIs), which the borrower
// verifies against the cluster CA (Config.TLS), or in plaintext
// (rialto-nic://). A borrower that registers its tunnel connections with
// its revocation list (Config.Track) ends them once it takes a list
// revoking the lender's certificate, and drops that lender when its
// redial fails the handshake against the list. Inside it (proto.go) is a handshake — HELLO naming the
// lease, the lender's random CHALLENGE, the borrower's PROOF (an HMAC
// keyed by the lease credential, which never crosses the wire), WELCOME —
// then frames: DATA (one IP packet, numbered), CREDIT (cumulative bytes
// the peer may have sent), PING/PONG and ERROR. Each
// connection has a credit window in each direction, as the memory data
// plane's queue pairs do: a sender without credit drops the packet (a
// full transmit ring) rather than queueing it, so queues stay bounded by
// the window; a sender that exceeds its credit is cut off. DecodeHeader,
// DecodeHello, DecodeChallenge and DecodeWelcome are the parsers of
// untrusted input and are fuzzed.
//
// Lending and attaching need root (CAP_NET_ADMIN), /dev/net/tun and, on
// the lender, nft(8); Available says whether the machine has them.
//
// Zero values: Lender and Interface are built by NewLender and Attach;
// their zero values are not usable. Header, Hello, Welcome, LeaseSpec,
// Config and Stats are plain values. Concurrency: a Lender's and an
// Interface's methods are safe for concurrent use; Lender.Serve owns the
// goroutines of the connections it accepts and waits for them, Close owns
// the leases' and the interface's goroutines and waits for them.
package nic
