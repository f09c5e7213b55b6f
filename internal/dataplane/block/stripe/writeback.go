package stripe

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
)

// ErrWriteBack is returned by a Flush when a write that the local export
// had already acknowledged (write-back, see writeBack) then failed at its
// lender: the data of that write may be lost.
var ErrWriteBack = errors.New("stripe: an acknowledged write failed at its lender; its data may be lost")

// Write-back limits (see writeBack).
const (
	// maxEarlyWrite is the largest write acknowledged before its lender's
	// reply; larger ones (streaming writes, which gain nothing from it)
	// wait for the reply.
	maxEarlyWrite = 1 << 20
	// maxEarlyBytes and maxEarlyWrites bound what is acknowledged and not
	// yet answered by the lenders: a write that would exceed either waits
	// until earlier ones are answered.
	maxEarlyBytes  = 16 << 20
	maxEarlyWrites = 256
	// failSummaryEvery: the failures of acknowledged writes after the
	// first are summed up in one log line at most this often (and at the
	// next Flush or Close); see failLog.
	failSummaryEvery = 10 * time.Second
)

// asyncWriter is implemented by devices that can send a write and report
// its outcome later (nbdPart, a Pool of them): startWrite sends b (which
// must stay untouched until done) and calls done exactly once with what
// WriteAt would have returned — possibly before it returns, possibly from
// another goroutine. done must not block.
type asyncWriter interface {
	startWrite(b []byte, off int64, done func(error))
	canStartWrite() bool
}

func canStartWrite(d Device) bool {
	a, ok := d.(asyncWriter)
	return ok && a.canStartWrite()
}

// writeBack acknowledges a volume's plain writes once they have been sent
// to their lenders, before the lenders' replies: a volatile write cache,
// as NBD allows a server that advertises NBD_FLAG_SEND_FLUSH (nbdkit's file
// plugin, which writes into the page cache, does the same). Durability is
// promised only by FLUSH and FUA:
//
//   - Flush first waits for every write acknowledged before it began to be
//     answered by its lender, then flushes the volume. A write that failed
//     after its acknowledgment fails a Flush (ErrWriteBack): the failure is
//     reported to every Flush under way when it is first reported and to
//     the first Flush that begins after it, and not again (the model of
//     Linux's errseq with one observer, the export: a later flush reports
//     only new failures, as fsync does after a writeback error). A
//     report whose reply never reached its client is reported again by
//     the next Flush and by Close (untold, at the export).
//   - FUA writes, WriteZeroes, Trim and writes larger than maxEarlyWrite
//     wait for their lenders, as without write-back.
//   - Order: a request (read, write, trim, zeroing, block status) that
//     overlaps an acknowledged write not yet answered waits until it is, so
//     that the lender (whose server may run a connection's requests
//     concurrently) never sees them reordered.
//   - Bounded: at most maxEarlyBytes and maxEarlyWrites are acknowledged
//     and unanswered; a write beyond waits.
//   - Close (Attachment.Close) takes no new write, waits for those in
//     flight (within the request timeout, even when CloseContext's ctx
//     ends first: they are acknowledged), flushes, and reports a failure
//     as a Flush that began with it would, and one whose report a Flush's
//     lost reply carried, once (lossReport).
//   - Logged without flooding (failLog): a lender that fails every write
//     (out of space) fails thousands of acknowledged writes before the
//     next FLUSH; the first is logged at ERROR with its cause, the later
//     ones are counted and summed up in one line at most every
//     failSummaryEvery, and at the next Flush and Close.
//
// A write spanning parts is acknowledged once every part's piece is sent.
// A crash of the process holding it loses what a volatile cache loses:
// the writes acknowledged and not yet covered by a successful flush.
type writeBack struct {
	v *Volume

	mu       sync.Mutex
	cond     sync.Cond     // broadcast when a write is answered or on close
	inflight []*wbWrite    // acknowledged (or being sent), not yet answered
	bytes    int64         // their total length
	seq      uint64        // of the last write registered
	report   *lossReport   // of the last failure of an acknowledged write
	errGen   uint64        // failures of acknowledged writes so far
	reported uint64        // errGen when a Flush last reported a failure
	closed   bool          // Close was called
	waiters  int           // requests waiting in cond.Wait (for tests)
	early    atomic.Uint64 // writes acknowledged early (for tests)
	flog     failLog       // under mu
}

