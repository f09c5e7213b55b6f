package donor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
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
//     under way are in the region and marked; reads go on;
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

// regionMove is a region's move state (region.mv).
type regionMove struct {
	dirty atomic.Pointer[dirty.Map]

	mu      sync.Mutex
	paused  bool
	retired bool
	active  int
	waiting int
	wake    chan struct{}
}

func newRegionMove() *regionMove { return &regionMove{wake: make(chan struct{})} }

func (m *regionMove) changedLocked() {
	close(m.wake)
	m.wake = make(chan struct{})
}

// enter admits a write: it waits while writes are paused and refuses it
// once the region is retired.
func (m *regionMove) enter() error {
	m.mu.Lock()
	for m.paused && !m.retired {
		ch := m.wake
		m.waiting++
		m.mu.Unlock()
		<-ch
		m.mu.Lock()
		m.waiting--
	}
	if m.retired {
		m.mu.Unlock()
		return errRetired
	}
	m.active++
	m.mu.Unlock()
	return nil
}

// leave ends a write admitted by enter, marking [off, off+n) first.
func (m *regionMove) leave(off, n int64) {
	if d := m.dirty.Load(); d != nil {
		d.Mark(off, n)
	}
	m.mu.Lock()
	m.active--
	if m.active == 0 {
		m.changedLocked()
	}
	m.mu.Unlock()
}

// retire refuses the writes held and to come.
func (m *regionMove) retire() {
	m.mu.Lock()
	m.retired = true
	m.changedLocked()
	m.mu.Unlock()
}

// beginWrite counts a write that starts; it returns the region's move
// state (the caller then calls enter and leave), or nil (the caller then
// calls endUntracked once the payload is in the region).
func (r *region) beginWrite() *regionMove {
	r.untracked.Add(1)
	mv := r.mv.Load()
	if mv != nil {
		r.untracked.Add(-1)
	}
	return mv
}

func (r *region) endUntracked() { r.untracked.Add(-1) }

// writeGate is the data handlers' hook before a WRITE's payload is
// received: ok=false refuses it (the region moved); otherwise the caller
// passes the returned state (nil when no move is in progress) to
// writeDone once the payload is in the region. Neither allocates: the
// sync channel's WRITE path stays allocation-free.
func (r *region) writeGate() (mv *regionMove, ok bool) {
	mv = r.beginWrite()
	if mv == nil {
		return nil, true
	}
	if mv.enter() != nil {
		return nil, false
	}
	return mv, true
}

// writeDone ends a write writeGate admitted.
func (r *region) writeDone(mv *regionMove, off, n uint64) {
	if mv == nil {
		r.endUntracked()
		return
	}
	mv.leave(int64(off), int64(n))
}

// moving returns the region of credential and its move state, created if
// needed.
func (d *Donor) moving(credential string) (*region, *regionMove, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.regions[credKey(credential)]
	if !ok || r.gone {
		return nil, nil, ErrNoRegion
	}
	mv := r.mv.Load()
	if mv == nil {
		mv = newRegionMove()
		r.mv.Store(mv)
	}
	return r, mv, nil
}

// waitUntracked waits until no write that started before the region's
// move state was installed is still arriving.
func waitUntracked(ctx context.Context, r *region) error {
	wait := 50 * time.Microsecond
	for r.untracked.Load() != 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Millisecond)
	}
	return nil
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
// could have missed m is still arriving.
func (d *Donor) TrackWrites(ctx context.Context, credential string, m *dirty.Map) error {
	r, mv, err := d.moving(credential)
	if err != nil {
		return err
	}
	if m != nil && m.Size() != int64(len(r.mem)) {
		return fmt.Errorf("memory: dirty map of %d bytes for a region of %d", m.Size(), len(r.mem))
	}
	mv.dirty.Store(m)
	return waitUntracked(ctx, r)
}

// PauseWrites holds the region's WRITEs that have not started and returns
// once those under way are in the region and marked. If ctx ends first
// the writes are resumed.
func (d *Donor) PauseWrites(ctx context.Context, credential string) error {
	r, mv, err := d.moving(credential)
	if err != nil {
		return err
	}
	mv.mu.Lock()
	mv.paused = true
	mv.changedLocked()
	mv.mu.Unlock()
	resume := func() {
		mv.mu.Lock()
		mv.paused = false
		mv.changedLocked()
		mv.mu.Unlock()
	}
	if err := waitUntracked(ctx, r); err != nil {
		resume()
		return err
	}
	mv.mu.Lock()
	for mv.active > 0 {
		ch := mv.wake
		mv.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			resume()
			return ctx.Err()
		}
		mv.mu.Lock()
	}
	mv.mu.Unlock()
	return nil
}

// ResumeWrites lets the held writes proceed.
func (d *Donor) ResumeWrites(credential string) error {
	_, mv, err := d.moving(credential)
	if err != nil {
		return err
	}
	mv.mu.Lock()
	mv.paused = false
	mv.changedLocked()
	mv.mu.Unlock()
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
	if mv := r.mv.Swap(nil); mv != nil {
		mv.dirty.Store(nil)
		mv.mu.Lock()
		mv.paused = false
		mv.changedLocked()
		mv.mu.Unlock()
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
	mv := r.mv.Load()
	if mv == nil {
		return 0
	}
	mv.mu.Lock()
	defer mv.mu.Unlock()
	return mv.waiting
}

// RetireRegion ends the service of a region that moved: held writes and
// later ones are refused with StatusGone, the writes under way complete,
// then the session's connections are closed and no new session is
// admitted. The memory is kept until RemoveRegion.
func (d *Donor) RetireRegion(ctx context.Context, credential string) error {
	r, mv, err := d.moving(credential)
	if err != nil {
		return err
	}
	mv.retire()
	mv.mu.Lock()
	for mv.active > 0 && ctx.Err() == nil {
		ch := mv.wake
		mv.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done(): // the session's end below stops them
		}
		mv.mu.Lock()
	}
	mv.mu.Unlock()
	d.mu.Lock()
	r.suspended = true
	s := r.sess
	d.mu.Unlock()
	if s != nil {
		d.endSession(s)
	}
	r.users.Wait()
	d.log.Info("memory region retired (moved)", "size", len(r.mem))
	return ctx.Err()
}

// ActivateRegion serves the region received under credential from under
// newCredential instead (a moved region becoming the lease's): the
// session under the old credential, if any, ends.
func (d *Donor) ActivateRegion(credential, newCredential string) error {
	if newCredential == "" || len(newCredential) > 4096 {
		return fmt.Errorf("memory: bad credential")
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
	d.mu.Unlock()
	if s != nil {
		d.endSession(s)
	}
	return nil
}

// abandonMove refuses the writes a move holds (the region's session is
// ending: RemoveRegion, SuspendRegion).
func (r *region) abandonMove() {
	if mv := r.mv.Swap(nil); mv != nil {
		mv.dirty.Store(nil)
		mv.retire()
	}
}
