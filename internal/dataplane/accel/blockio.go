package accel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
)

// Block data-mover ops ("devices reading devices", after the Device
// Lending paper: Markussen et al., "Flexible device compositions and
// dynamic resource sharing in PCIe interconnected clusters using Device
// Lending"): the target fills its memory from a range of a block lease, or
// stores a range of its memory to one, talking to the block lenders itself,
// so that the bytes never pass through the borrower.
const (
	OpLoad  Op = 0x07 // u64 addr, u32 len, block range: fill [addr, addr+len) from the range
	OpStore Op = 0x08 // u64 addr, u32 len, block range: write [addr, addr+len) to the range
)

// MaxBlockParts bounds the parts of a LOAD's or STORE's block range.
const MaxBlockParts = 64

// ErrBlockIO is a LOAD or STORE that failed on the block lease's side: a
// part refused the credential or could not be reached, the range lies
// outside the lease's volume, a read or write failed.
var ErrBlockIO = errors.New("accel: block lease I/O failed")

// ErrUnsupported is an op the target does not implement (a gateway has no
// memory to LOAD into).
var ErrUnsupported = errors.New("accel: not supported by this target")

// BlockRange names where bytes of a block lease are: the lease's parts, in
// layout order, as the nbd:// URIs the control plane gave the borrower
// (each carries its export name, the part's credential: a secret), the
// stripe unit of a composed lease, and the first byte of the range in the
// lease's volume. The length travels beside it (BlockIO.Len).
//
// Holding a BlockRange is holding the lease's credentials: log Redacted
// (or the BlockRange itself through log/slog), never the parts.
type BlockRange struct {
	Parts      []string
	StripeUnit uint32 // bytes per stripe of a composed lease; ignored for one part
	Offset     uint64
}

// Redacted describes the range without its credentials: "@OFFSET on K
// part(s) (HOST:PORT, …)".
func (r BlockRange) Redacted() string {
	hosts := make([]string, len(r.Parts))
	for i, p := range r.Parts {
		hosts[i] = partHost(p)
	}
	return fmt.Sprintf("@%d on %d part(s) (%s)", r.Offset, len(r.Parts), strings.Join(hosts, ", "))
}

// String is Redacted: a BlockRange printed by accident shows no secret.
func (r BlockRange) String() string { return r.Redacted() }

// GoString is Redacted too (%#v).
func (r BlockRange) GoString() string { return r.Redacted() }

// LogValue logs the range redacted.
func (r BlockRange) LogValue() slog.Value { return slog.StringValue(r.Redacted()) }

// partHost is the address of a part URI, or "?" when it does not parse.
func partHost(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return "?"
	}
	return u.Host
}

// BlockIO is the payload of LOAD and STORE: Len bytes of target memory at
// Addr, and where they come from or go to.
type BlockIO struct {
	Addr  uint64
	Len   uint32
	Range BlockRange
}

// AppendBlockIO appends the LOAD/STORE payload for b: u64 addr, u32 len,
// u64 offset, u32 stripe_unit, u16 k, k × str part URI.
func AppendBlockIO(p []byte, b BlockIO) ([]byte, error) {
	if len(b.Range.Parts) == 0 || len(b.Range.Parts) > MaxBlockParts {
		return nil, fmt.Errorf("%w: %d block parts, want 1..%d", ErrFrame, len(b.Range.Parts), MaxBlockParts)
	}
	p = binary.LittleEndian.AppendUint64(p, b.Addr)
	p = binary.LittleEndian.AppendUint32(p, b.Len)
	p = binary.LittleEndian.AppendUint64(p, b.Range.Offset)
	p = binary.LittleEndian.AppendUint32(p, b.Range.StripeUnit)
	p = binary.LittleEndian.AppendUint16(p, uint16(len(b.Range.Parts)))
	for i, u := range b.Range.Parts {
		if len(u) == 0 || len(u) > 0xffff {
			return nil, fmt.Errorf("%w: block part %d: URI of %d bytes", ErrFrame, i, len(u))
		}
		p = appendStr(p, u)
	}
	return p, nil
}

// ParseBlockIO decodes a LOAD or STORE payload. Errors never quote a part
// URI (they carry credentials).
func ParseBlockIO(p []byte) (BlockIO, error) {
	d := dec{p: p}
	b := BlockIO{Addr: d.u64(), Len: d.u32()}
	b.Range.Offset = d.u64()
	b.Range.StripeUnit = d.u32()
	k := int(d.u16())
	if err := d.err("block i/o"); err != nil {
		return BlockIO{}, err
	}
	if k == 0 || k > MaxBlockParts {
		return BlockIO{}, fmt.Errorf("%w: %d block parts, want 1..%d", ErrFrame, k, MaxBlockParts)
	}
	b.Range.Parts = make([]string, 0, k)
	for i := 0; i < k; i++ {
		u := d.str()
		if d.bad {
			return BlockIO{}, fmt.Errorf("%w: short block i/o payload (part %d)", ErrFrame, i)
		}
		if u == "" {
			return BlockIO{}, fmt.Errorf("%w: block part %d has an empty URI", ErrFrame, i)
		}
		b.Range.Parts = append(b.Range.Parts, u)
	}
	if len(d.p) != 0 {
		return BlockIO{}, fmt.Errorf("%w: %d trailing bytes in block i/o", ErrFrame, len(d.p))
	}
	return b, nil
}

