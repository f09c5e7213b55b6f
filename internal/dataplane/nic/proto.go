package nic

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
)

// Wire constants of the NIC tunnel, version 2 (docs/nic.md). Version 1
// sent the lease credential itself in the HELLO.
const (
	// Magic opens HELLO, CHALLENGE and WELCOME ("RNIC").
	Magic   = 0x524E4943
	Version = 2

	// HeaderSize is the size of a frame header.
	HeaderSize = 8
	// MaxPacket bounds an IP packet carried by one DATA frame.
	MaxPacket = 65535
	// MinMTU and MaxMTU bound the MTU a tunnel agrees on.
	MinMTU = 576
	MaxMTU = 9000
	// MaxCredential bounds a lease credential.
	MaxCredential = 256
	// MaxMessage bounds an error message.
	MaxMessage = 512
	// MaxRoutes bounds the routes a WELCOME advertises.
	MaxRoutes = 64
	// MaxConns bounds the connections (queue pairs) of one session.
	MaxConns = 16

	// HelloSize is the size of a HELLO.
	HelloSize = 60
	// LeaseIDSize is the size of the lease id a HELLO names (LeaseID).
	LeaseIDSize = 32
	// ChallengeSize is the size of the lender's random challenge, and
	// ChallengeMsgSize that of the CHALLENGE that carries it.
	ChallengeSize    = 32
	ChallengeMsgSize = 8 + ChallengeSize
	// ProofSize is the size of the borrower's PROOF (HMAC-SHA256).
	ProofSize = 32
	// WelcomeFixed is the size of a WELCOME before its routes and message.
	WelcomeFixed = 32
)

// Frame types.
const (
	FrameData   uint8 = 1 // an IP packet; Seq orders it within its session and direction
	FrameCredit uint8 = 2 // 8-byte payload: cumulative bytes the sender may now have sent
	FramePing   uint8 = 3 // 8-byte payload, echoed in a PONG
	FramePong   uint8 = 4
	FrameError  uint8 = 5 // u8 status, then a message; the connection ends
	maxFrame          = FrameError
)

// Status codes of WELCOME and ERROR.
const (
	StatusOK      uint8 = 0
	StatusAuth    uint8 = 1 // lease unknown, or the proof of its credential wrong
	StatusProto   uint8 = 2 // malformed or unexpected frame
	StatusCredit  uint8 = 3 // data beyond the granted credits
	StatusGone    uint8 = 4 // lease ended or lender shutting down
	StatusVersion uint8 = 5 // unsupported version
	StatusBusy    uint8 = 6 // the session is full or replaced
	StatusAddr    uint8 = 7 // the requested address cannot be given
	StatusTLS     uint8 = 8 // the lender serves its tunnel under TLS only
	maxStatus           = StatusTLS
)

// Sentinel errors. Errors returned by this package wrap one of these.
var (
	ErrBadFrame = errors.New("nic: malformed frame")
	ErrAuth     = errors.New("nic: credential refused")
	ErrCredit   = errors.New("nic: credit window violated")
	ErrGone     = errors.New("nic: lease ended")
	ErrVersion  = errors.New("nic: unsupported protocol version")
	ErrBusy     = errors.New("nic: session busy")
	ErrAddr     = errors.New("nic: address unavailable")
	ErrClosed   = errors.New("nic: closed")
	ErrLost     = errors.New("nic: lender connection lost")
	// ErrTLS: the lender's tunnel is not under TLS with a certificate
	// the borrower accepts (Config.TLS).
	ErrTLS = errors.New("nic: lender refused over TLS")
	// ErrTLSRequired: the lender serves its tunnel under TLS only, and
	// was sent a plaintext HELLO (StatusTLS).
	ErrTLSRequired = errors.New("nic: the lender requires TLS (use the lease's rialto-nics:// URI and the cluster CA)")
	// ErrNoCA: a member's tunnel runs under TLS and Config.TLS is nil.
	ErrNoCA = errors.New("nic: no cluster CA")
)

