package stripe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// Device is one part of a striped volume. An *nbd.Client satisfies it.
// Implementations must accept concurrent calls. If a Device is also an
// io.Closer, Close must make calls in progress return (with an error).
type Device interface {
	io.ReaderAt
	io.WriterAt
	Flush() error
	Size() int64
}

// Trimmer is implemented by devices that can discard a range.
type Trimmer interface {
	Trim(off, length int64) error
}

// Zeroer is implemented by devices that can write zeroes to a range without
// a data transfer; noHole asks that the range stay allocated. (The same
// method as nbd.Zeroer.)
type Zeroer interface {
	WriteZeroes(off, length int64, noHole bool) error
}

// TrimReporter is implemented by devices whose Trim method exists but may be
// unsupported (a pool, a volume, a client whose server lacks the feature).
type TrimReporter interface {
	CanTrim() bool
}

// ZeroReporter is the WriteZeroes analogue of TrimReporter.
type ZeroReporter interface {
	CanWriteZeroes() bool
}

func canTrim(d Device) bool {
	if _, ok := d.(Trimmer); !ok {
		return false
	}
	r, ok := d.(TrimReporter)
	return !ok || r.CanTrim()
}

func canZero(d Device) bool {
	if _, ok := d.(Zeroer); !ok {
		return false
	}
	r, ok := d.(ZeroReporter)
	return !ok || r.CanWriteZeroes()
}

// Sentinel errors.
var (
	ErrConfig       = errors.New("stripe: bad configuration")
	ErrOutOfRange   = errors.New("stripe: request out of range")
	ErrTimeout      = errors.New("stripe: device request timed out")
	ErrDeviceFailed = errors.New("stripe: device failed")
	ErrUnsupported  = errors.New("stripe: operation not supported by every device")
	ErrClosed       = errors.New("stripe: volume closed")
	// ErrUnflushed is reported by Attachment.Close and Volume.Shutdown
	// when writes (trims, zeroings) that the devices had completed, among
	// them every one acknowledged to a client, are left that no flush
	// covered: their deadline passed first, or a device could not be
	// flushed. The error names each such device and how many requests it
	// completed since its last successful flush.
	ErrUnflushed = errors.New("stripe: writes completed at the devices that no flush covered")
)

// errPastDeadline fails a write (trim, zeroing) whose devices answered
// once Close or Shutdown had stopped waiting for it (settle's seal): its
// flush may not cover it, so it is not acknowledged.
var errPastDeadline = fmt.Errorf("%w: answered after closing stopped waiting for it; not acknowledged", ErrClosed)

// Stripe unit limits and defaults.
const (
	MinStripeUnit     = 4 << 10
	MaxStripeUnit     = 16 << 20
	DefaultStripeUnit = 128 << 10
	// DefaultRequestTimeout bounds each sub-request when Config leaves it 0.
	DefaultRequestTimeout = 30 * time.Second
)

// Config tunes a Volume. Zero fields take defaults.
type Config struct {
	// StripeUnit is the number of consecutive bytes placed on one device,
	// a power of two in [MinStripeUnit, MaxStripeUnit]; 0 means
	// DefaultStripeUnit.
	StripeUnit int64
	// RequestTimeout bounds every sub-request (and each device's Flush); 0
	// means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Logger receives device failures; nil discards.
	Logger *slog.Logger
}

type member struct {
	dev Device
	// selfTimed: dev bounds every request itself, within the volume's
	// timeout, failing a late one with nbd.ErrTimeout (see selfTimer), so
	// one needs no timer of its own per sub-request.
	selfTimed bool
	// startsReads: dev can send a read and hear its outcome later
	// (asyncReader; Volume.startRead).
	startsReads bool
	failed      atomic.Bool
	cause       atomic.Pointer[error] // why it failed; set before failed
	closeOnce   sync.Once
	// Writes (trims, zeroings) completed on the device, and how many of
	// them a successful flush covered: a flush skips a device that has
	// nothing new to make durable.
	wseq, fseq atomic.Uint64
	// Writes (trims, zeroings, pieces of them) sent to the device and not
	// answered yet (Volume.UnansweredWrites).
	unanswered atomic.Int64
	// Final flushes (settle's, of Shutdown or an Attachment's Close) sent
	// to the device and not answered yet (Volume.UnansweredFinalFlush).
	finalFlush atomic.Int64
}

func (m *member) err(i int) error {
	if c := m.cause.Load(); c != nil {
		return fmt.Errorf("%w: device %d: %w", ErrDeviceFailed, i, *c)
	}
	return fmt.Errorf("%w: device %d", ErrDeviceFailed, i)
}