// failLog is what has been logged of the failures of acknowledged writes:
// whether the first of a run of failures was (at ERROR, with its cause),
// and the failures since not yet summed up in a log line.
type failLog struct {
	clk      clock.Clock // clock.Real; tests set a fake
	logged   bool        // the first failure of the run was logged
	n        int         // failures since, not logged
	since    time.Time   // when the first of those n failed
	last     error       // the last of them
	summedAt time.Time   // when the first failure or the last summary was logged
}

// wbWrite is one write in flight.
type wbWrite struct {
	off, end int64
	seq      uint64
	buf      *[]byte
	// state: wbSending until the issuer has sent it (then wbAcked), or
	// wbDoneEarly if it was answered before that (its outcome in err,
	// returned by the issuer instead of being reported to a Flush).
	state atomic.Int32
	err   error
}

const (
	wbSending int32 = iota
	wbAcked
	wbDoneEarly
)

// newWriteBack returns a write-back cache over v, or nil if some device
// cannot send a write without awaiting it, or bounds its requests with a
// timer of the volume's (one per sub-request) rather than its own.
func newWriteBack(v *Volume) *writeBack {
	if !v.startsWrites() {
		return nil
	}
	w := &writeBack{v: v, flog: failLog{clk: clock.Real{}}}
	w.cond.L = &w.mu
	return w
}

// wait waits for the next answer (or close), with w.mu held.
func (w *writeBack) wait() {
	w.waiters++
	w.cond.Wait()
	w.waiters--
}

// state returns the writes in flight and the requests waiting (for tests).
func (w *writeBack) state() (inflight, waiters int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.inflight), w.waiters
}

// overlapsLocked reports whether [off, end) overlaps a write in flight.
func (w *writeBack) overlapsLocked(off, end int64) bool {
	for _, x := range w.inflight {
		if off < x.end && x.off < end {
			return true
		}
	}
	return false
}

// order waits until no write in flight overlaps [off, off+n).
func (w *writeBack) order(off, n int64) {
	w.mu.Lock()
	for len(w.inflight) > 0 && w.overlapsLocked(off, off+n) {
		w.wait()
	}
	w.mu.Unlock()
}

// WriteAt writes p at off, acknowledging it once sent when it is small
// enough (see writeBack).
func (w *writeBack) WriteAt(p []byte, off int64) (int, error) {
	n := int64(len(p))
	if err := w.v.check(off, n); err != nil {
		return 0, err
	}
	if n == 0 || n > maxEarlyWrite {
		w.order(off, n)
		return w.v.WriteAt(p, off)
	}
	x := &wbWrite{off: off, end: off + n}
	w.mu.Lock()
	for !w.closed && (w.overlapsLocked(x.off, x.end) || len(w.inflight) >= maxEarlyWrites ||
		(len(w.inflight) > 0 && w.bytes+n > maxEarlyBytes)) {
		w.wait()
	}
	if w.closed {
		w.mu.Unlock()
		return 0, ErrClosed
	}
	w.seq++
	x.seq = w.seq
	w.inflight = append(w.inflight, x)
	w.bytes += n
	w.mu.Unlock()

	x.buf = getWBBuf(int(n))
	copy(*x.buf, p) // the caller's buffer is reused once it returns
	w.v.startWrite(*x.buf, off, true, func(err error) { w.answered(x, err) })
	if x.state.CompareAndSwap(wbSending, wbAcked) {
		w.early.Add(1)
		return len(p), nil
	}
	// Answered before we could acknowledge it (a failed part, a closed
	// volume, a quick reply): its outcome is ours to return. A write that
	// must be retried on a redialled connection is acknowledged, and
	// stays in flight (ordering what overlaps it) until the retry ends.
	if x.err != nil {
		return 0, x.err
	}
	return len(p), nil
}