// StatusErr maps a status code to its sentinel error (nil for StatusOK).
func StatusErr(s uint8) error {
	switch s {
	case StatusOK:
		return nil
	case StatusAuth:
		return ErrAuth
	case StatusCredit:
		return ErrCredit
	case StatusGone:
		return ErrGone
	case StatusVersion:
		return ErrVersion
	case StatusBusy:
		return ErrBusy
	case StatusAddr:
		return ErrAddr
	case StatusTLS:
		return ErrTLSRequired
	default:
		return ErrBadFrame
	}
}

// statusOf maps an error to the status code that reports it.
func statusOf(err error) uint8 {
	for _, c := range []struct {
		e error
		s uint8
	}{{ErrAuth, StatusAuth}, {ErrCredit, StatusCredit}, {ErrGone, StatusGone}, {ErrVersion, StatusVersion},
		{ErrBusy, StatusBusy}, {ErrAddr, StatusAddr}, {ErrTLSRequired, StatusTLS}} {
		if errors.Is(err, c.e) {
			return c.s
		}
	}
	return StatusProto
}

// Header is a frame header, big-endian on the wire:
//
//	0 u8 type   1 u8 flags (0)   2 u16 payload length   4 u32 seq
type Header struct {
	Type   uint8
	Length uint16
	Seq    uint32
}

// Encode writes h into b[:HeaderSize].
func (h Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = h.Type
	b[1] = 0
	binary.BigEndian.PutUint16(b[2:], h.Length)
	binary.BigEndian.PutUint32(b[4:], h.Seq)
}

// DecodeHeader parses and validates a frame header: a known type, no
// flags, and a payload length that fits the type.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: short header (%d bytes)", ErrBadFrame, len(b))
	}
	h := Header{Type: b[0], Length: binary.BigEndian.Uint16(b[2:]), Seq: binary.BigEndian.Uint32(b[4:])}
	if b[1] != 0 {
		return h, fmt.Errorf("%w: flags %#x", ErrBadFrame, b[1])
	}
	switch h.Type {
	case FrameData:
		if h.Length < 20 {
			return h, fmt.Errorf("%w: data frame of %d bytes is no IP packet", ErrBadFrame, h.Length)
		}
	case FrameCredit, FramePing, FramePong:
		if h.Length != 8 {
			return h, fmt.Errorf("%w: type %d frame of %d bytes, want 8", ErrBadFrame, h.Type, h.Length)
		}
	case FrameError:
		if h.Length < 1 || h.Length > 1+MaxMessage {
			return h, fmt.Errorf("%w: error frame of %d bytes", ErrBadFrame, h.Length)
		}
	default:
		return h, fmt.Errorf("%w: unknown frame type %d", ErrBadFrame, h.Type)
	}
	return h, nil
}

// Hello is the first message a borrower sends on every connection:
//
//	0 u32 magic  4 u8 version  5 u8 conns  6 u8 index  7 u8 reserved
//	8 u64 session  16 u32 window  20 u16 mtu  22 u16 reserved
//	24 [4] requested address (0.0.0.0: the lender chooses)
//	28 [32] lease (LeaseID of the credential)
//
// Session is the borrower's random name for the set of Conns connections
// (queue pairs) it opens; Index is this connection's place in it. Window
// is the download credit (bytes) the borrower grants the lender on this
// connection. Addr asks for a borrower address (a bond asks for the address
// the first lender gave). Lease names the lease without revealing its
// credential: the lender answers with a CHALLENGE, and the borrower proves
// it holds the credential with Proof, over the challenge and this HELLO.
type Hello struct {
	Conns   uint8
	Index   uint8
	Session uint64
	Window  uint32
	MTU     uint16
	Addr    netip.Addr
	Lease   [LeaseIDSize]byte
}

// LeaseID is what a HELLO names a lease by: a hash of its credential,
// which a passive observer may learn without learning the credential.
func LeaseID(credential string) [LeaseIDSize]byte {
	return sha256.Sum256([]byte("rialto-nic lease id\x00" + credential))
}

// Proof is the borrower's answer to a CHALLENGE: HMAC-SHA256 keyed by the
// lease credential over a label naming the direction (the borrower proves),
// the lender's challenge and the HELLO as sent (so the session id, the
// connection's index and the requested address are bound to it). A
// recorded proof is worth nothing on another connection: the lender draws a
// fresh challenge for each.
func Proof(credential string, challenge [ChallengeSize]byte, hello []byte) [ProofSize]byte {
	m := hmac.New(sha256.New, []byte(credential))
	m.Write([]byte("rialto-nic v2 borrower proof\x00"))
	m.Write(challenge[:])
	m.Write(hello)
	var p [ProofSize]byte
	m.Sum(p[:0])
	return p
}

