package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Wire constants of the Rialto memory protocol, version 1
// (docs/memory-protocol.md).
const (
	Magic      = 0x524D // "RM"
	Version    = 1
	HeaderSize = 32

	// MaxPayload bounds the bytes carried by one frame (and so one READ or
	// WRITE request). Larger transfers are split by the client.
	MaxPayload = 1 << 20
	// MaxCredential bounds the credential presented in HELLO.
	MaxCredential = 256
	// MaxMessage bounds an error message carried by an error response.
	MaxMessage = 512

	// HelloFixed is the size of a HELLO payload before the credential: kind
	// u8, reserved u8, credential length u16, session u64.
	HelloFixed = 12
	// HelloReplySize is the size of a HELLO reply's payload: session u64,
	// queue id u32.
	HelloReplySize = 12
	// HelloReplyGenSize is the size of a HELLO reply's payload that also
	// carries the region's generation (u64). A donor sends it to a client
	// whose HELLO request's length field is at least HelloReplyGenSize
	// (the largest reply it reads); older clients send 0 there, and older
	// donors ignore the field and send HelloReplySize.
	HelloReplyGenSize = 20
)

// Opcodes.
const (
	OpHello  uint8 = 1 // client → donor: credential, connection kind, session
	OpRead   uint8 = 2 // read length bytes at offset
	OpWrite  uint8 = 3 // write the payload at offset
	OpCredit uint8 = 4 // donor → client on the control connection: cumulative credits
	OpPing   uint8 = 5 // liveness probe, echoed
)

// Header flags.
const (
	FlagResponse uint16 = 1 << 0 // frame travels donor → client
)

// Status codes carried by responses.
const (
	StatusOK      uint16 = 0
	StatusAuth    uint16 = 1 // credential unknown
	StatusBusy    uint16 = 2 // the region has another subscriber
	StatusRange   uint16 = 3 // offset/length outside the region
	StatusProto   uint16 = 4 // malformed or unexpected frame
	StatusCredit  uint16 = 5 // queue request beyond granted credits
	StatusGone    uint16 = 6 // region released or donor shutting down
	StatusVersion uint16 = 7 // unsupported protocol version
	// StatusTLSRequired answers a plaintext HELLO on a donor that requires
	// TLS (the credential is not looked at).
	StatusTLSRequired uint16 = 8
	// StatusLimit refuses a data connection's HELLO past the donor's
	// connection limits (per session, donor-wide, or a session's share
	// while the donor is near its limit). Older clients (before this
	// status) read it as a malformed frame: their connection is refused
	// either way.
	StatusLimit    uint16 = 9
	statusMaxKnown        = StatusLimit
)

// Connection kinds named in HELLO.
const (
	KindControl uint8 = 1 // session anchor; carries credit updates
	KindSync    uint8 = 2 // fine-grained synchronous
	KindBulk    uint8 = 3 // one stream of the bulk channel
	KindQueue   uint8 = 4 // one asynchronous queue pair
	KindFault   uint8 = 5 // a mapping's fault handler (served spin-then-block)
)

// Sentinel errors. Errors returned by the client wrap one of these.
var (
	ErrBadFrame   = errors.New("memory: malformed frame")
	ErrAuth       = errors.New("memory: credential refused")
	ErrBusy       = errors.New("memory: region has another subscriber")
	ErrOutOfRange = errors.New("memory: offset or length outside the region")
	ErrCredit     = errors.New("memory: queue credit violated")
	ErrGone       = errors.New("memory: region released")
	ErrVersion    = errors.New("memory: unsupported protocol version")
	// ErrTLSRequired: the donor requires TLS and the client connected in
	// plaintext (a rialto-mem:// URI, or Options.TLS unset).
	ErrTLSRequired = errors.New("memory: the donor requires TLS (use its rialto-mems:// URI and the cluster CA)")
	ErrDonorLost   = errors.New("memory: donor connection lost")
	// ErrConnLimit: the donor refused a data connection past its
	// connection limits (StatusLimit); the session's other connections
	// serve on. Not ErrBusy: the region has no other subscriber.
	ErrConnLimit = errors.New("memory: the donor's connection limit is reached")
	// ErrRecreated: the donor serves the region's credential at the same
	// place with another generation than the session first saw: the
	// region was created again (its donor restarted) and its contents are
	// gone.
	ErrRecreated = errors.New("memory: region was recreated (its contents are gone): the lease is lost")
	ErrClosed    = errors.New("memory: client closed")
)

