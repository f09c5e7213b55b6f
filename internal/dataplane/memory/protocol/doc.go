// Package protocol is the wire format of the Rialto memory protocol, version
// 1 (docs/memory-protocol.md): the 32-byte frame header, the HELLO payload
// that presents a lease credential and names the connection's kind, the
// status codes and the sentinel errors they map to, and the rialto-mem://
// URI a memory lease is reached at.
//
// It does no I/O beyond ReadFrame over a caller's io.Reader; the donor
// (package donor) and the client (package client) drive the connections.
// DecodeHeader and DecodeHello are the decoders applied to untrusted input
// and are fuzzed, as is ParseURI.
//
// Zero values: the zero Header, Hello, Frame and URI are valid values (an
// all-zero header does not decode: its magic is wrong). Everything here is
// a value or a pure function, safe for concurrent use.
package protocol
