package accel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Version is the protocol version HELLO and READY carry.
const Version = 1

// HeaderSize is the fixed frame header: u32 length (of what follows it),
// u8 op, u8 flags, u16 reserved (zero), u32 tag. All integers little-endian.
const HeaderSize = 12

// DefaultMaxPayload bounds a frame's payload unless a server says otherwise.
const DefaultMaxPayload = 64<<20 + 4096

// Op is a frame's operation.
type Op uint8

// Requests (client to server).
const (
	OpHello Op = 0x01 // u16 version, u16 n, credential[n]
	OpWrite Op = 0x02 // u64 addr, data
	OpRead  Op = 0x03 // u64 addr, u32 len
	OpStart Op = 0x04 // u64 in, u32 inLen, u64 out, u32 outCap, u16 n, entry[n], [inline input]
	OpPoll  Op = 0x05 // u32 task tag
	OpPing  Op = 0x06 // empty
	// OpCancel stops one task (a START's tag) of the same connection: its
	// context ends, a WebAssembly role is interrupted and a native one
	// stops at its next item. Answered OK if the task was running (the
	// task itself then ends with a pushed ERROR, code Canceled; a polled
	// task is forgotten), or ERROR UnknownTask if it was not (already
	// finished: a race the client must tolerate).
	OpCancel Op = 0x09 // u32 task tag
)

// Replies (server to client); a reply carries the tag of its request.
const (
	OpOK       Op = 0x80 // empty
	OpReady    Op = 0x81 // u16 version, u64 memSize, u32 maxPayload, str role, u16 k, k×str entries
	OpData     Op = 0x82 // bytes read
	OpAccepted Op = 0x83 // empty: task admitted, poll for it
	OpStatus   Op = 0x84 // u8 state, u32 outLen, [str error]
	OpDone     Op = 0x85 // u32 outLen, [inline output]
	OpError    Op = 0x8f // u16 code, message
)

// START flags.
const (
	FlagNotify uint8 = 1 << 0 // push DONE when the task completes (else ACCEPTED, then POLL)
	FlagBatch  uint8 = 1 << 1 // input and output are batch envelopes (EncodeBatch)
	FlagInline uint8 = 1 << 2 // input follows the entry in the frame; output comes back in DONE
)

// Task states in STATUS.
const (
	StateRunning uint8 = 0
	StateDone    uint8 = 1
	StateFailed  uint8 = 2
)

// Frame is one decoded frame.
type Frame struct {
	Op      Op
	Flags   uint8
	Tag     uint32
	Payload []byte
}

// Wire errors.
var (
	ErrFrame    = errors.New("accel: malformed frame")
	ErrTooLarge = errors.New("accel: frame too large")
)

// AppendFrame appends the encoding of f to b.
func AppendFrame(b []byte, f Frame) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(HeaderSize-4+len(f.Payload)))
	b = append(b, byte(f.Op), f.Flags, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, f.Tag)
	return append(b, f.Payload...)
}

// ReadFrame reads one frame whose payload is at most maxPayload bytes.
func ReadFrame(r io.Reader, maxPayload uint32) (Frame, error) {
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	n := binary.LittleEndian.Uint32(h[:])
	if n < HeaderSize-4 {
		return Frame{}, fmt.Errorf("%w: length %d below the header", ErrFrame, n)
	}
	if n-(HeaderSize-4) > maxPayload {
		return Frame{}, fmt.Errorf("%w: %d-byte payload above %d", ErrTooLarge, n-(HeaderSize-4), maxPayload)
	}
	if h[6] != 0 || h[7] != 0 {
		return Frame{}, fmt.Errorf("%w: reserved bytes set", ErrFrame)
	}
	f := Frame{Op: Op(h[4]), Flags: h[5], Tag: binary.LittleEndian.Uint32(h[8:])}
	p := n - (HeaderSize - 4)
	switch {
	case p == 0:
	case p <= 1<<20:
		f.Payload = make([]byte, p)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			return Frame{}, fmt.Errorf("%w: truncated payload: %v", ErrFrame, err)
		}
	default:
		// Large frames grow with the bytes that actually arrive, so a peer
		// cannot make us allocate by merely announcing a length.
		var b bytes.Buffer
		if _, err := io.CopyN(&b, r, int64(p)); err != nil {
			return Frame{}, fmt.Errorf("%w: truncated payload: %v", ErrFrame, err)
		}
		f.Payload = b.Bytes()
	}
	return f, nil
}

// dec reads little-endian fields from a payload, remembering the first
// shortfall.
type dec struct {
	p   []byte
	bad bool
}

func (d *dec) take(n int) []byte {
	if d.bad || n < 0 || len(d.p) < n {
		d.bad = true
		return nil
	}
	b := d.p[:n:n]
	d.p = d.p[n:]
	return b
}

func (d *dec) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *dec) u16() uint16 {
	if b := d.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *dec) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *dec) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *dec) str() string { return string(d.take(int(d.u16()))) }

