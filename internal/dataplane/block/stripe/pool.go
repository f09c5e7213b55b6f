package stripe

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// Pool spreads one part over several connections to the same export: each
// call goes to the connection with the fewest calls in flight. A flush on
// the pool makes every completed write durable: with one flush when the
// server advertises multi-conn consistency, else with one per connection.
// Close closes every connection that is an io.Closer.
type Pool struct {
	conns    []Device
	inflight []atomic.Int64
	clean    atomic.Uint64 // the connections' reconnections when they last all flushed
}

// NewPool returns a pool over conns, which must all reach the same export.
func NewPool(conns ...Device) (*Pool, error) {
	if len(conns) == 0 {
		return nil, fmt.Errorf("%w: empty pool", ErrConfig)
	}
	for i, c := range conns[1:] {
		if c.Size() != conns[0].Size() {
			return nil, fmt.Errorf("%w: pool connection %d has size %d, connection 0 has %d", ErrConfig, i+1, c.Size(), conns[0].Size())
		}
	}
	return &Pool{conns: conns, inflight: make([]atomic.Int64, len(conns))}, nil
}

// Liveness is implemented by connections that know they are broken; a Pool
// avoids connections whose Alive reports false while any other is alive.
type Liveness interface {
	Alive() bool
}

func alive(d Device) bool {
	l, ok := d.(Liveness)
	return !ok || l.Alive()
}

func (p *Pool) pick() (Device, func()) {
	i := p.pickIndex()
	return p.conns[i], func() { p.inflight[i].Add(-1) }
}

// pickIndex chooses the least busy live connection and counts a call on
// it, which the caller uncounts with p.inflight[i].Add(-1).
func (p *Pool) pickIndex() int {
	best := -1
	for i, c := range p.conns {
		if !alive(c) {
			continue
		}
		if best < 0 || p.inflight[i].Load() < p.inflight[best].Load() {
			best = i
		}
	}
	if best < 0 {
		best = 0 // all broken: let the call report the error
	}
	p.inflight[best].Add(1)
	return best
}

// ReadAt reads from the least busy connection.
func (p *Pool) ReadAt(b []byte, off int64) (int, error) {
	i := p.pickIndex()
	defer p.inflight[i].Add(-1)
	return p.conns[i].ReadAt(b, off)
}

// WriteAt writes through the least busy connection.
func (p *Pool) WriteAt(b []byte, off int64) (int, error) {
	i := p.pickIndex()
	defer p.inflight[i].Add(-1)
	return p.conns[i].WriteAt(b, off)
}

// requestTimeout implements selfTimer when every connection does: the
// longest of their bounds.
func (p *Pool) requestTimeout() time.Duration {
	var longest time.Duration
	for _, c := range p.conns {
		st, ok := c.(selfTimer)
		if !ok {
			return 0
		}
		t := st.requestTimeout()
		if t <= 0 {
			return 0
		}
		longest = max(longest, t)
	}
	return longest
}

// Size is the export size.
func (p *Pool) Size() int64 { return p.conns[0].Size() }

// Alive reports whether any connection is alive.
func (p *Pool) Alive() bool {
	for _, c := range p.conns {
		if alive(c) {
			return true
		}
	}
	return false
}

// sharedFlusher is a connection whose server makes a flush on any
// connection cover the writes completed on all of them (NBD multi-conn),
// and which can be told that a flush sent elsewhere covered its writes.
type sharedFlusher interface {
	MultiConnSafe() bool
	// flushSnapshot returns the count of writes completed so far (what a
	// flush sent now covers), the connection's epoch (which changes when
	// it reconnects) and the export it reaches (which changes when its
	// part moves to another lender), or ok=false if the connection must
	// flush itself: it is dead, or it broke with writes it has to report
	// lost.
	flushSnapshot() (seq, epoch uint64, export nbd.URI, ok bool)
	// flushTicket numbers a flush that covers the connection's writes
	// answered before it is sent (on another connection); once it has
	// succeeded, with no connection reconnected meanwhile, the ticket's
	// succeeded records that (see nbdPart.lateWrite).
	flushTicket() flushTicket
	// flushedUpTo records that a flush covered the first seq writes.
	flushedUpTo(seq uint64)
}