// answered ends write x, whose lenders answered err.
func (w *writeBack) answered(x *wbWrite, err error) {
	x.err = err
	early := !x.state.CompareAndSwap(wbSending, wbDoneEarly)
	w.mu.Lock()
	for i, y := range w.inflight {
		if y == x {
			last := len(w.inflight) - 1
			w.inflight[i] = w.inflight[last]
			w.inflight[last] = nil
			w.inflight = w.inflight[:last]
			break
		}
	}
	w.bytes -= x.end - x.off
	if err != nil && early {
		w.report = &lossReport{fmt.Errorf("%w: %w", ErrWriteBack, err)}
		w.errGen++
		w.failedLocked(x, err)
	}
	w.cond.Broadcast()
	w.mu.Unlock()
	if err == nil {
		// Answered: the lender has had every byte. A failed write's
		// copy may still be being written into a connection that was
		// failed under it (a timeout, Close): it is left to the
		// garbage collector rather than handed to the next write.
		putWBBuf(x.buf)
	}
}

// failedLocked logs the failure err of acknowledged write x: the first of
// a run at ERROR with its cause; the later ones are counted, and summed
// up once failSummaryEvery has passed since the last line.
func (w *writeBack) failedLocked(x *wbWrite, err error) {
	f, now := &w.flog, w.flog.clk.Now()
	if !f.logged {
		f.logged, f.summedAt = true, now
		w.v.log.Error("stripe: an acknowledged write failed; the next flush reports it (further failures are counted, not logged one by one)",
			"off", x.off, "len", x.end-x.off, "err", err)
		return
	}
	if f.n == 0 {
		f.since = now
	}
	f.n++
	f.last = err
	if now.Sub(f.summedAt) >= failSummaryEvery {
		w.sumUpLocked(now)
	}
}

// sumUpLocked logs the failures counted since the last line, if any.
func (w *writeBack) sumUpLocked(now time.Time) {
	f := &w.flog
	if f.n == 0 {
		return
	}
	w.v.log.Error(fmt.Sprintf("stripe: %d more acknowledged writes failed since %s", f.n, f.since.Format(time.RFC3339)),
		"failed", f.n, "since", f.since, "err", f.last)
	f.n, f.last, f.summedAt = 0, nil, now
}

// Flush waits for the writes acknowledged before it began, then flushes
// the volume; see writeBack for the failures it reports. It logs the
// failures counted and not logged yet; one that found none ends their
// run (the next failure is logged with its cause).
func (w *writeBack) Flush() error {
	w.mu.Lock()
	upTo, seen, mark := w.seq, w.reported, w.v.flushMark()
	for w.pendingUpToLocked(upTo) {
		w.wait()
	}
	werr := w.failedSinceLocked(seen)
	w.sumUpLocked(w.flog.clk.Now())
	if werr == nil {
		w.flog.logged = false
	}
	w.mu.Unlock()
	return errors.Join(werr, w.v.flushSince(mark))
}

// failedSinceLocked returns the report of the latest failure (wrapping
// ErrWriteBack and the failure) if an acknowledged write failed that no
// Flush had reported when reported was seen, and records it reported; nil
// otherwise. Every taker of the same failure gets the same report.
func (w *writeBack) failedSinceLocked(seen uint64) error {
	if w.errGen <= seen {
		return nil
	}
	w.reported = max(w.reported, w.errGen)
	return w.report
}