func (d *dec) err(what string) error {
	if d.bad {
		return fmt.Errorf("%w: short %s payload", ErrFrame, what)
	}
	return nil
}

func appendStr(b []byte, s string) []byte {
	if len(s) > 0xffff {
		s = s[:0xffff]
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// Hello is the payload of HELLO.
type Hello struct {
	Version    uint16
	Credential []byte
}

// ParseHello decodes a HELLO payload.
func ParseHello(p []byte) (Hello, error) {
	d := dec{p: p}
	h := Hello{Version: d.u16()}
	h.Credential = d.take(int(d.u16()))
	if err := d.err("hello"); err != nil {
		return h, err
	}
	if len(d.p) != 0 {
		return h, fmt.Errorf("%w: trailing bytes in hello", ErrFrame)
	}
	return h, nil
}

// Info describes a target: the READY payload.
type Info struct {
	Version    uint16
	MemSize    uint64
	MaxPayload uint32
	Role       string
	Entries    []string
}

func appendInfo(b []byte, i Info) []byte {
	b = binary.LittleEndian.AppendUint16(b, i.Version)
	b = binary.LittleEndian.AppendUint64(b, i.MemSize)
	b = binary.LittleEndian.AppendUint32(b, i.MaxPayload)
	b = appendStr(b, i.Role)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(i.Entries)))
	for _, e := range i.Entries {
		b = appendStr(b, e)
	}
	return b
}

// ParseInfo decodes a READY payload.
func ParseInfo(p []byte) (Info, error) {
	d := dec{p: p}
	i := Info{Version: d.u16(), MemSize: d.u64(), MaxPayload: d.u32(), Role: d.str()}
	n := int(d.u16())
	for k := 0; k < n && !d.bad; k++ {
		i.Entries = append(i.Entries, d.str())
	}
	return i, d.err("ready")
}

// Start is the payload of START.
type Start struct {
	In      uint64
	InLen   uint32
	Out     uint64
	OutCap  uint32
	Entry   string
	Payload []byte // inline input (FlagInline)
}

// AppendStart appends the START payload for s.
func AppendStart(b []byte, s Start) []byte {
	b = binary.LittleEndian.AppendUint64(b, s.In)
	b = binary.LittleEndian.AppendUint32(b, s.InLen)
	b = binary.LittleEndian.AppendUint64(b, s.Out)
	b = binary.LittleEndian.AppendUint32(b, s.OutCap)
	b = appendStr(b, s.Entry)
	return append(b, s.Payload...)
}

// ParseStart decodes a START payload.
func ParseStart(p []byte, flags uint8) (Start, error) {
	d := dec{p: p}
	s := Start{In: d.u64(), InLen: d.u32(), Out: d.u64(), OutCap: d.u32(), Entry: d.str()}
	if err := d.err("start"); err != nil {
		return s, err
	}
	if s.Entry == "" {
		return s, fmt.Errorf("%w: start names no entry", ErrFrame)
	}
	if flags&FlagInline != 0 {
		s.Payload = d.p
	} else if len(d.p) != 0 {
		return s, fmt.Errorf("%w: trailing bytes in a non-inline start", ErrFrame)
	}
	return s, nil
}

// AppendCancel appends the CANCEL payload naming task tag.
func AppendCancel(b []byte, tag uint32) []byte { return binary.LittleEndian.AppendUint32(b, tag) }

// ParseCancel decodes a CANCEL payload: the tag of the task to stop.
func ParseCancel(p []byte) (uint32, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("%w: cancel payload is 4 bytes, got %d", ErrFrame, len(p))
	}
	return binary.LittleEndian.Uint32(p), nil
}

// MaxBatchItems bounds the items of one batch envelope.
const MaxBatchItems = 1 << 20

// EncodeBatch packs items as u32 count, count × u32 length, then the bytes.
func EncodeBatch(items [][]byte) []byte {
	n := 4 + 4*len(items)
	for _, it := range items {
		n += len(it)
	}
	b := make([]byte, 0, n)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(items)))
	for _, it := range items {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(it)))
	}
	for _, it := range items {
		b = append(b, it...)
	}
	return b
}

// DecodeBatch unpacks an envelope; the items alias p.
func DecodeBatch(p []byte) ([][]byte, error) {
	d := dec{p: p}
	n := d.u32()
	if d.bad || n > MaxBatchItems || uint64(n)*4 > uint64(len(d.p)) {
		return nil, fmt.Errorf("%w: batch header", ErrFrame)
	}
	lens := d.take(int(4 * n))
	items := make([][]byte, n)
	for i := range items {
		items[i] = d.take(int(binary.LittleEndian.Uint32(lens[4*i:])))
	}
	if d.bad {
		return nil, fmt.Errorf("%w: batch items overrun the envelope", ErrFrame)
	}
	if len(d.p) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after the batch", ErrFrame, len(d.p))
	}
	return items, nil
}
