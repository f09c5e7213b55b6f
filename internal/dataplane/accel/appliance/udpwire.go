package appliance

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The slot's UDP message path (docs/accelerators.md, "UDP messages"): one
// request per datagram, one reply per datagram, after a HELLO that
// presents the lease credential and names the entry point. Every datagram
// starts with a 16-byte header, big-endian:
//
//	0 u16 magic "RU"  2 u8 version  3 u8 op  4 u32 seq  8 u64 session
//
// HELLO's payload is u8 entry length, the entry, then the credential; its
// reply (WELCOME) carries the session in the header. REQ carries one item,
// its reply (RESP) the item's output, both with the request's seq. ERROR's
// payload is a message; a HELLO or REQ that fails gets one.
const (
	UDPMagic      = 0x5255
	UDPVersion    = 1
	UDPHeaderSize = 16
	// MaxUDPPayload is the largest payload of one datagram (an IPv4 UDP
	// datagram's largest payload less the header).
	MaxUDPPayload = 65507 - UDPHeaderSize
)

// UDP message ops.
const (
	UDPHello   uint8 = 1
	UDPWelcome uint8 = 2
	UDPReq     uint8 = 3
	UDPResp    uint8 = 4
	UDPError   uint8 = 5
)

// ErrBadDatagram reports a datagram that does not parse.
var ErrBadDatagram = errors.New("appliance: malformed datagram")

// UDPHeader is a datagram's header.
type UDPHeader struct {
	Op      uint8
	Seq     uint32
	Session uint64
}

// AppendUDP appends a datagram (header and payload) to b.
func AppendUDP(b []byte, h UDPHeader, payload []byte) []byte {
	var f [UDPHeaderSize]byte
	binary.BigEndian.PutUint16(f[0:], UDPMagic)
	f[2] = UDPVersion
	f[3] = h.Op
	binary.BigEndian.PutUint32(f[4:], h.Seq)
	binary.BigEndian.PutUint64(f[8:], h.Session)
	return append(append(b, f[:]...), payload...)
}

// DecodeUDP parses a datagram into its header and payload (aliasing d).
func DecodeUDP(d []byte) (UDPHeader, []byte, error) {
	if len(d) < UDPHeaderSize {
		return UDPHeader{}, nil, fmt.Errorf("%w: %d bytes", ErrBadDatagram, len(d))
	}
	if m := binary.BigEndian.Uint16(d); m != UDPMagic {
		return UDPHeader{}, nil, fmt.Errorf("%w: magic %#04x", ErrBadDatagram, m)
	}
	if d[2] != UDPVersion {
		return UDPHeader{}, nil, fmt.Errorf("%w: version %d", ErrBadDatagram, d[2])
	}
	h := UDPHeader{Op: d[3], Seq: binary.BigEndian.Uint32(d[4:]), Session: binary.BigEndian.Uint64(d[8:])}
	if h.Op < UDPHello || h.Op > UDPError {
		return h, nil, fmt.Errorf("%w: op %d", ErrBadDatagram, h.Op)
	}
	return h, d[UDPHeaderSize:], nil
}

// HelloPayload builds a HELLO's payload.
func HelloPayload(entry string, credential []byte) []byte {
	return append(append([]byte{byte(len(entry))}, entry...), credential...)
}

// DecodeHelloPayload splits a HELLO's payload into entry and credential.
func DecodeHelloPayload(p []byte) (string, []byte, error) {
	if len(p) < 1 || int(p[0]) > len(p)-1 {
		return "", nil, fmt.Errorf("%w: hello", ErrBadDatagram)
	}
	n := int(p[0])
	entry, cred := string(p[1:1+n]), p[1+n:]
	if entry == "" || len(cred) == 0 {
		return "", nil, fmt.Errorf("%w: hello without entry or credential", ErrBadDatagram)
	}
	return entry, cred, nil
}
