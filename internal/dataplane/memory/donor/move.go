package donor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	"github.com/rialto-project/rialto/internal/dataplane/memory/internal/rawconn"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// Moving a region to another donor while its borrower uses it (the
// agent's live migration of a memory lease, page by page). The donor lets
// the copier
//
//   - read the region (ReadRegion) and learn which pages the borrower's
//     WRITEs changed since (TrackWrites with a dirty.Map): a write is
//     marked once its payload is in the region, so a copier that cleared
//     the map while it arrived sees it in its next pass;
//   - hold the writes that have not started for the last pass
//     (PauseWrites, ResumeWrites): PauseWrites returns once the writes
//     under way are in the region and marked, or (one whose payload
//     stalled: none of it for RefusalWait, or still arriving at
//     RefusalWaitLimit) failed with their connection's end and marked;
//     reads go on, and so do the session's other connections;
//   - end the session at the switch (RetireRegion): held writes are
//     answered StatusGone, the session's connections are closed and no new
//     session is admitted; the agent then removes (wipes) the region.
//
// ActivateRegion renames a region received under a transfer's credential
// to the lease's own.
//
// Without a move a WRITE pays two atomic additions for this (the count of
// writes that started without seeing one, which TrackWrites waits for).

// errRetired refuses the writes of a retired region.
var errRetired = errors.New("memory: region moved")

// writeGate is the data handlers' hook before a WRITE's payload is
// received: ok=false refuses it (the region moved, or, while the write
// was held, ended closed: the session ended, or the connection was
// replaced; see writer.quit), and the caller
// answers it GONE, then passes the returned state to writeRefused (the
// retirer closes the session's connections once the refusals are
// answered); otherwise the caller passes the returned state (nil when no
// move is in progress) to writeDone once the payload is in the region.
// None of them allocates: the sync channel's WRITE path stays
// allocation-free.
func (r *region) writeGate(ended <-chan struct{}) (g *dirty.Gate, ok bool) {
	g = r.writes.Begin()
	if g == nil {
		return nil, true
	}
	switch err := g.EnterUntil(ended); {
	case err == nil:
		return g, true
	case errors.Is(err, dirty.ErrRetired):
		return g, false // to be answered
	default:
		return nil, false // the session ended: no one to answer
	}
}

// writeRefused ends a write writeGate refused, once its GONE reply is
// sent (or could not be).
func (r *region) writeRefused(g *dirty.Gate) {
	if g != nil {
		g.Answered()
	}
}

// writeDone ends a write writeGate admitted.
func (r *region) writeDone(g *dirty.Gate, off, n uint64) {
	if g == nil {
		r.writes.EndUntracked()
		return
	}
	g.Leave(int64(off), int64(n))
}

// moving returns the region of credential and its write gate, installed
// if needed.
func (d *Donor) moving(credential string) (*region, *dirty.Gate, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.regions[credKey(credential)]
	if !ok || r.gone {
		return nil, nil, ErrNoRegion
	}
	return r, r.writes.Install(), nil
}

// RegionSize is the size of the region of credential (page-rounded).
func (d *Donor) RegionSize(credential string) (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.regions[credKey(credential)]
	if !ok || r.gone {
		return 0, ErrNoRegion
	}
	return int64(len(r.mem)), nil
}

// ReadRegion copies the region of credential at off into p.
func (d *Donor) ReadRegion(credential string, p []byte, off int64) (int, error) {
	d.mu.Lock()
	r, ok := d.regions[credKey(credential)]
	if !ok || r.gone {
		d.mu.Unlock()
		return 0, ErrNoRegion
	}
	r.users.Add(1) // RemoveRegion waits before it unmaps
	d.mu.Unlock()
	defer r.users.Done()
	if off < 0 || off > int64(len(r.mem)) || int64(len(p)) > int64(len(r.mem))-off {
		return 0, fmt.Errorf("memory: read [%d,+%d) outside a region of %d bytes", off, len(p), len(r.mem))
	}
	return copy(p, r.mem[off:]), nil
}

