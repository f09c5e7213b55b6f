// Package nbd serves and consumes block devices over the Network Block Device
// protocol (fixed newstyle handshake, structured replies, base:allocation), so
// that unmodified third-party clients (nbdcopy, nbdinfo, qemu, fio, the Linux
// nbd client) can use what a Rialto lender exports.
//
// The server side is [Server]: register [Export]s (a name, a [Backend] and
// limits) with [Server.AddExport] and run [Server.Serve] on a listener. The
// client side is [Client], obtained with [Dial] or [DialURI]; a Client is itself
// a [Backend], so exports can be composed and re-exported. [FileBackend] serves
// a whole file or block device, or a partition (offset, length) of one.
//
// Security: export names are lease credentials. The server never lists them
// (NBD_OPT_LIST is refused with NBD_REP_ERR_POLICY), answers an unknown name
// with NBD_REP_ERR_UNKNOWN and nothing else, and never logs a name: log lines
// carry at most [NameTag], a short hash prefix.
//
// TLS: a Server with a TLSConfig offers NBD_OPT_STARTTLS with X.509
// certificates and, unless TLSOptional, requires it (the protocol's
// FORCEDTLS mode: NBD_REP_ERR_TLS_REQD before the upgrade). [WithTLS] and
// nbds:// URIs make the Client upgrade first and refuse a server that will
// not. The server's certificate is checked at the handshake; [WithTrack]
// registers the connection with a revocation list (pki.CRL.Tracker), which
// ends it when a later list revokes that certificate. Over TLS the bytes pass through crypto/tls, so sendfile, splice and
// replies pointing into a mapping are not used (large writes to a tmpfs
// file are still decrypted straight into its mapping). With [Server.PSK] the
// server also takes TLS 1.3 with pre-shared keys (nbdkit's --tls-psk,
// libnbd's tls-psk-file; package tlspsk, as crypto/tls has no external
// PSKs): the client's ClientHello decides which handshake runs. The Client
// has no PSK support and refuses tls-psk-file in URIs.
//
// Zero values: a zero Server is ready to use (no exports, logging discarded).
// A zero Client is not usable; use Dial. A zero RateLimit imposes no limit.
//
// Concurrency: Server methods are safe for concurrent use; Serve may be called
// on several listeners at once. Client methods are safe for concurrent use and
// are pipelined over one connection; replies are matched by handle. Backend
// implementations must accept concurrent ReadAt/WriteAt calls.
// [FileBackend.Close] may run while its export still serves requests: later
// requests fail with [ErrBackendClosed] (ESHUTDOWN to the client), and the
// file stays open until the last request using it ends, so that no request
// reads or writes through a descriptor number reused for another file.
package nbd