// BlockMover is an optional interface of a Target whose memory the block
// data mover can fill from, and store to, block leases (LOAD, STORE). The
// range's parts carry the block lease's credentials: an implementation uses
// them for this one call, never keeps or logs them, and touches nothing of
// the lease outside [r.Offset, r.Offset+n). Errors on the block side wrap
// ErrBlockIO; memory outside the target's, ErrOutOfRange.
type BlockMover interface {
	LoadBlock(ctx context.Context, addr uint64, n uint32, r BlockRange) error
	StoreBlock(ctx context.Context, addr uint64, n uint32, r BlockRange) error
}

// handleBlock serves LOAD and STORE. It runs in the connection's read loop,
// so that a START sent after a LOAD sees the loaded bytes (frames of a
// connection are handled in order).
func (c *conn) handleBlock(ctx context.Context, f Frame) {
	bm, ok := c.s.Target.(BlockMover)
	if !ok {
		c.send(errFrame(f.Tag, fmt.Errorf("%w: LOAD and STORE need slot memory (use a dedicated lease's slot, not a gateway)", ErrUnsupported)))
		return
	}
	b, err := ParseBlockIO(f.Payload)
	if err != nil {
		c.send(errFrame(f.Tag, err))
		return
	}
	if f.Op == OpLoad {
		err = bm.LoadBlock(ctx, b.Addr, b.Len, b.Range)
	} else {
		err = bm.StoreBlock(ctx, b.Addr, b.Len, b.Range)
	}
	if err != nil {
		c.send(errFrame(f.Tag, err))
		return
	}
	c.send(AppendFrame(nil, Frame{Op: OpOK, Tag: f.Tag}))
}

// Load fills n bytes of the target's memory at addr from block range r:
// the target reads the range from the block lenders itself.
func (c *Conn) Load(ctx context.Context, addr uint64, n uint32, r BlockRange) error {
	p, err := AppendBlockIO(nil, BlockIO{Addr: addr, Len: n, Range: r})
	if err != nil {
		return err
	}
	_, err = c.roundTrip(ctx, OpLoad, 0, p, OpOK)
	return err
}

// Store writes n bytes of the target's memory at addr to block range r
// (and flushes them there).
func (c *Conn) Store(ctx context.Context, addr uint64, n uint32, r BlockRange) error {
	p, err := AppendBlockIO(nil, BlockIO{Addr: addr, Len: n, Range: r})
	if err != nil {
		return err
	}
	_, err = c.roundTrip(ctx, OpStore, 0, p, OpOK)
	return err
}

// BlockTask is a mailbox task whose input comes from a block lease and
// whose output goes to one (or back to the caller).
type BlockTask struct {
	Entry  string
	Input  BlockRange
	InLen  uint32
	Output *BlockRange // nil: the output is read back and returned
	// InAddr and OutAddr place the input and the output in slot memory;
	// a zero OutAddr means InAddr+InLen rounded up to 64 bytes. OutCap 0
	// means the rest of the slot's memory.
	InAddr, OutAddr uint64
	OutCap          uint32
	// Loaded, when set, is called once the LOAD has filled slot memory
	// (before the task's completion), for a caller timing the phases.
	Loaded func()
}

// RunBlockTask runs a BlockTask: LOAD and START travel together (one round
// trip), then, once DONE arrives, STORE (or READ) moves the output. It
// returns the output's length and, without t.Output, the output.
func (c *Conn) RunBlockTask(ctx context.Context, t BlockTask) (uint32, []byte, error) {
	out := t.OutAddr
	if out == 0 {
		out = (t.InAddr + uint64(t.InLen) + 63) &^ 63
	}
	mem := c.info.MemSize
	if t.InAddr > mem || uint64(t.InLen) > mem-t.InAddr || out >= mem {
		return 0, nil, fmt.Errorf("%w: input of %d bytes and its output do not fit the slot's %d bytes of memory", ErrOutOfRange, t.InLen, mem)
	}
	ocap := t.OutCap
	if ocap == 0 {
		ocap = uint32(min(mem-out, 1<<32-1))
	}
	lp, err := AppendBlockIO(nil, BlockIO{Addr: t.InAddr, Len: t.InLen, Range: t.Input})
	if err != nil {
		return 0, nil, err
	}
	ltag, lch, err := c.send(ctx, OpLoad, 0, lp)
	if err != nil {
		return 0, nil, err
	}
	sp := AppendStart(nil, Start{In: t.InAddr, InLen: t.InLen, Out: out, OutCap: ocap, Entry: t.Entry})
	stag, sch, err := c.send(ctx, OpStart, FlagNotify, sp)
	if err != nil {
		c.forget(ltag)
		return 0, nil, err
	}
	if _, err := c.wait(ctx, ltag, lch); err != nil {
		// The task runs anyway, on whatever the memory held: wait for it
		// so that its completion does not outlive the call, and report
		// the LOAD's error.
		_, _ = (&Task{c: c, id: stag, ch: sch}).Wait(ctx)
		return 0, nil, fmt.Errorf("load: %w", err)
	}
	if t.Loaded != nil {
		t.Loaded()
	}
	n, err := (&Task{c: c, id: stag, ch: sch}).Wait(ctx)
	if err != nil {
		return 0, nil, err
	}
	if t.Output != nil {
		if err := c.Store(ctx, out, n, *t.Output); err != nil {
			return 0, nil, fmt.Errorf("store: %w", err)
		}
		return n, nil, nil
	}
	b, err := c.ReadMem(ctx, out, n)
	return n, b, err
}