// TrackWrites makes the WRITEs to the region of credential that complete
// from now on mark m (nil stops marking). It returns once no write that
// could have missed m is still arriving: as PauseWrites, it closes the
// connection of such a write whose payload stalls.
func (d *Donor) TrackWrites(ctx context.Context, credential string, m *dirty.Map) error {
	r, g, err := d.moving(credential)
	if err != nil {
		return err
	}
	if m != nil && m.Size() != int64(len(r.mem)) {
		return fmt.Errorf("memory: dirty map of %d bytes for a region of %d", m.Size(), len(r.mem))
	}
	// A write under way may be one whose payload the borrower withholds:
	// as PauseWrites.
	return r.writes.TrackWithin(ctx, g, m, d.stall(r))
}

// PauseWrites holds the region's WRITEs that have not started and returns
// once those under way are in the region and marked. A WRITE is under way
// from its header on, and a borrower may withhold its payload, or send it
// slowly: PauseWrites waits for a write while its payload arrives, up to
// RefusalWaitLimit, and closes its connection once none of it arrived for
// RefusalWait, or at that limit (the write fails, unacknowledged, and
// leaves), then returns once it has left. Only that connection is closed:
// the session's others are served on, their writes held like any. If ctx
// ends first the writes are resumed.
func (d *Donor) PauseWrites(ctx context.Context, credential string) error {
	r, g, err := d.moving(credential)
	if err != nil {
		return err
	}
	return r.writes.PauseWithin(ctx, g, d.stall(r))
}

// DefaultRefusalWaitLimit is the donor's default RefusalWaitLimit: far
// more than a payload of protocol.MaxPayload (1 MiB) takes on any link a
// borrower's requests survive (Rialto's client gives up on a request after
// 5 s), and a borrower trickling its payload holds a move up no longer.
const DefaultRefusalWaitLimit = time.Minute

func (d *Donor) refusalWaitLimit() time.Duration {
	if d.RefusalWaitLimit > 0 {
		return d.RefusalWaitLimit
	}
	return DefaultRefusalWaitLimit
}

// stall bounds a move's wait for r's writes under way: the connections
// whose write stalls are closed (writer.Stop), not the others.
func (d *Donor) stall(r *region) dirty.Stall {
	return dirty.Stall{Wait: d.refusalWait(), Limit: d.refusalWaitLimit(), Clock: d.Clock,
		Writers: dirty.WritersIn(&d.mu, &r.writers)}
}

// writer is the handler of one of a region's data connections as a
// move's wait sees it (dirty.Writer): whether it has a WRITE under way,
// admitted by the move's gate or untracked, and how many bytes of
// payload it received. It is registered with the connection's HELLO
// (attach), under the connection's id in its session, and dropped once
// its handler has returned (detach).
type writer struct {
	d        *Donor
	id       uint32       // the connection's id in its session (a queue's queue id)
	writing  atomic.Int32 // notWriting, writingUntracked or writingTracked
	received atomic.Int64
	// stop closes the connection; nil until the handler serves (d.mu).
	stop func()
	// closed: the donor closed the connection (Stop: a move's stalled
	// write; replace: a connection of the session replaces it;
	// endSession: its session ended), and the handler serves no further
	// request on it; left closes once the handler has returned
	// (dropWriter). See fence.
	closed atomic.Bool
	left   chan struct{}
	// quit closes when the session ends or the connection is replaced:
	// a WRITE a move holds gives up then (writeGate).
	quit     chan struct{}
	quitOnce sync.Once
}

const (
	notWriting int32 = iota
	writingUntracked
	writingTracked
)

// addWriterLocked registers the writer of a new data connection of s,
// whose id is id; d.mu is held.
func (d *Donor) addWriterLocked(s *session, id uint32) *writer {
	w := &writer{d: d, id: id, left: make(chan struct{}), quit: make(chan struct{})}
	r := s.reg
	if r.writers == nil {
		r.writers = map[*writer]struct{}{}
	}
	r.writers[w] = struct{}{}
	s.links[id] = w
	d.dataConns++
	return w
}

// serving gives w the function that closes its connection, as its
// handler starts serving it; false if the connection was replaced
// meanwhile (the handler serves nothing then).
func (d *Donor) serving(w *writer, stop func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	w.stop = stop
	return !w.closed.Load()
}

// dropWriter takes w out of s and its region once its handler has
// returned (or never served).
func (d *Donor) dropWriter(s *session, w *writer) {
	d.mu.Lock()
	delete(s.reg.writers, w)
	d.dataConns--
	if s.links[w.id] == w {
		delete(s.links, w.id)
	}
	d.mu.Unlock()
	// A queue connection's credit window goes with it (ids are unique
	// in the session; before left closes: the HELLO of a connection
	// that replaces it finds it gone).
	s.credMu.Lock()
	delete(s.queues, w.id)
	s.credMu.Unlock()
	w.quitServing()
	close(w.left)
}