// Flush makes every write completed on the pool durable. When every
// connection is alive and its server covers all connections' writes with a
// flush on any one (multi-conn, which FileBackend exports advertise), one
// flush on the least busy connection does it: a composed lease's FLUSH
// then costs one round trip per part instead of one per connection, in
// turn. Otherwise it flushes every live connection, in turn. Writes
// completed on a connection that has since broken are covered only if the
// server makes a flush on one connection cover all of them
// (NBD_FLAG_CAN_MULTI_CONN, which connections report with MultiConnSafe);
// otherwise, or if no connection is alive, Flush fails.
func (p *Pool) Flush() error {
	var (
		buf, mbuf [8]uint64
		tbuf      [8]flushTicket
	)
	marks := p.lostMarks(mbuf[:0])
	seqs, tickets, epoch, ok := p.sharedFlush(buf[:0], tbuf[:0])
	if !ok {
		return p.flushEach(marks, nil)
	}
	// As startFlush, without its closure (an allocation per flush).
	i := p.pickIndex()
	err := p.conns[i].Flush()
	p.inflight[i].Add(-1)
	return p.sharedFlushed(seqs, tickets, epoch, marks, err)
}

// lostMarks appends to buf what every connection that reports lost writes
// (lostReporter) has reported when a flush begins (0 for others).
func (p *Pool) lostMarks(buf []uint64) []uint64 {
	for _, c := range p.conns {
		var m uint64
		if l, ok := c.(lostReporter); ok {
			m = l.lostMark()
		}
		buf = append(buf, m)
	}
	return buf
}

// startFlush implements flushStarter: the one flush that serves every
// connection is sent at once and awaited by what it returns; flushes of
// every connection in turn are sent there.
func (p *Pool) startFlush() func() error {
	marks := p.lostMarks(make([]uint64, 0, len(p.conns)))
	seqs, tickets, epoch, ok := p.sharedFlush(nil, nil)
	if !ok {
		return func() error { return p.flushEach(marks, nil) }
	}
	i := p.pickIndex()
	var wait func() error
	if fs, ok := p.conns[i].(flushStarter); ok {
		wait = fs.startFlush()
	} else {
		wait = p.conns[i].Flush
	}
	return func() error {
		err := wait()
		p.inflight[i].Add(-1)
		return p.sharedFlushed(seqs, tickets, epoch, marks, err)
	}
}

// sharedFlushed ends a flush that one connection made for all (err its
// outcome; seqs, tickets and epoch as sharedFlush gave them before it was
// sent, marks as lostMarks gave them when the flush began).
// A connection that reconnected meanwhile may have reached a restarted
// lender, whose flush does not cover what the others wrote before: then
// every connection flushes (and reports) for itself.
func (p *Pool) sharedFlushed(seqs []uint64, tickets []flushTicket, epoch uint64, marks []uint64, err error) error {
	if err == nil && p.epochs() == epoch {
		for i, c := range p.conns {
			c.(sharedFlusher).flushedUpTo(seqs[i])
			tickets[i].succeeded()
		}
		return nil
	}
	if errors.Is(err, ErrLostWrites) {
		// The connection that flushed for all reconnected and reported
		// its lost writes (once): the others flush for themselves, and
		// the report is kept (and not given again by flushEach: the
		// same connection, flushing again, finds it since its mark).
		return errors.Join(err, p.flushEach(marks, reportsIn(err, nil)))
	}
	return p.flushEach(marks, nil)
}

// flushEach flushes every live connection in turn, for a flush that began
// when marks were taken (lostMarks): a connection's lost writes found
// since are reported, even if another flush has reported them meanwhile,
// unless this flush has already (known: those reports).
func (p *Pool) flushEach(marks []uint64, known []*lossReport) error {
	epoch := p.epochs()
	var errs []error
	live, lost, covered, reported := 0, false, false, false
	for _, c := range p.conns {
		if !alive(c) {
			lost = true
		}
	}
	for i, c := range p.conns {
		if !alive(c) {
			// It gave up redialling: a flush elsewhere does not cover
			// the writes it lost with a lender that restarted.
			if l, ok := c.(lostReporter); ok {
				if r := l.lostSince(marks[i]); r != nil {
					errs = append(errs, fmt.Errorf("connection %d: %w", i, r))
				}
			}
			continue
		}
		live++
		var err error
		if l, ok := c.(lostReporter); ok {
			err = l.flushSince(marks[i])
		} else {
			err = c.Flush()
		}
		if r, ok := err.(*lossReport); ok && slices.Contains(known, r) {
			reported = true // flushed; its loss is already in this flush's error
		} else if err != nil {
			errs = append(errs, fmt.Errorf("connection %d: %w", i, err))
		} else if multiConnSafe(c) {
			covered = true
		}
	}
	switch {
	case live == 0:
		errs = append(errs, fmt.Errorf("%w: no live connection", ErrDeviceFailed))
	case lost && !covered:
		errs = append(errs, fmt.Errorf("%w: a broken connection's writes cannot be flushed", ErrDeviceFailed))
	}
	if len(errs) == 0 && !reported {
		// Every connection flushed (and reported) for itself: from here
		// one flush serves them all again, until one reconnects.
		p.clean.Store(epoch)
	}
	return errors.Join(errs...)
}