// Encode appends the HELLO to b.
func (m *Hello) Encode(b []byte) []byte {
	var f [HelloSize]byte
	binary.BigEndian.PutUint32(f[0:], Magic)
	f[4] = Version
	f[5] = m.Conns
	f[6] = m.Index
	binary.BigEndian.PutUint64(f[8:], m.Session)
	binary.BigEndian.PutUint32(f[16:], m.Window)
	binary.BigEndian.PutUint16(f[20:], m.MTU)
	if m.Addr.Is4() {
		a := m.Addr.As4()
		copy(f[24:28], a[:])
	}
	copy(f[28:], m.Lease[:])
	return append(b, f[:]...)
}

// checkPreamble validates the 8 bytes every HELLO, CHALLENGE and WELCOME
// start with: the magic and the version.
func checkPreamble(f []byte) error {
	if mg := binary.BigEndian.Uint32(f); mg != Magic {
		return fmt.Errorf("%w: bad magic %#08x", ErrBadFrame, mg)
	}
	if f[4] != Version {
		return fmt.Errorf("%w: version %d", ErrVersion, f[4])
	}
	return nil
}

// DecodeHello parses and validates a HELLO.
func DecodeHello(f []byte) (Hello, error) {
	var m Hello
	if len(f) != HelloSize {
		return m, fmt.Errorf("%w: hello of %d bytes, want %d", ErrBadFrame, len(f), HelloSize)
	}
	if err := checkPreamble(f); err != nil {
		return m, err
	}
	m.Conns, m.Index = f[5], f[6]
	m.Session = binary.BigEndian.Uint64(f[8:])
	m.Window = binary.BigEndian.Uint32(f[16:])
	m.MTU = binary.BigEndian.Uint16(f[20:])
	if a := netip.AddrFrom4([4]byte(f[24:28])); !a.IsUnspecified() {
		m.Addr = a
	}
	copy(m.Lease[:], f[28:])
	switch {
	case f[7] != 0 || f[22] != 0 || f[23] != 0:
		return m, fmt.Errorf("%w: reserved hello bytes set", ErrBadFrame)
	case m.Conns == 0 || m.Conns > MaxConns || m.Index >= m.Conns:
		return m, fmt.Errorf("%w: connection %d of %d", ErrBadFrame, m.Index, m.Conns)
	case m.Session == 0:
		return m, fmt.Errorf("%w: session 0", ErrBadFrame)
	case m.MTU < MinMTU || m.MTU > MaxMTU:
		return m, fmt.Errorf("%w: mtu %d outside %d..%d", ErrBadFrame, m.MTU, MinMTU, MaxMTU)
	case m.Window < uint32(m.MTU):
		return m, fmt.Errorf("%w: window %d below one mtu", ErrBadFrame, m.Window)
	}
	return m, nil
}

// ReadHello reads a HELLO from r. It checks the magic and the version
// before it waits for the rest, so that a peer speaking another version
// is answered at once.
func ReadHello(r io.Reader) (Hello, error) {
	var f [HelloSize]byte
	if _, err := io.ReadFull(r, f[:8]); err != nil {
		return Hello{}, err
	}
	if err := checkPreamble(f[:8]); err != nil {
		return Hello{}, err
	}
	if _, err := io.ReadFull(r, f[8:]); err != nil {
		return Hello{}, fmt.Errorf("%w: hello: %v", ErrBadFrame, err)
	}
	return DecodeHello(f[:])
}

// EncodeChallenge appends a CHALLENGE, the lender's answer to a
// well-formed HELLO:
//
//	0 u32 magic  4 u8 version  5 u8 status (0)  6 u16 reserved  8 [32] challenge
//
// Its first 6 bytes are a WELCOME's: a lender that refuses a HELLO
// outright answers a WELCOME with a status other than StatusOK instead.
func EncodeChallenge(b []byte, c [ChallengeSize]byte) []byte {
	var f [ChallengeMsgSize]byte
	binary.BigEndian.PutUint32(f[0:], Magic)
	f[4] = Version
	copy(f[8:], c[:])
	return append(b, f[:]...)
}