// statusErr maps a status code to its sentinel error.
func statusErr(s uint16) error {
	switch s {
	case StatusAuth:
		return ErrAuth
	case StatusBusy:
		return ErrBusy
	case StatusRange:
		return ErrOutOfRange
	case StatusCredit:
		return ErrCredit
	case StatusGone:
		return ErrGone
	case StatusVersion:
		return ErrVersion
	case StatusTLSRequired:
		return ErrTLSRequired
	case StatusLimit:
		return ErrConnLimit
	default:
		return ErrBadFrame
	}
}

// Header is one frame header. All integers are big-endian on the wire:
//
//	0  u16 magic    2 u8 version   3 u8 op
//	4  u16 flags    6 u16 status
//	8  u32 seq      12 u32 payload length
//	16 u64 offset
//	24 u32 length   28 u32 credits
type Header struct {
	Op      uint8
	Flags   uint16
	Status  uint16
	Seq     uint32
	Payload uint32 // bytes that follow the header
	Offset  uint64
	Length  uint32
	Credits uint32
}

// IsResponse reports whether the frame travels donor → client.
func (h *Header) IsResponse() bool { return h.Flags&FlagResponse != 0 }

// Encode writes h into b[:HeaderSize].
func (h *Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	binary.BigEndian.PutUint16(b[0:], Magic)
	b[2] = Version
	b[3] = h.Op
	binary.BigEndian.PutUint16(b[4:], h.Flags)
	binary.BigEndian.PutUint16(b[6:], h.Status)
	binary.BigEndian.PutUint32(b[8:], h.Seq)
	binary.BigEndian.PutUint32(b[12:], h.Payload)
	binary.BigEndian.PutUint64(b[16:], h.Offset)
	binary.BigEndian.PutUint32(b[24:], h.Length)
	binary.BigEndian.PutUint32(b[28:], h.Credits)
}

// DecodeHeader parses and validates a header. It checks everything that can
// be checked without knowing the region: magic, version, opcode, flags,
// status and the consistency of payload and length for each opcode.
func DecodeHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, fmt.Errorf("%w: short header (%d bytes)", ErrBadFrame, len(b))
	}
	if m := binary.BigEndian.Uint16(b[0:]); m != Magic {
		return h, fmt.Errorf("%w: bad magic %#04x", ErrBadFrame, m)
	}
	if v := b[2]; v != Version {
		return h, fmt.Errorf("%w: version %d", ErrVersion, v)
	}
	h.Op = b[3]
	h.Flags = binary.BigEndian.Uint16(b[4:])
	h.Status = binary.BigEndian.Uint16(b[6:])
	h.Seq = binary.BigEndian.Uint32(b[8:])
	h.Payload = binary.BigEndian.Uint32(b[12:])
	h.Offset = binary.BigEndian.Uint64(b[16:])
	h.Length = binary.BigEndian.Uint32(b[24:])
	h.Credits = binary.BigEndian.Uint32(b[28:])
	if h.Flags&^FlagResponse != 0 {
		return h, fmt.Errorf("%w: unknown flags %#x", ErrBadFrame, h.Flags)
	}
	if h.Status > statusMaxKnown {
		return h, fmt.Errorf("%w: unknown status %d", ErrBadFrame, h.Status)
	}
	resp := h.IsResponse()
	if !resp && h.Status != StatusOK {
		return h, fmt.Errorf("%w: request with status %d", ErrBadFrame, h.Status)
	}
	if h.Payload > MaxPayload {
		return h, fmt.Errorf("%w: payload %d exceeds %d", ErrBadFrame, h.Payload, MaxPayload)
	}
	if resp && h.Status != StatusOK {
		// Error response: payload is a message; any opcode.
		if h.Payload > MaxMessage {
			return h, fmt.Errorf("%w: error message of %d bytes", ErrBadFrame, h.Payload)
		}
		if h.Op < OpHello || h.Op > OpPing {
			return h, fmt.Errorf("%w: unknown opcode %d", ErrBadFrame, h.Op)
		}
		return h, nil
	}
	switch h.Op {
	case OpHello:
		if !resp && (h.Payload < HelloFixed || h.Payload > HelloFixed+MaxCredential) {
			return h, fmt.Errorf("%w: hello payload of %d bytes", ErrBadFrame, h.Payload)
		}
		if resp && h.Payload != HelloReplySize && h.Payload != HelloReplyGenSize {
			return h, fmt.Errorf("%w: hello reply payload of %d bytes", ErrBadFrame, h.Payload)
		}
	case OpRead:
		if h.Length > MaxPayload {
			return h, fmt.Errorf("%w: read of %d bytes", ErrBadFrame, h.Length)
		}
		want := uint32(0)
		if resp {
			want = h.Length
		}
		if h.Payload != want {
			return h, fmt.Errorf("%w: read payload %d, length %d", ErrBadFrame, h.Payload, h.Length)
		}
	case OpWrite:
		want := h.Length
		if resp {
			want = 0
		}
		if h.Payload != want {
			return h, fmt.Errorf("%w: write payload %d, length %d", ErrBadFrame, h.Payload, h.Length)
		}
	case OpCredit:
		if !resp || h.Payload != 0 {
			return h, fmt.Errorf("%w: credit frame", ErrBadFrame)
		}
	case OpPing:
		if h.Payload != 0 {
			return h, fmt.Errorf("%w: ping with payload", ErrBadFrame)
		}
	default:
		return h, fmt.Errorf("%w: unknown opcode %d", ErrBadFrame, h.Op)
	}
	return h, nil
}

