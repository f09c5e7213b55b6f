// Package tlspsk is a minimal, strict TLS 1.3 server (RFC 8446) that
// authenticates with an external pre-shared key instead of a certificate:
// what nbdkit's --tls-psk and GnuTLS's psktool key files offer, and what
// Go's crypto/tls lacks (it uses TLS 1.3 PSKs only for session
// resumption).
//
// Only what such a server needs is implemented, and everything else is
// refused with an alert:
//
//   - key exchange mode psk_dhe_ke only (the PSK plus an X25519 or P-256
//     key share, so that a stolen key file does not decrypt recorded
//     sessions); a client offering only psk_ke gets insufficient_security;
//     a client whose key shares are of no group the server takes gets one
//     HelloRetryRequest;
//   - every key is bound to SHA-256, the hash GnuTLS (psktool's keys,
//     nbdkit, libnbd) uses external PSKs with in TLS 1.3: RFC 8446 4.2.11
//     and RFC 9257 tie a PSK to one hash, and a key file names none. So
//     the cipher suites are TLS_AES_128_GCM_SHA256 and
//     TLS_CHACHA20_POLY1305_SHA256 (the client's order decides); a client
//     offering neither (TLS_AES_256_GCM_SHA384 only) gets
//     handshake_failure, and a binder of another hash's length for a
//     known identity (a client using the key with SHA-384) decrypt_error;
//   - the client's binder for the PSK it names is verified (in constant
//     time) before any key is derived from it; an unknown identity gets
//     unknown_psk_identity, a wrong key decrypt_error;
//   - no certificates, no session tickets, no 0-RTT data (a client
//     offering early data is refused), no renegotiation (TLS 1.3 has none;
//     a handshake message after the handshake other than KeyUpdate ends
//     the connection); KeyUpdate from the client is honoured (one asking
//     for the server's is answered before the server's next data, once for
//     any number of requests) and the server updates its own keys before a
//     key's record limit;
//   - records that carry no data (empty ones, KeyUpdates, user_canceled)
//     are taken at most 32 in a row, and padding counts toward the record
//     size limit.
//
// Primitives (AEADs, HKDF, HMAC, ECDH, hashes) are the standard library's
// and golang.org/x/crypto's; this package only frames and sequences them.
// Parsing goes through golang.org/x/crypto/cryptobyte, and the ClientHello
// parser and the record reader have fuzz targets.
//
// Keys are read from a file in psktool's format (LoadKeyFile), one
// "identity:hexkey" per line, which must not be readable by group or
// others; a key shorter than 16 bytes is refused (a recorded handshake
// lets anyone test guesses of it offline). Keys are never logged or put in errors; identities appear only
// in errors returned to the caller, who decides whether to log them.
//
// The zero value of Keys is an empty key set; a Conn comes only from
// Handshake. A Conn is safe for one goroutine reading and any number
// writing concurrently (writes are serialised); Close may be called from
// any goroutine, and does not wait for a write blocked on a peer that does
// not read (it closes the connection under it, without close_notify).
package tlspsk