// DecodeChallenge parses a whole CHALLENGE.
func DecodeChallenge(p []byte) ([ChallengeSize]byte, error) {
	var c [ChallengeSize]byte
	if len(p) != ChallengeMsgSize {
		return c, fmt.Errorf("%w: challenge of %d bytes, want %d", ErrBadFrame, len(p), ChallengeMsgSize)
	}
	if err := checkPreamble(p); err != nil {
		return c, err
	}
	if p[5] != StatusOK || p[6] != 0 || p[7] != 0 {
		return c, fmt.Errorf("%w: challenge status %d, reserved %#x", ErrBadFrame, p[5], p[6:8])
	}
	copy(c[:], p[8:])
	return c, nil
}

// ReadChallenge reads the lender's answer to a HELLO: a CHALLENGE, or a
// WELCOME refusing the HELLO (refused, its Status not StatusOK).
func ReadChallenge(r io.Reader) (c [ChallengeSize]byte, refused *Welcome, err error) {
	var f [ChallengeMsgSize]byte
	if _, err := io.ReadFull(r, f[:8]); err != nil {
		return c, nil, err
	}
	if err := checkPreamble(f[:8]); err != nil {
		return c, nil, err
	}
	if f[5] != StatusOK {
		w, err := ReadWelcome(io.MultiReader(bytes.NewReader(f[:8]), r))
		if err != nil {
			return c, nil, err
		}
		return c, &w, nil
	}
	if _, err := io.ReadFull(r, f[8:]); err != nil {
		return c, nil, fmt.Errorf("%w: challenge: %v", ErrBadFrame, err)
	}
	c, err = DecodeChallenge(f[:])
	return c, nil, err
}

// Welcome is the lender's answer to a HELLO:
//
//	0 u32 magic  4 u8 version  5 u8 status  6 u16 mtu
//	8 u32 window  12 [4] borrower address  16 u64 rate (bits/s, 0: uncapped)
//	24 u8 routes  25 u8 reserved  26 u16 message length  28 u32 reserved
//	32 routes × ([4] prefix, u8 bits)  then the message
//
// On StatusOK, Window is the upload credit (bytes) granted on this
// connection, Addr the borrower's address and Routes the prefixes the lent
// interface reaches (0.0.0.0/0 if it has a default route). Otherwise
// Message says why.
type Welcome struct {
	Status  uint8
	MTU     uint16
	Window  uint32
	Addr    netip.Addr
	Rate    uint64
	Routes  []netip.Prefix
	Message string
}

// Encode appends the WELCOME to b. Routes that are not IPv4 are skipped.
func (w *Welcome) Encode(b []byte) []byte {
	var f [WelcomeFixed]byte
	binary.BigEndian.PutUint32(f[0:], Magic)
	f[4] = Version
	f[5] = w.Status
	binary.BigEndian.PutUint16(f[6:], w.MTU)
	binary.BigEndian.PutUint32(f[8:], w.Window)
	if w.Addr.Is4() {
		a := w.Addr.As4()
		copy(f[12:16], a[:])
	}
	binary.BigEndian.PutUint64(f[16:], w.Rate)
	var routes []netip.Prefix
	for _, r := range w.Routes {
		if r.Addr().Is4() && len(routes) < MaxRoutes {
			routes = append(routes, r.Masked())
		}
	}
	f[24] = uint8(len(routes))
	msg := w.Message
	if len(msg) > MaxMessage {
		msg = msg[:MaxMessage]
	}
	binary.BigEndian.PutUint16(f[26:], uint16(len(msg)))
	b = append(b, f[:]...)
	for _, r := range routes {
		a := r.Addr().As4()
		b = append(append(b, a[:]...), uint8(r.Bits()))
	}
	return append(b, msg...)
}