// Hello is the payload of a HELLO request.
type Hello struct {
	Kind       uint8
	Session    uint64 // 0 asks for a new session (control connections only)
	Credential string
}

// Encode appends the HELLO payload to b.
func (m *Hello) Encode(b []byte) []byte {
	var f [HelloFixed]byte
	f[0] = m.Kind
	binary.BigEndian.PutUint16(f[2:], uint16(len(m.Credential)))
	binary.BigEndian.PutUint64(f[4:], m.Session)
	b = append(b, f[:]...)
	return append(b, m.Credential...)
}

// DecodeHello parses a HELLO payload.
func DecodeHello(p []byte) (Hello, error) {
	var m Hello
	if len(p) < HelloFixed {
		return m, fmt.Errorf("%w: short hello", ErrBadFrame)
	}
	m.Kind = p[0]
	if m.Kind < KindControl || m.Kind > KindFault {
		return m, fmt.Errorf("%w: connection kind %d", ErrBadFrame, m.Kind)
	}
	if p[1] != 0 {
		return m, fmt.Errorf("%w: reserved hello byte set", ErrBadFrame)
	}
	n := int(binary.BigEndian.Uint16(p[2:]))
	m.Session = binary.BigEndian.Uint64(p[4:])
	if n == 0 || n > MaxCredential || len(p) != HelloFixed+n {
		return m, fmt.Errorf("%w: credential length %d in %d-byte hello", ErrBadFrame, n, len(p))
	}
	if (m.Kind == KindControl) != (m.Session == 0) {
		return m, fmt.Errorf("%w: session %d on a kind %d connection", ErrBadFrame, m.Session, m.Kind)
	}
	m.Credential = string(p[HelloFixed:])
	return m, nil
}

// MoveGeneration is the generation a HELLO request h carries in its
// offset field: a move's source opening its session with the region it
// sends to (a control connection) puts the generation of the region it
// moves there, which the destination's region takes when it is served as
// the lease's (donor.ReceiveRegion, ActivateRegion), so that a moved
// region keeps its generation. 0: none (every other client; older donors
// ignore the field).
func MoveGeneration(h Header) uint64 {
	if h.Op != OpHello || h.IsResponse() {
		return 0
	}
	return h.Offset
}