// quitServing closes w.quit (once).
func (w *writer) quitServing() { w.quitOnce.Do(func() { close(w.quit) }) }

// replace marks w, whose connection a new connection of its session
// replaces (its client gave it up: it timed out, or saw it end), closed,
// and returns what ends it, to be called once d.mu (held) is released:
// the connection is shut down and a write a move holds on it gives up,
// so that none of it is served from then on; the new connection's HELLO
// is answered once w's handler has returned (fence). A connection the
// client gave up may still be receiving a WRITE whose payload is late
// on its way, or hold one a move's pause holds: without this, its bytes
// could land after the new connection's writes to the same range.
func (w *writer) replace() func() {
	if w.closed.Swap(true) {
		return w.quitServing // closed by the donor already (Stop)
	}
	stop := w.stop
	return func() {
		w.d.log.Info("memory: a connection replaced by a new one of its session is closed")
		w.quitServing()
		if stop != nil {
			stop()
		}
	}
}

// fence waits until the handlers of r's connections the donor closed
// itself (Stop: a move's stalled write; replace; endSession: those of a
// session that ended, r's earlier sessions' included) have returned,
// before a new data connection of r's session is answered its HELLO: a
// client sends again on the new connection the requests the closed one
// left unanswered (client.Client re-establishes a lost connection
// alone), or the region's next session writes where the ended one did,
// and what the closed one's handler still received — the bytes that had
// arrived before the close — must not land in the region after them.
// Such a handler returns as soon as it has read those: false (the HELLO
// is refused) if it has not within errHandshakeLimit.
func (d *Donor) fence(r *region) bool {
	d.mu.Lock()
	var wait []chan struct{}
	for w := range r.writers {
		if w.closed.Load() {
			wait = append(wait, w.left)
		}
	}
	d.mu.Unlock()
	if len(wait) == 0 {
		return true
	}
	d.fenceWaits.Add(1)
	defer d.fenceWaits.Add(-1)
	t := time.NewTimer(errHandshakeLimit)
	defer t.Stop()
	for _, left := range wait {
		select {
		case <-left:
		case <-t.C:
			return false
		}
	}
	return true
}

// begin marks a WRITE under way, from writeGate's admission (g, nil if
// untracked) until end.
func (w *writer) begin(g *dirty.Gate) {
	if g == nil {
		w.writing.Store(writingUntracked)
	} else {
		w.writing.Store(writingTracked)
	}
}

func (w *writer) end() { w.writing.Store(notWriting) }