// Volume is a RAID0 composition of devices. It implements the method set of
// nbd.Backend (ReadAt, WriteAt, Size, Flush) plus Trim and WriteZeroes.
type Volume struct {
	parts   []*member
	unit    int64
	shift   uint // log2(unit)
	perDev  int64
	size    int64
	timeout time.Duration
	log     *slog.Logger
	canTrim bool
	canZero bool
	canExt  bool
	closed  atomic.Bool
	// Losses of writes (ErrLostWrites) that a FUA request's flush found
	// (flushFUA), which a Flush reports too: the latest, how many were
	// found and how many a Flush has reported. A Flush reports those
	// found before it ended that no Flush had reported when it began
	// (Linux's errseq, as nbdPart.lostGen), so that every Flush under
	// way when one is found hears of it, and the next to begin does.
	lostFUA                 atomic.Pointer[error]
	lostFUAGen, lostFUASeen atomic.Uint64
	// Writes (trims, zeroings) under way not yet acknowledged (the
	// write-back cache's early writes are not counted: it waits for
	// them itself), and whether settle has begun: from then on a new
	// one is refused (ErrClosed), and settle waits for those under way
	// before it decides whether to flush (see beginWrite), so that none
	// is answered uncovered by its flush, until its deadline seals
	// writing (sealedBit): a write that ends after that fails
	// (errPastDeadline), so settle can stop waiting for it.
	writing   atomic.Int64
	closing   atomic.Bool
	drainMu   sync.Mutex
	drainCond sync.Cond // broadcast when writing falls to 0 while closing, and when it is sealed
	// Set by the seal (under drainMu): the writes under way it failed,
	// and why it came (the deadline, or the caller's ctx).
	sealedWrites int64
	sealCause    error

	// For tests: called when settle begins to wait for the writes under
	// way, and once it has decided whether to flush (and flushed).
	draining, settled func()
}

// The bit of Volume.writing that seals it; the count is below.
const (
	sealedBit    = int64(1) << 62
	writingCount = sealedBit - 1
)

// New builds a volume over devs, in order. The order is part of the layout:
// the same devices must be given in the same order to read the data back.
func New(devs []Device, cfg Config) (*Volume, error) {
	if len(devs) == 0 {
		return nil, fmt.Errorf("%w: no devices", ErrConfig)
	}
	unit := cfg.StripeUnit
	if unit == 0 {
		unit = DefaultStripeUnit
	}
	if unit < MinStripeUnit || unit > MaxStripeUnit || unit&(unit-1) != 0 {
		return nil, fmt.Errorf("%w: stripe unit %d is not a power of two in [%d, %d]", ErrConfig, unit, MinStripeUnit, MaxStripeUnit)
	}
	v := &Volume{unit: unit, timeout: cfg.RequestTimeout, log: cfg.Logger, canTrim: true, canZero: true, canExt: true}
	v.drainCond.L = &v.drainMu
	for 1<<v.shift != unit {
		v.shift++
	}
	if v.timeout <= 0 {
		v.timeout = DefaultRequestTimeout
	}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	v.perDev = -1
	for i, d := range devs {
		if d == nil {
			return nil, fmt.Errorf("%w: device %d is nil", ErrConfig, i)
		}
		s := d.Size()
		if s < 0 {
			return nil, fmt.Errorf("%w: device %d has a negative size (%d)", ErrConfig, i, s)
		}
		if v.perDev < 0 || s < v.perDev {
			v.perDev = s
		}
		if !canTrim(d) {
			v.canTrim = false
		}
		if !canZero(d) {
			v.canZero = false
		}
		if !canExtents(d) {
			v.canExt = false
		}
		v.parts = append(v.parts, &member{dev: d, selfTimed: timedWithin(d, v.timeout), startsReads: canStartRead(d)})
	}
	v.perDev = v.perDev / unit * unit
	if v.perDev == 0 {
		return nil, fmt.Errorf("%w: smallest device is smaller than one stripe unit (%d bytes)", ErrConfig, unit)
	}
	if v.perDev > math.MaxInt64/int64(len(devs)) {
		return nil, fmt.Errorf("%w: %d devices of %d bytes make a volume larger than 2^63-1 bytes", ErrConfig, len(devs), v.perDev)
	}
	v.size = v.perDev * int64(len(devs))
	return v, nil
}

// Size is the volume size in bytes: N × min(device size), each rounded down
// to a multiple of the stripe unit.
func (v *Volume) Size() int64 { return v.size }

// StripeUnit is the stripe unit in bytes.
func (v *Volume) StripeUnit() int64 { return v.unit }

// Devices is the number of parts.
func (v *Volume) Devices() int { return len(v.parts) }

// CanTrim reports whether every device supports Trim.
func (v *Volume) CanTrim() bool { return v.canTrim }

// CanWriteZeroes reports whether every device supports WriteZeroes (without
// it, Volume.WriteZeroes writes zero buffers).
func (v *Volume) CanWriteZeroes() bool { return v.canZero }

// Failed returns the indexes of devices marked failed.
func (v *Volume) Failed() []int {
	var f []int
	for i, m := range v.parts {
		if m.failed.Load() {
			f = append(f, i)
		}
	}
	return f
}