// sharedFlush returns every connection's flush snapshot, a flush ticket
// of each (taken after its snapshot) and the pool's epoch (the sum of the
// connections' reconnections) if one flush can serve them all: every
// connection is alive with nothing to report, reaches the same export
// (while a part moves, some may still reach the old lender), its server
// advertises multi-conn, and none has reconnected since every connection
// last flushed for itself (until then they may have written to different
// instances of the lender). seqs is appended to buf, tickets to tbuf.
func (p *Pool) sharedFlush(buf []uint64, tbuf []flushTicket) (seqs []uint64, tickets []flushTicket, epoch uint64, ok bool) {
	seqs = append(buf[:0], make([]uint64, len(p.conns))...)
	var first nbd.URI
	for i, c := range p.conns {
		f, isShared := c.(sharedFlusher)
		if !isShared || !f.MultiConnSafe() {
			return nil, nil, 0, false
		}
		var (
			e      uint64
			export nbd.URI
		)
		if seqs[i], e, export, ok = f.flushSnapshot(); !ok {
			return nil, nil, 0, false
		}
		if i == 0 {
			first = export
		} else if export != first {
			return nil, nil, 0, false
		}
		epoch += e
	}
	if epoch != p.clean.Load() {
		return nil, nil, 0, false
	}
	// After the epochs were read: a ticket's connection is the one the
	// flush covers if they have not changed when it ends.
	tickets = tbuf[:0]
	for _, c := range p.conns {
		tickets = append(tickets, c.(sharedFlusher).flushTicket())
	}
	return seqs, tickets, epoch, true
}

// epochs is the sum of the connections' reconnections.
func (p *Pool) epochs() uint64 {
	var sum uint64
	for _, c := range p.conns {
		if f, ok := c.(sharedFlusher); ok {
			_, e, _, _ := f.flushSnapshot()
			sum += e
		}
	}
	return sum
}

// lostReporter is a connection that knows it broke with writes no flush
// had covered (nbdPart), and reports that to every flush under way (see
// nbdPart.lostGen): lostMark is what it has reported when a flush begins,
// lostSince returns the report (a *lossReport) of losses found since a
// mark, or nil, and records them reported, flushSince is Flush for a
// flush that began at a mark.
type lostReporter interface {
	lostMark() uint64
	lostSince(mark uint64) error
	flushSince(mark uint64) error
}

func multiConnSafe(d Device) bool {
	m, ok := d.(interface{ MultiConnSafe() bool })
	return ok && m.MultiConnSafe()
}

// Trim discards a range if the connections support it.
func (p *Pool) Trim(off, length int64) error {
	c, done := p.pick()
	defer done()
	t, ok := c.(Trimmer)
	if !ok {
		return ErrUnsupported
	}
	return t.Trim(off, length)
}

// WriteZeroes zeroes a range if the connections support it.
func (p *Pool) WriteZeroes(off, length int64, noHole bool) error {
	c, done := p.pick()
	defer done()
	z, ok := c.(Zeroer)
	if !ok {
		return ErrUnsupported
	}
	return z.WriteZeroes(off, length, noHole)
}

// CanTrim reports whether every connection supports Trim.
func (p *Pool) CanTrim() bool {
	for _, c := range p.conns {
		if !canTrim(c) {
			return false
		}
	}
	return true
}

// CanWriteZeroes reports whether every connection supports WriteZeroes.
func (p *Pool) CanWriteZeroes() bool {
	for _, c := range p.conns {
		if !canZero(c) {
			return false
		}
	}
	return true
}

// Close closes every connection.
func (p *Pool) Close() error {
	var errs []error
	for _, c := range p.conns {
		if cl, ok := c.(interface{ Close() error }); ok {
			if err := cl.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Extents asks the least busy connection which ranges are holes.
func (p *Pool) Extents(off, length int64) ([]nbd.Extent, error) {
	c, done := p.pick()
	defer done()
	e, ok := c.(Extenter)
	if !ok {
		return []nbd.Extent{{Length: length}}, nil
	}
	return e.Extents(off, length)
}

// CanExtents reports whether every connection can report holes.
func (p *Pool) CanExtents() bool {
	for _, c := range p.conns {
		if !canExtents(c) {
			return false
		}
	}
	return true
}

// canStartWrite implements asyncWriter when every connection does.
func (p *Pool) canStartWrite() bool {
	for _, c := range p.conns {
		if !canStartWrite(c) {
			return false
		}
	}
	return true
}

// startWrite implements asyncWriter on the least busy connection.
func (p *Pool) startWrite(b []byte, off int64, done func(error)) {
	i := p.pickIndex()
	p.conns[i].(asyncWriter).startWrite(b, off, func(err error) {
		p.inflight[i].Add(-1)
		done(err)
	})
}
