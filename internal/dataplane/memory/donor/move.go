package donor

import (
	"context"
	"errors"
	"fmt"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
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
//     under way are in the region and marked, or (one withholding its
//     payload past RefusalWait) failed with their session's end and
//     marked; reads go on;
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
// received: ok=false refuses it (the region moved, or the session, whose
// end closes ended, ended while the write was held), and the caller
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
// could have missed m is still arriving: after RefusalWait, as
// PauseWrites, it ends the session of a borrower that withholds such a
// write's payload.
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
	return r.writes.TrackWithin(ctx, g, m, d.refusalWait(), d.stopWrites(r))
}

// PauseWrites holds the region's WRITEs that have not started and returns
// once those under way are in the region and marked. A WRITE is under way
// from its header on, and a borrower may withhold its payload: if they
// are not all in within RefusalWait, the region's session ends (its
// connections are closed: the writes under way fail, unacknowledged, and
// leave; the borrower's next session is held like any), and PauseWrites
// returns once they have left. If ctx ends first the writes are resumed.
func (d *Donor) PauseWrites(ctx context.Context, credential string) error {
	r, g, err := d.moving(credential)
	if err != nil {
		return err
	}
	return r.writes.PauseWithin(ctx, g, d.refusalWait(), d.stopWrites(r))
}

// stopWrites returns the function that makes the writes under way to r
// end promptly, for a move that waited RefusalWait for them: it ends r's
// session, closing its connections (those of earlier sessions are closed
// already), so that a write whose payload is withheld fails, never
// acknowledged, and its handler leaves; the borrower's next session is
// served (or held) like any.
func (d *Donor) stopWrites(r *region) func() {
	return func() {
		d.mu.Lock()
		s := r.sess
		d.mu.Unlock()
		if s != nil {
			d.log.Warn("memory move: a write under way withheld its payload; ending the session", "wait", d.refusalWait())
			d.endSession(s)
		}
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