// chunk is one sub-request: len bytes at device offset devOff of device dev,
// at volume offset volOff.
type chunk struct {
	dev    int
	devOff int64
	volOff int64
	len    int64
	buf    []byte // the bytes to read or write, where the operation has them
}

// single returns the one sub-request of [off, off+n) when the range lies
// within one stripe unit (its buf is for the caller to set; volOff and
// len are set). n > 0.
func (v *Volume) single(off, n int64) (chunk, bool) {
	if off>>v.shift != (off+n-1)>>v.shift {
		return chunk{}, false
	}
	d, doff := v.locate(off)
	return chunk{dev: d, devOff: doff, volOff: off, len: n}, true
}

// live returns the error of device i if it has failed, and ErrClosed once
// the volume is closed (what do checks before it starts).
func (v *Volume) live(i int) error {
	if v.closed.Load() {
		return ErrClosed
	}
	if m := v.parts[i]; m.failed.Load() {
		return m.err(i)
	}
	return nil
}

// readChunk reads c.buf from its device.
func readChunk(d Device, c chunk) error {
	k, err := d.ReadAt(c.buf, c.devOff)
	if k == len(c.buf) {
		return nil // io.ReaderAt may return io.EOF with a full read at the end
	}
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// writeChunk writes c.buf to its device.
func writeChunk(d Device, c chunk) error {
	k, err := d.WriteAt(c.buf, c.devOff)
	if err == nil && k != len(c.buf) {
		err = io.ErrShortWrite
	}
	return err
}

// locate maps a volume offset to (device, device offset).
func (v *Volume) locate(off int64) (int, int64) {
	u := off >> v.shift
	n := int64(len(v.parts))
	return int(u % n), (u/n)<<v.shift + off&(v.unit-1)
}

// split cuts [off, off+length) at stripe-unit boundaries, merging pieces that
// are contiguous on the same device (only possible with one device).
func (v *Volume) split(off, length int64) []chunk {
	var cs []chunk
	for length > 0 {
		d, doff := v.locate(off)
		n := min(length, v.unit-off&(v.unit-1))
		if k := len(cs) - 1; k >= 0 && cs[k].dev == d && cs[k].devOff+cs[k].len == doff {
			cs[k].len += n
		} else {
			cs = append(cs, chunk{dev: d, devOff: doff, volOff: off, len: n})
		}
		off += n
		length -= n
	}
	return cs
}

// ReadAt reads len(p) bytes at off. A read that extends past the end reads
// what there is and returns io.EOF.
func (v *Volume) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: negative offset %d", ErrOutOfRange, off)
	}
	if off >= v.size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := min(int64(len(p)), v.size-off)
	var err error
	if c, ok := v.single(off, n); ok {
		// Within one stripe unit (most small requests): no sub-request
		// list, no closure or goroutine, nothing allocated here.
		c.buf = p[:n]
		if err = v.live(c.dev); err == nil {
			err = v.one(c, readChunk)
		}
	} else {
		err = v.do(v.split(off, n), func(d Device, c chunk) error {
			return readChunk(d, chunk{dev: c.dev, devOff: c.devOff, buf: p[c.volOff-off : c.volOff-off+c.len]})
		})
	}
	if err != nil {
		// Which bytes arrived is unknown when sub-requests fail.
		return 0, err
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// beginWrite registers a write (trim, zeroing) under way, which endWrite
// ends once its devices have answered and it is counted (member.wseq);
// false, with nothing registered, once settle has begun (the write is
// refused). A write is counted before it looks at closing, settle sets
// closing before it looks at the count: one of them sees the other.
func (v *Volume) beginWrite() bool {
	v.writing.Add(1)
	if v.closing.Load() {
		v.endWrite(ErrClosed)
		return false
	}
	return true
}

// endWrite ends a write beginWrite registered, whose outcome is err (its
// devices' answers, counted in member.wseq if it succeeded), and returns
// the outcome to give its client: errPastDeadline instead of success if
// settle sealed writing before the write ended. A write is counted before
// it looks at the seal, settle seals before it looks at the counts (to
// flush, or to report what no flush covered): so every write acknowledged
// is in what settle sees.
func (v *Volume) endWrite(err error) error {
	s := v.writing.Add(-1)
	if s&sealedBit != 0 && err == nil {
		err = errPastDeadline
	}
	if s&writingCount == 0 && v.closing.Load() {
		v.drainMu.Lock()
		v.drainCond.Broadcast()
		v.drainMu.Unlock()
	}
	return err
}

// seal makes every write under way fail when it ends (endWrite), whatever
// its devices answer, and stops drainWrites waiting for them; the first
// seal records how many there were and cause.
func (v *Volume) seal(cause error) {
	v.drainMu.Lock()
	defer v.drainMu.Unlock()
	if old := v.writing.Or(sealedBit); old&sealedBit == 0 {
		v.sealedWrites, v.sealCause = old&writingCount, cause
	}
	v.drainCond.Broadcast()
}

// sealed returns what the first seal recorded (cause nil: none yet).
func (v *Volume) sealed() (writes int64, cause error) {
	v.drainMu.Lock()
	defer v.drainMu.Unlock()
	return v.sealedWrites, v.sealCause
}

// drainWrites waits until no write is under way (closing is set, so none
// begins), or writing is sealed. Writes end within their devices' bounds,
// or when the volume is closed (settle's timer).
func (v *Volume) drainWrites() {
	if v.draining != nil {
		v.draining()
	}
	v.drainMu.Lock()
	for s := v.writing.Load(); s&writingCount > 0 && s&sealedBit == 0; s = v.writing.Load() {
		v.drainCond.Wait()
	}
	v.drainMu.Unlock()
}

// WriteAt writes p at off; the whole range must be inside the volume.
func (v *Volume) WriteAt(p []byte, off int64) (int, error) {
	if err := v.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	if !v.beginWrite() {
		return 0, ErrClosed
	}
	var err error
	if c, ok := v.single(off, int64(len(p))); ok {
		c.buf = p
		if err = v.live(c.dev); err == nil {
			m := v.parts[c.dev]
			m.unanswered.Add(1)
			err = v.one(c, writeChunk)
			m.unanswered.Add(-1)
			if err == nil {
				m.wseq.Add(1)
			}
		}
	} else {
		err = v.doWrite(v.split(off, int64(len(p))), func(d Device, c chunk) error {
			return writeChunk(d, chunk{dev: c.dev, devOff: c.devOff, buf: p[c.volOff-off : c.volOff-off+c.len]})
		})
	}
	if err = v.endWrite(err); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush makes every write completed on the volume durable: it flushes, in
// parallel, every device with writes (trims, zeroings) completed since its
// last successful flush began; a failed device fails the flush, once the
// others are flushed. A database's commit writes a few KiB to one device and flushes:
// that is then one FLUSH, to that device, instead of one per device.
// A loss of writes that a FUA request's flush found (flushFUA) is
// reported again, as lostFUAGen says.
func (v *Volume) Flush() error { return v.flushSince(v.flushMark()) }

// flushMark is what flushSince needs of a flush that begins now: the
// losses FUA requests' flushes found that a Flush has reported.
func (v *Volume) flushMark() uint64 { return v.lostFUASeen.Load() }

// flushSince is Flush for a flush that began when flushMark returned mark
// (a FLUSH that first waited for the write-back cache's writes began
// before it waited).
func (v *Volume) flushSince(mark uint64) error {
	err := v.flush()
	if lost := v.lostFUASince(mark); lost != nil {
		// Its reports that the flush took too are given once.
		return joinReports(err, lost)
	}
	return err
}

// lostFUASince returns the latest loss a FUA request's flush found if one
// was found that no Flush had reported at mark (flushMark), and records
// it reported; nil otherwise.
func (v *Volume) lostFUASince(mark uint64) error {
	gen := v.lostFUAGen.Load()
	if gen <= mark {
		return nil
	}
	for {
		s := v.lostFUASeen.Load()
		if s >= gen || v.lostFUASeen.CompareAndSwap(s, gen) {
			break
		}
	}
	return *v.lostFUA.Load()
}

// flushFUA is the flush of a FUA request: as Flush, but a loss of writes
// it finds (ErrLostWrites: a part's lender restarted before a flush
// covered them) is also left to the Flushes under way and the next one
// (lostFUAGen), which answer for the writes before them, whereas the FUA
// request answers for itself.
func (v *Volume) flushFUA() error {
	err := v.flush()
	if errors.Is(err, ErrLostWrites) {
		v.lostFUA.Store(&err) // before the count: lostFUASince loads it after
		v.lostFUAGen.Add(1)
	}
	return err
}

// unflushed reports whether a device has writes (trims, zeroings) that no
// successful flush covered.
func (v *Volume) unflushed() bool {
	for _, m := range v.parts {
		if m.wseq.Load() != m.fseq.Load() {
			return true
		}
	}
	return false
}

// flush is Flush without the loss a FUA request's flush found. A failed
// part fails it, but only once every other part with writes no flush
// covered has been flushed: their acknowledged writes become durable
// whatever happened to the failed part. A part's flush covers its writes
// when it succeeded, reports of losses (ErrLostWrites) aside: what the
// part holds now is durable, and the loss is the report.
func (v *Volume) flush() error {
	// Most flushes (a database's commit) have one device to flush: that
	// one is flushed without the slices and closures of the general
	// case, which allocated on every flush.
	only, n, failed := -1, 0, false
	var seq uint64
	for i, m := range v.parts {
		if m.failed.Load() {
			failed = true
			continue
		}
		if s := m.wseq.Load(); s != m.fseq.Load() {
			only, seq, n = i, s, n+1
		}
	}
	if v.closed.Load() {
		return ErrClosed
	}
	switch {
	case n == 0 && !failed:
		return nil
	case n == 1 && !failed:
		m := v.parts[only]
		err := v.one(chunk{dev: only}, flushChunk)
		if err == nil || onlyReports(err) {
			m.flushedUpTo(seq)
		}
		return err
	}
	var cs []chunk
	seqs := make([]uint64, len(v.parts))
	errs := []error{nil}
	for i, m := range v.parts {
		seqs[i] = m.wseq.Load()
		switch {
		case m.failed.Load():
			// It fails the flush, after the others were flushed.
			errs = append(errs, m.err(i))
		case seqs[i] != m.fseq.Load():
			cs = append(cs, chunk{dev: i})
		}
	}
	flushed := func(dev int) { v.parts[dev].flushedUpTo(seqs[dev]) }
	var err error
	switch {
	case len(cs) == 0:
	case len(cs) > 1 && v.pipelined(cs):
		err = v.flushPipelined(cs, flushed)
	default:
		err = v.do(cs, func(d Device, c chunk) error {
			err := d.Flush()
			if err == nil || onlyReports(err) {
				flushed(c.dev)
			}
			return err
		})
	}
	errs[0] = err
	return errors.Join(errs...)
}

// flushChunk flushes d (Flush's operation for one device).
func flushChunk(d Device, _ chunk) error { return d.Flush() }

// flushedUpTo records that a flush covered the device's first seq writes.
func (m *member) flushedUpTo(seq uint64) {
	for {
		f := m.fseq.Load()
		if f >= seq || m.fseq.CompareAndSwap(f, seq) {
			return
		}
	}
}

// flushStarter is implemented by devices that can send a flush and await
// it later (nbdPart, Pool): startFlush sends it and returns what awaits
// its outcome (once), which is what Flush would have returned.
type flushStarter interface {
	startFlush() func() error
}

// pipelined reports whether every device of cs can start a flush and
// bounds its requests itself (so that awaiting them in turn needs no timer).
func (v *Volume) pipelined(cs []chunk) bool {
	for _, c := range cs {
		m := v.parts[c.dev]
		if _, ok := m.dev.(flushStarter); !ok || !m.selfTimed {
			return false
		}
	}
	return true
}

// flushPipelined flushes the devices of cs from this goroutine: it sends
// every flush and then awaits them in turn. A composed lease's FLUSH at
// queue depth 1 then costs the slowest part's round trip with no goroutine
// started or woken: the caller (the local export's reader) reads each
// part's reply itself. A part that has failed is not sent a flush (its
// error is the outcome); the others are. It returns every part's error.
func (v *Volume) flushPipelined(cs []chunk, flushed func(dev int)) error {
	if v.closed.Load() {
		return ErrClosed
	}
	var errs []error
	live := cs[:0:0]
	for _, c := range cs {
		if m := v.parts[c.dev]; m.failed.Load() {
			errs = append(errs, m.err(c.dev))
		} else {
			live = append(live, c)
		}
	}
	cs = live
	waits := make([]func() error, len(cs))
	for i, c := range cs {
		waits[i] = v.parts[c.dev].dev.(flushStarter).startFlush()
	}
	for i, c := range cs {
		err := v.outcome(c.dev, waits[i]())
		if err == nil || onlyReports(err) {
			flushed(c.dev)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Trim discards [off, off+length) on every device it spans. It returns an
// error wrapping ErrUnsupported unless CanTrim.
func (v *Volume) Trim(off, length int64) error {
	if !v.canTrim {
		return ErrUnsupported
	}
	if err := v.check(off, length); err != nil {
		return err
	}
	if !v.beginWrite() {
		return ErrClosed
	}
	return v.endWrite(v.doWrite(v.perDevice(off, length), func(d Device, c chunk) error {
		return d.(Trimmer).Trim(c.devOff, c.len)
	}))
}

// WriteZeroes zeroes [off, off+length): with one WriteZeroes per device if
// CanWriteZeroes, else by writing zero buffers.
func (v *Volume) WriteZeroes(off, length int64, noHole bool) error {
	if err := v.check(off, length); err != nil {
		return err
	}
	if !v.beginWrite() {
		return ErrClosed
	}
	return v.endWrite(v.writeZeroes(off, length, noHole))
}

// writeZeroes is WriteZeroes for a write beginWrite registered.
func (v *Volume) writeZeroes(off, length int64, noHole bool) error {
	if !v.canZero {
		return v.doWrite(v.split(off, length), func(d Device, c chunk) error {
			z := make([]byte, min(c.len, 1<<20))
			for done := int64(0); done < c.len; {
				k := min(c.len-done, int64(len(z)))
				if _, err := d.WriteAt(z[:k], c.devOff+done); err != nil {
					return err
				}
				done += k
			}
			return nil
		})
	}
	return v.doWrite(v.perDevice(off, length), func(d Device, c chunk) error {
		return d.(Zeroer).WriteZeroes(c.devOff, c.len, noHole)
	})
}

// perDevice maps [off, off+length) to one contiguous range per device: the
// units of one device that a contiguous volume range covers are consecutive
// on that device.
func (v *Volume) perDevice(off, length int64) []chunk {
	byDev := make([]chunk, len(v.parts))
	for i := range byDev {
		byDev[i] = chunk{dev: i, devOff: -1}
	}
	// Only the first N pieces start a device's range; the last N end it.
	for _, c := range v.split(off, length) {
		b := &byDev[c.dev]
		if b.devOff < 0 {
			b.devOff = c.devOff
		}
		b.len = c.devOff + c.len - b.devOff
	}
	var cs []chunk
	for _, b := range byDev {
		if b.devOff >= 0 {
			cs = append(cs, b)
		}
	}
	return cs
}

func (v *Volume) check(off, length int64) error {
	if off < 0 || length < 0 || off > v.size || length > v.size-off {
		return fmt.Errorf("%w: [%d, +%d) outside a %d-byte volume", ErrOutOfRange, off, length, v.size)
	}
	return nil
}

// do runs op for every chunk in parallel, each under the request deadline,
// and returns the first error.
func (v *Volume) do(cs []chunk, op func(Device, chunk) error) error {
	if v.closed.Load() {
		return ErrClosed
	}
	for _, c := range cs {
		if m := v.parts[c.dev]; m.failed.Load() {
			return m.err(c.dev)
		}
	}
	switch len(cs) {
	case 0:
		return nil
	case 1:
		return v.one(cs[0], op)
	}
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i := 1; i < len(cs); i++ {
		wg.Go(func() { errs[i] = v.one(cs[i], op) })
	}
	errs[0] = v.one(cs[0], op)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// doWrite is do for an operation that changes the devices: each chunk done
// counts as a write its device's next flush must cover.
func (v *Volume) doWrite(cs []chunk, op func(Device, chunk) error) error {
	return v.do(cs, func(d Device, c chunk) error {
		m := v.parts[c.dev]
		m.unanswered.Add(1)
		err := op(d, c)
		m.unanswered.Add(-1)
		if err == nil {
			m.wseq.Add(1)
		}
		return err
	})
}

// UnansweredWrites returns, per device in layout order, how many writes
// (trims, zeroings, and the pieces of those that span devices) were sent
// to it that it has not answered yet, the write-back cache's included:
// what Shutdown or Close waits for while a lender does not answer.
func (v *Volume) UnansweredWrites() []int64 {
	n := make([]int64, len(v.parts))
	for i, m := range v.parts {
		n[i] = m.unanswered.Load()
	}
	return n
}

// UnansweredFinalFlush returns, per device in layout order, whether the
// final flush (the one Shutdown, or an Attachment's Close, sends
// once every write was answered) was sent to it and not answered yet:
// what the close waits for once no write is unanswered.
func (v *Volume) UnansweredFinalFlush() []bool {
	f := make([]bool, len(v.parts))
	for i, m := range v.parts {
		f[i] = m.finalFlush.Load() > 0
	}
	return f
}

// selfTimer is implemented by devices that bound each request themselves
// (an NBD connection's request timeout, enforced by its watchdog) and fail
// one that misses the bound with an error wrapping nbd.ErrTimeout.
// requestTimeout returns the bound (0: none).
type selfTimer interface {
	requestTimeout() time.Duration
}

// timedWithin reports whether d bounds its requests itself within limit.
func timedWithin(d Device, limit time.Duration) bool {
	st, ok := d.(selfTimer)
	if !ok {
		return false
	}
	t := st.requestTimeout()
	return t > 0 && t <= limit
}

// one runs op on one chunk. If it misses the deadline the device is marked
// failed and closed, which makes op return. A device that times its
// requests itself (member.selfTimed) reports the miss with nbd.ErrTimeout;
// any other gets a timer per sub-request.
func (v *Volume) one(c chunk, op func(Device, chunk) error) error {
	m := v.parts[c.dev]
	if m.selfTimed {
		return v.outcome(c.dev, op(m.dev, c))
	}
	var timedOut atomic.Bool
	t := time.AfterFunc(v.timeout, func() {
		timedOut.Store(true)
		v.fail(c.dev, fmt.Errorf("%w after %v", ErrTimeout, v.timeout))
	})
	err := op(m.dev, c)
	t.Stop()
	if timedOut.Load() || (err != nil && m.failed.Load()) {
		return m.err(c.dev)
	}
	if err != nil {
		return fmt.Errorf("stripe: device %d: %w", c.dev, err)
	}
	return nil
}

// outcome is the error of an operation on device i, which bounds its
// requests itself (member.selfTimed), that returned err: a miss of the
// bound fails the device.
func (v *Volume) outcome(i int, err error) error {
	if err == nil {
		return nil
	}
	m := v.parts[i]
	if errors.Is(err, nbd.ErrTimeout) {
		v.fail(i, fmt.Errorf("%w after %v", ErrTimeout, v.timeout))
	}
	if m.failed.Load() {
		return m.err(i)
	}
	return fmt.Errorf("stripe: device %d: %w", i, err)
}

// fail marks device i failed and closes it once.
func (v *Volume) fail(i int, why error) {
	m := v.parts[i]
	m.cause.CompareAndSwap(nil, &why)
	if !m.failed.Swap(true) {
		v.log.Error("stripe: device failed", "device", i, "err", why)
	}
	m.closeOnce.Do(func() {
		if c, ok := m.dev.(io.Closer); ok {
			_ = c.Close()
		}
	})
}

// Shutdown ends the volume as Close does, once what was written is durable
// as qemu-nbd makes it on exit: it refuses new writes (trims, zeroings:
// ErrClosed), waits for those under way, flushes every device that has
// writes no flush covered (one that failed does not keep the others from
// being flushed), then closes the devices. Waiting and flushing take at
// most the request timeout: past it the devices are closed, which fails
// what their lenders have not answered (a write answered after that fails
// too), and the error wraps ErrTimeout. Devices with completed writes
// that no flush covered are named with ErrUnflushed. Shutdown
// reports what a FLUSH that began with it would (writes a lender's
// restart may have lost that no FLUSH reported: ErrLostWrites) and errors
// of closing. Other requests still in progress (reads) fail; stop issuing
// them first.
func (v *Volume) Shutdown() error {
	var once sync.Once
	var cerr error
	closeOnce := func() { once.Do(func() { cerr = v.Close() }) }
	err := v.settle(context.Background(), nil, closeOnce)
	closeOnce()
	return errors.Join(err, cerr)
}

// settle makes what was written durable before the volume closes: it
// refuses new writes (trims, zeroings), runs wait (if any: the write-back
// cache's wait for the writes it acknowledged), waits for the writes under
// way (which may be answered to their clients once counted: so none is
// left out of the flush), then flushes the devices that have writes no
// flush covered (flushEvery), and reports what a FLUSH that began with it
// would, and ErrUnflushed naming the devices whose completed writes no
// flush covered.
//
// Its deadline is one timer of the request timeout, whose expiry seals
// writing (a write under way fails when it ends, whatever its devices
// answer: none is acknowledged after the deadline) and then calls expire
// (which must close the volume, failing what the lenders have not
// answered); settle then reports ErrTimeout, and no flush runs: every
// write acknowledged is either covered by the flush or named with
// ErrUnflushed. When ctx
// ends first, settle seals writing and stops waiting for the writes under
// way, which were not acknowledged and now never will be (it reports how
// many, with ctx's error), but not for what was acknowledged: the
// write-back cache's writes and the flush keep the request timeout.
//
// The devices bound each request themselves, but not a write's whole
// course: a write whose connection broke waits for the redial
// (RedialTimeout, which may exceed the request timeout) and is then
// retried under a bound of its own.
func (v *Volume) settle(ctx context.Context, wait func() error, expire func()) error {
	mark := v.flushMark()
	v.closing.Store(true)
	var expired atomic.Bool
	cut := make(chan struct{}) // closed once the timer's function has run
	t := time.AfterFunc(v.timeout, func() {
		defer close(cut)
		expired.Store(true) // first: a drain the seal ends does not flush
		v.seal(ErrTimeout)
		expire()
	})
	defer t.Stop()
	stop := context.AfterFunc(ctx, func() { v.seal(context.Cause(ctx)) })
	defer stop()
	var err error
	if wait != nil {
		err = wait()
	}
	v.drainWrites()
	if !expired.Load() && v.unflushed() {
		err = errors.Join(err, v.flushEvery())
	}
	if !t.Stop() {
		<-cut
	}
	if v.settled != nil {
		v.settled()
	}
	err = joinReports(err, v.lostFUASince(mark))
	if n, cause := v.sealed(); n > 0 {
		what := fmt.Sprintf("writes (trims, zeroings) under way failed, unacknowledged: %d", n)
		if cause == ErrTimeout { // the expiry's error below says it
			err = errors.Join(err, errors.New(what))
		} else {
			err = errors.Join(err, fmt.Errorf("stripe: closing: %w: %s", cause, what))
		}
	}
	// After the flush, or the deadline's seal (cut): a write acknowledged
	// was counted before them, so is covered or in what this reads.
	if uerr := v.unflushedErr(); uerr != nil {
		err = errors.Join(err, uerr)
	}
	if !expired.Load() {
		return err
	}
	if err == nil {
		return fmt.Errorf("stripe: closing: the lenders did not answer within %v (%w)", v.timeout, ErrTimeout)
	}
	return fmt.Errorf("stripe: closing: the lenders did not answer within %v (%w): %w", v.timeout, ErrTimeout, err)
}

// flushEvery is settle's flush: as flush, it flushes in parallel every
// device with writes (trims, zeroings) no flush covered, but one that has
// failed, or whose flush fails, does not keep the others from being
// flushed (as in a FLUSH: Close makes durable what it can, and
// unflushedErr names the rest). A flush that succeeded but reported lost
// writes (ErrLostWrites alone) covered what the part now holds: the loss
// is its report. It returns the devices' errors.
func (v *Volume) flushEvery() error {
	if v.closed.Load() {
		return ErrClosed
	}
	errs := make([]error, len(v.parts))
	var wg sync.WaitGroup
	for i, m := range v.parts {
		seq := m.wseq.Load()
		switch {
		case seq == m.fseq.Load():
		case m.failed.Load():
			errs[i] = m.err(i)
		default:
			wg.Go(func() {
				m.finalFlush.Add(1)
				err := v.one(chunk{dev: i}, flushChunk)
				m.finalFlush.Add(-1)
				if err == nil || onlyReports(err) {
					m.flushedUpTo(seq)
				}
				errs[i] = err
			})
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// unflushedErr returns an error wrapping ErrUnflushed that names every
// device with writes (trims, zeroings) completed that no successful flush
// covered, and how many requests; nil if none has.
func (v *Volume) unflushedErr() error {
	var ds []string
	for i, m := range v.parts {
		// fseq first: it never passes a wseq read after it.
		f := m.fseq.Load()
		if w := m.wseq.Load(); w > f {
			ds = append(ds, fmt.Sprintf("device %d (%d requests since its last flush)", i, w-f))
		}
	}
	if ds == nil {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrUnflushed, strings.Join(ds, ", "))
}

// Close closes every device that is an io.Closer. Requests in progress
// fail; nothing is flushed (Shutdown flushes first).
func (v *Volume) Close() error {
	if v.closed.Swap(true) {
		return ErrClosed
	}
	var errs []error
	for i, m := range v.parts {
		m.closeOnce.Do(func() {
			if c, ok := m.dev.(io.Closer); ok {
				if err := c.Close(); err != nil {
					errs = append(errs, fmt.Errorf("stripe: close device %d: %w", i, err))
				}
			}
		})
	}
	return errors.Join(errs...)
}

// Extenter is implemented by devices that can say which ranges are holes
// (an *nbd.Client whose server offers base:allocation). The answer may
// cover fewer bytes than asked, but at least one, and never calls data a
// hole.
type Extenter interface {
	Extents(off, length int64) ([]nbd.Extent, error)
}

// ExtentReporter is implemented by devices whose Extents method exists but
// may only report "all data" (a pool, a client whose server lacks
// base:allocation).
type ExtentReporter interface {
	CanExtents() bool
}

func canExtents(d Device) bool {
	if _, ok := d.(Extenter); !ok {
		return false
	}
	r, ok := d.(ExtentReporter)
	return !ok || r.CanExtents()
}

// CanExtents reports whether every device can report holes.
func (v *Volume) CanExtents() bool { return v.canExt }

// maxExtentUnits bounds the stripe units one Extents call covers per
// device, so that the answer stays small and the per-device queries short.
const maxExtentUnits = 1024

// Extents reports which parts of [off, off+length) are holes, from one
// block-status query per device over the units the range covers (they are
// contiguous on each device). The answer may cover fewer bytes than asked,
// never fewer than one. Without CanExtents, everything is data.
func (v *Volume) Extents(off, length int64) ([]nbd.Extent, error) {
	if err := v.check(off, length); err != nil {
		return nil, err
	}
	if length == 0 {
		return nil, nil
	}
	// Bound the range: at most maxExtentUnits units per device.
	length = min(length, maxExtentUnits*int64(len(v.parts))*v.unit-off&(v.unit-1))
	if !v.canExt {
		return []nbd.Extent{{Length: length}}, nil
	}
	per := v.perDevice(off, length)
	got := make([][]nbd.Extent, len(v.parts))
	err := v.do(per, func(d Device, c chunk) error {
		ext, err := d.(Extenter).Extents(c.devOff, c.len)
		got[c.dev] = ext
		return err
	})
	if err != nil {
		return nil, err
	}
	// Walk the volume range unit piece by unit piece, consuming each
	// device's extents in order; stop where a device's answer ends.
	var out []nbd.Extent
	add := func(n int64, flags uint32) {
		if k := len(out) - 1; k >= 0 && out[k].Flags == flags {
			out[k].Length += n
			return
		}
		out = append(out, nbd.Extent{Length: n, Flags: flags})
	}
	for _, c := range v.split(off, length) {
		need := c.len
		for need > 0 {
			ext := got[c.dev]
			if len(ext) == 0 {
				return out, v.nonEmpty(out)
			}
			k := min(need, ext[0].Length)
			if k <= 0 {
				got[c.dev] = ext[1:]
				continue
			}
			add(k, ext[0].Flags)
			need -= k
			if ext[0].Length -= k; ext[0].Length == 0 {
				got[c.dev] = ext[1:]
			}
		}
	}
	return out, nil
}

func (v *Volume) nonEmpty(out []nbd.Extent) error {
	if len(out) == 0 {
		return fmt.Errorf("stripe: a device answered block status with no extent")
	}
	return nil
}