// ReadWelcome reads and validates a WELCOME from r.
func ReadWelcome(r io.Reader) (Welcome, error) {
	var f [WelcomeFixed]byte
	if _, err := io.ReadFull(r, f[:]); err != nil {
		return Welcome{}, err
	}
	w, nr, nm, err := decodeWelcomeFixed(f[:])
	if err != nil {
		return w, err
	}
	rest := make([]byte, nr*5+nm)
	if _, err := io.ReadFull(r, rest); err != nil {
		return w, fmt.Errorf("%w: welcome: %v", ErrBadFrame, err)
	}
	return decodeWelcomeRest(w, nr, rest)
}

// DecodeWelcome parses a whole WELCOME.
func DecodeWelcome(p []byte) (Welcome, error) {
	w, nr, nm, err := decodeWelcomeFixed(p)
	if err != nil {
		return w, err
	}
	if len(p) != WelcomeFixed+nr*5+nm {
		return w, fmt.Errorf("%w: welcome of %d bytes, want %d", ErrBadFrame, len(p), WelcomeFixed+nr*5+nm)
	}
	return decodeWelcomeRest(w, nr, p[WelcomeFixed:])
}

func decodeWelcomeFixed(f []byte) (Welcome, int, int, error) {
	var w Welcome
	if len(f) < WelcomeFixed {
		return w, 0, 0, fmt.Errorf("%w: short welcome", ErrBadFrame)
	}
	if err := checkPreamble(f); err != nil {
		return w, 0, 0, err
	}
	w.Status = f[5]
	w.MTU = binary.BigEndian.Uint16(f[6:])
	w.Window = binary.BigEndian.Uint32(f[8:])
	w.Addr = netip.AddrFrom4([4]byte(f[12:16]))
	w.Rate = binary.BigEndian.Uint64(f[16:])
	nr, nm := int(f[24]), int(binary.BigEndian.Uint16(f[26:]))
	switch {
	case w.Status > maxStatus:
		return w, 0, 0, fmt.Errorf("%w: unknown status %d", ErrBadFrame, w.Status)
	case f[25] != 0 || binary.BigEndian.Uint32(f[28:]) != 0:
		return w, 0, 0, fmt.Errorf("%w: reserved welcome bytes set", ErrBadFrame)
	case nr > MaxRoutes || nm > MaxMessage:
		return w, 0, 0, fmt.Errorf("%w: %d routes, %d-byte message", ErrBadFrame, nr, nm)
	case w.Status == StatusOK && (w.MTU < MinMTU || w.MTU > MaxMTU):
		return w, 0, 0, fmt.Errorf("%w: mtu %d", ErrBadFrame, w.MTU)
	case w.Status == StatusOK && w.Window < uint32(w.MTU):
		return w, 0, 0, fmt.Errorf("%w: window %d below one mtu", ErrBadFrame, w.Window)
	case w.Status == StatusOK && (!w.Addr.IsGlobalUnicast() && !w.Addr.IsPrivate()):
		return w, 0, 0, fmt.Errorf("%w: borrower address %v", ErrBadFrame, w.Addr)
	}
	return w, nr, nm, nil
}

func decodeWelcomeRest(w Welcome, nr int, rest []byte) (Welcome, error) {
	for i := range nr {
		e := rest[i*5 : i*5+5]
		bits := int(e[4])
		if bits > 32 {
			return w, fmt.Errorf("%w: route /%d", ErrBadFrame, bits)
		}
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte(e[:4])), bits)
		if p != p.Masked() {
			return w, fmt.Errorf("%w: route %v has host bits", ErrBadFrame, p)
		}
		w.Routes = append(w.Routes, p)
	}
	w.Message = string(rest[nr*5:])
	return w, nil
}

// ErrorPayload builds an ERROR frame's payload.
func ErrorPayload(status uint8, msg string) []byte {
	if len(msg) > MaxMessage {
		msg = msg[:MaxMessage]
	}
	return append([]byte{status}, msg...)
}

// ParseError turns an ERROR frame's payload into an error wrapping the
// status's sentinel.
func ParseError(p []byte) error {
	if len(p) == 0 {
		return fmt.Errorf("%w: empty error frame", ErrBadFrame)
	}
	e := StatusErr(p[0])
	if e == nil {
		e = ErrBadFrame
	}
	if len(p) == 1 {
		return e
	}
	return fmt.Errorf("%w: %s", e, p[1:])
}