// read fills p from r (a WRITE's payload), counting the bytes as they
// arrive.
func (w *writer) read(r io.Reader, p []byte) error {
	for len(p) > 0 {
		n, err := r.Read(p)
		w.received.Add(int64(n))
		p = p[n:]
		if err != nil {
			if len(p) == 0 {
				return nil
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// recv is read from a connection driven with raw syscalls.
func (w *writer) recv(p *rawconn.Conn, b []byte) error {
	for len(b) > 0 {
		n, err := p.RecvAtLeast([][]byte{b}, 1)
		w.received.Add(int64(n))
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// Writing implements dirty.Writer.
func (w *writer) Writing(tracked bool) (bool, int64) {
	st := w.writing.Load()
	return st == writingUntracked || (tracked && st == writingTracked), w.received.Load()
}

// Stop implements dirty.Writer: it closes the connection, so that the
// handler's read of the withheld payload fails and the write leaves,
// never acknowledged; the session's other connections are served on. A
// borrower that wants the write done sends it again (on another
// connection of the session, or of its next one), held like any; a new
// connection of the session is admitted once this handler has returned
// (fence).
func (w *writer) Stop(why error) {
	w.d.log.Warn("memory move: closing the connection of a write whose payload stalled",
		"why", why, "wait", w.d.refusalWait(), "limit", w.d.refusalWaitLimit())
	w.closed.Store(true) // first: a HELLO the close lets in waits for the handler (fence)
	w.d.mu.Lock()
	stop := w.stop
	w.d.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// ResumeWrites lets the held writes proceed.
func (d *Donor) ResumeWrites(credential string) error {
	_, g, err := d.moving(credential)
	if err != nil {
		return err
	}
	g.Resume()
	return nil
}

// EndMove stops tracking and resumes the writes: the region is served as
// if no move had started.
func (d *Donor) EndMove(credential string) error {
	d.mu.Lock()
	r, ok := d.regions[credKey(credential)]
	d.mu.Unlock()
	if !ok {
		return ErrNoRegion
	}
	if g := r.writes.Remove(); g != nil {
		g.End()
	}
	return nil
}

// Waiting reports how many writes to the region of credential are held.
func (d *Donor) Waiting(credential string) int {
	d.mu.Lock()
	r, ok := d.regions[credKey(credential)]
	d.mu.Unlock()
	if !ok {
		return 0
	}
	if g := r.writes.Gate(); g != nil {
		return g.Waiting()
	}
	return 0
}

// WaitMove waits until cond holds for the write gate of the move of the
// region of credential (dirty.Gate.WaitChange says when cond is looked
// at), or ctx ends; it fails at once if the region is unknown or does
// not move.
func (d *Donor) WaitMove(ctx context.Context, credential string, cond func(dirty.Stats) bool) error {
	d.mu.Lock()
	r, ok := d.regions[credKey(credential)]
	d.mu.Unlock()
	if !ok {
		return ErrNoRegion
	}
	g := r.writes.Gate()
	if g == nil {
		return errors.New("memory: the region does not move")
	}
	return g.WaitChange(ctx, cond)
}

// RetireRegion ends the service of a region that moved: held writes and
// later ones are refused with StatusGone, the writes under way complete,
// then (after RefusalWait at most) the session's connections are closed
// and no new session is admitted. The memory is kept until RemoveRegion.
func (d *Donor) RetireRegion(ctx context.Context, credential string) error {
	r, g, err := d.moving(credential)
	if err != nil {
		return err
	}
	g.Retire()
	// The writes under way complete and the refused ones are answered
	// GONE before their connections close; if ctx ends first, or the
	// answers take longer than RefusalWait (a refused write's payload is
	// read before its answer, and a borrower may withhold it), the
	// session's end below stops them. Its callers' contexts need not end
	// (an agent's heartbeat round commits a sealed move).
	dctx, cancel := context.WithTimeout(ctx, d.refusalWait())
	_ = g.Drain(dctx)
	cancel()
	d.mu.Lock()
	r.suspended, r.retired = true, true
	s := r.sess
	d.mu.Unlock()
	if s != nil {
		d.endSession(s)
	}
	r.users.Wait()
	d.log.Info("memory region retired (moved)", "size", len(r.mem))
	return ctx.Err()
}

// RegionGeneration is the generation of the region of credential (what
// a move's source carries to the destination: protocol.MoveGeneration).
func (d *Donor) RegionGeneration(credential string) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.regions[credKey(credential)]
	if !ok || r.gone {
		return 0, ErrNoRegion
	}
	return r.gen.Load(), nil
}

// ActivateRegion serves the region received under credential from under
// newCredential instead (a moved region becoming the lease's): the
// session under the old credential, if any, ends. A region added by
// ReceiveRegion takes the generation its move's source carried, if it
// did (else it keeps its own): the region moved keeps its generation.
func (d *Donor) ActivateRegion(credential, newCredential string) error {
	if newCredential == "" || len(newCredential) > protocol.MaxCredential {
		return fmt.Errorf("memory: credential must be 1..%d bytes", protocol.MaxCredential)
	}
	d.mu.Lock()
	r, ok := d.regions[credKey(credential)]
	if !ok || r.gone {
		d.mu.Unlock()
		return ErrNoRegion
	}
	if _, dup := d.regions[credKey(newCredential)]; dup {
		d.mu.Unlock()
		return ErrRegionExists
	}
	delete(d.regions, credKey(credential))
	d.regions[credKey(newCredential)] = r
	s := r.sess
	carried := r.receiving && r.carried != 0
	if carried {
		r.gen.Store(r.carried)
	}
	r.receiving, r.carried = false, 0
	d.mu.Unlock()
	if s != nil {
		d.endSession(s)
	}
	if carried {
		d.log.Info("moved memory region activated with its source's generation")
	}
	return nil
}

// abandonMove refuses the writes a move holds and ends the move (the
// region is going away: RemoveRegion, the donor stopping).
func (r *region) abandonMove() {
	if g := r.writes.Remove(); g != nil {
		g.Retire() // first: a held write must not slip through End's resume
		g.End()
	}
}