// ReplacedConnection is the connection a data connection's HELLO
// request h replaces, carried in its offset field: the id (HelloReply's
// Queue) of a connection of the same session that its client gave up —
// it broke, or a request on it timed out or was cancelled — and
// re-establishes with this one (a queue pair that failed with WRITEs in
// flight has it ended at once, and goes on on the new connection with
// its next request, or closes it). The donor
// ends that connection, a WRITE under way or held on it included, and
// answers the HELLO once its handler has returned, so that nothing of
// what the client sent on it lands after what it sends next, on this
// connection or another of the session. 0: none (a connection the
// session adds; older clients send 0, and older donors ignore the field).
// A control HELLO's offset is its MoveGeneration instead.
func ReplacedConnection(h Header) uint32 {
	if h.Op != OpHello || h.IsResponse() || h.Offset > 1<<32-1 {
		return 0
	}
	return uint32(h.Offset)
}

// HelloReply is the payload of a HELLO reply. Queue is the connection's
// id within its session (a queue pair's queue id, which CREDIT frames
// name), which a HELLO that replaces the connection names
// (ReplacedConnection); 0 for a control connection, and for every
// connection but a queue's from older donors. Generation identifies the
// region's instance at its donor: a random non-zero value drawn when the
// region is created, the same for every session on it, different for a
// region created again under the same credential (after the donor
// restarted). Zero: not carried (an older donor, or a client that did not
// ask for it).
type HelloReply struct {
	Session    uint64
	Queue      uint32
	Generation uint64
}

// Encode appends the reply's payload to b: HelloReplyGenSize bytes with
// the generation when gen, else HelloReplySize.
func (m *HelloReply) Encode(b []byte, gen bool) []byte {
	var f [HelloReplyGenSize]byte
	binary.BigEndian.PutUint64(f[0:], m.Session)
	binary.BigEndian.PutUint32(f[8:], m.Queue)
	if !gen {
		return append(b, f[:HelloReplySize]...)
	}
	binary.BigEndian.PutUint64(f[12:], m.Generation)
	return append(b, f[:]...)
}

// DecodeHelloReply parses a HELLO reply's payload (with or without the
// generation).
func DecodeHelloReply(p []byte) (HelloReply, error) {
	var m HelloReply
	if len(p) != HelloReplySize && len(p) != HelloReplyGenSize {
		return m, fmt.Errorf("%w: hello reply of %d bytes", ErrBadFrame, len(p))
	}
	m.Session = binary.BigEndian.Uint64(p)
	m.Queue = binary.BigEndian.Uint32(p[8:])
	if len(p) == HelloReplyGenSize {
		m.Generation = binary.BigEndian.Uint64(p[12:])
		if m.Generation == 0 {
			return m, fmt.Errorf("%w: hello reply with generation 0", ErrBadFrame)
		}
	}
	return m, nil
}

// Frame is a decoded header with its payload.
type Frame struct {
	Header
	Data []byte
}

// ReadFrame reads one frame from r, reusing buf for the payload when it is
// large enough. It is the decoder the donor applies to untrusted input.
func ReadFrame(r io.Reader, hdr []byte, buf []byte) (Frame, error) {
	if _, err := io.ReadFull(r, hdr[:HeaderSize]); err != nil {
		return Frame{}, err
	}
	h, err := DecodeHeader(hdr[:HeaderSize])
	if err != nil {
		return Frame{Header: h}, err
	}
	f := Frame{Header: h}
	if h.Payload > 0 {
		if cap(buf) < int(h.Payload) {
			buf = make([]byte, h.Payload)
		}
		f.Data = buf[:h.Payload]
		if _, err := io.ReadFull(r, f.Data); err != nil {
			return f, fmt.Errorf("%w: payload: %v", ErrBadFrame, err)
		}
	}
	return f, nil
}

// StatusError is the error for an error response: the status's sentinel,
// with the donor's message when it says more.
func StatusError(s uint16, msg []byte) error {
	e := statusErr(s)
	m := string(msg)
	if m == "" || m == e.Error() {
		return e
	}
	if strings.HasPrefix(m, e.Error()+": ") {
		m = strings.TrimPrefix(m, e.Error()+": ")
	}
	return fmt.Errorf("%w: %s", e, m)
}