// pendingUpToLocked reports whether a write registered at or before seq is
// still in flight.
func (w *writeBack) pendingUpToLocked(seq uint64) bool {
	for _, x := range w.inflight {
		if x.seq <= seq {
			return true
		}
	}
	return false
}

// close makes waiting and later writes fail with ErrClosed and returns
// what a Flush beginning now would take as reported (settle's seen).
func (w *writeBack) close() (seen uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	w.cond.Broadcast()
	return w.reported
}

// settle waits until no write is in flight (after close: none starts) and
// returns what a Flush that began when close returned seen would report
// of their failures. The writes end within their parts' bounds, or when
// the volume is closed (which fails what its lenders have not answered).
func (w *writeBack) settle(seen uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.inflight) > 0 {
		w.wait()
	}
	w.sumUpLocked(w.flog.clk.Now())
	return w.failedSinceLocked(seen)
}

// Copies of early-acknowledged writes, pooled by power-of-two size class
// from 4 KiB to maxEarlyWrite.
const (
	wbMinClass = 12
	wbMaxClass = 20 // log2(maxEarlyWrite)
)

var wbBufs [wbMaxClass - wbMinClass + 1]sync.Pool

func wbClass(n int) int {
	if n <= 1<<wbMinClass {
		return 0
	}
	return bits.Len(uint(n-1)) - wbMinClass
}

func getWBBuf(n int) *[]byte {
	c := wbClass(n)
	if b, ok := wbBufs[c].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(c+wbMinClass))
	return &b
}

func putWBBuf(b *[]byte) {
	wbBufs[wbClass(cap(*b))].Put(b)
}

// startsWrites reports whether every device can send a write and hear its
// outcome later and bounds its requests itself (startWrite's condition).
func (v *Volume) startsWrites() bool {
	for _, m := range v.parts {
		if !canStartWrite(m.dev) || !m.selfTimed {
			return false
		}
	}
	return true
}

// startWrite sends p (inside the volume, non-empty) to the devices it
// spans and calls done once every piece has been answered, with the first
// error; possibly before it returns. Every device is an asyncWriter and
// bounds its requests itself (newWriteBack). early says the write-back
// cache has (or may have) acknowledged it already and waits for it
// itself: it is not registered with beginWrite (settle's seal does not
// fail it, nor does closing refuse it: the cache refuses new writes).
func (v *Volume) startWrite(p []byte, off int64, early bool, done func(error)) {
	if !early && !v.beginWrite() {
		done(ErrClosed)
		return
	}
	n := int64(len(p))
	if c, ok := v.single(off, n); ok {
		if err := v.live(c.dev); err != nil {
			if !early {
				err = v.endWrite(err)
			}
			done(err)
			return
		}
		m := v.parts[c.dev]
		m.unanswered.Add(1)
		m.dev.(asyncWriter).startWrite(p, c.devOff, func(err error) {
			m.unanswered.Add(-1)
			if err = v.outcome(c.dev, err); err == nil {
				m.wseq.Add(1)
			}
			if !early {
				err = v.endWrite(err)
			}
			done(err)
		})
		return
	}
	cs := v.split(off, n)
	var err error
	if v.closed.Load() {
		err = ErrClosed
	}
	for _, c := range cs {
		if m := v.parts[c.dev]; err == nil && m.failed.Load() {
			err = m.err(c.dev)
		}
	}
	if err != nil {
		if !early {
			err = v.endWrite(err)
		}
		done(err)
		return
	}
	piece := join(len(cs), func(err error) {
		if !early {
			err = v.endWrite(err)
		}
		done(err)
	})
	for _, c := range cs {
		m := v.parts[c.dev]
		m.unanswered.Add(1)
		m.dev.(asyncWriter).startWrite(p[c.volOff-off:c.volOff-off+c.len], c.devOff, func(err error) {
			m.unanswered.Add(-1)
			if err = v.outcome(c.dev, err); err == nil {
				m.wseq.Add(1)
			}
			piece(err)
		})
	}
}
