package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/rialto-project/rialto/api"
)

// The wipe journal (wipes.json in the state dir, 0600) lists the ranges
// being zeroed before they return to the pool. An entry is written and
// fsynced before the lease's export is torn down, and removed only after
// the zeroes are durable; a range with an entry is refused to every
// prepare (ErrOverlap, so the control plane places elsewhere). A restarted
// agent finishes the journal's wipes before it serves anything, so a crash
// in the middle of a wipe leaves the range unlendable until it is wiped.
const wipesFile = "wipes.json"

// errCrashInjected ends a wipe stopped by Faults.CrashMidWipe.
var errCrashInjected = errors.New("agent: wipe stopped half-way (fault injected)")

// wipeEntry is one journal entry: a lease's range of a device.
type wipeEntry struct {
	LeaseID    string   `json:"lease_id"`
	Kind       api.Kind `json:"kind"`
	DeviceName string   `json:"device_name"`
	// DevicePath is the device's file: the entry is the range of that
	// file whatever the device is called when it runs (a restart may
	// rename devices, or give the name to another file). "" in entries
	// written before it was: the device named DeviceName.
	DevicePath string `json:"device_path,omitempty"`
	Offset     int64  `json:"offset"`
	Length     int64  `json:"length"`
}

// pendingWipe is a journal entry in memory; running is set while a wipe of
// it is under way (a.mu).
type pendingWipe struct {
	wipeEntry
	running bool
	// done is closed when the run under way ends (set while running);
	// err is the outcome of the last run; waiting counts the callers
	// waiting for the run under way (a.mu guards the four).
	done    chan struct{}
	err     error
	waiting int
	// live: the range of a part being received (transfer.go), whose
	// transfer decides: its commit drops the entry, its abort wipes. Not
	// retried meanwhile; a restart (which forgets transfers) wipes it.
	live bool
}

// overlaps reports whether the entry's range overlaps [off, off+n) of the
// device named name whose file is at path ("" if not known).
func (w wipeEntry) overlaps(name, path string, off, n int64) bool {
	same := w.DeviceName == name
	if w.DevicePath != "" && path != "" {
		same = sameFile(w.DevicePath, path)
	}
	return same && w.Offset < off+n && off < w.Offset+w.Length
}

// wipeOverlapLocked reports whether req's range overlaps a pending wipe;
// a.mu is held.
func (a *Agent) wipeOverlapLocked(req api.PrepareRequest) bool {
	return a.wipeOverlapPathLocked(req, a.devices[req.DeviceName].Path)
}

// wipeOverlapPathLocked is wipeOverlapLocked for a range of the file at
// path; a.mu is held.
func (a *Agent) wipeOverlapPathLocked(req api.PrepareRequest, path string) bool {
	for _, w := range a.wipes {
		if w.overlaps(req.DeviceName, path, req.Offset, req.Length) {
			return true
		}
	}
	return false
}

// needsWipe reports whether tearing e down must wipe its range.
func (a *Agent) needsWipe(e Export) bool {
	_, ok := a.drivers[e.Device.Kind].(Wiper)
	return ok && e.Request.Length > 0
}

// journalWipe adds e's range to the journal and persists it. The entry
// stays in memory (and the range refused) even if persisting fails (the
// caller may forgetWipe it).
func (a *Agent) journalWipe(e Export, live bool) (*pendingWipe, error) {
	w := &pendingWipe{wipeEntry: wipeEntry{LeaseID: e.Request.LeaseID, Kind: e.Device.Kind, DeviceName: e.Device.Name, DevicePath: e.Device.Path,
		Offset: e.Request.Offset, Length: e.Request.Length}, live: live}
	a.mu.Lock()
	a.wipes = append(a.wipes, w)
	a.mPendingWipes.Set(float64(len(a.wipes)))
	a.mu.Unlock()
	return w, a.saveWipes()
}

// forgetWipe drops w from the journal in memory only: a range whose wipe
// could not be journalled, whose export is kept.
func (a *Agent) forgetWipe(w *pendingWipe) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, x := range a.wipes {
		if x == w {
			a.wipes = append(a.wipes[:i], a.wipes[i+1:]...)
			break
		}
	}
	a.mPendingWipes.Set(float64(len(a.wipes)))
}

// saveWipes persists the journal.
func (a *Agent) saveWipes() error {
	return a.persistWipes(nil)
}

// persistWipes writes the journal without drop, then (if that worked)
// forgets drop: a wiped range becomes lendable only once no journal entry
// can make a restart wipe it again, over the next tenant's bytes.
func (a *Agent) persistWipes(drop *pendingWipe) error {
	a.wipeMu.Lock()
	defer a.wipeMu.Unlock()
	a.mu.Lock()
	out := make([]wipeEntry, 0, len(a.wipes))
	for _, w := range a.wipes {
		if w != drop {
			out = append(out, w.wipeEntry)
		}
	}
	a.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].DeviceName != out[j].DeviceName {
			return out[i].DeviceName < out[j].DeviceName
		}
		return out[i].Offset < out[j].Offset
	})
	if err := writeJSON(filepath.Join(a.cfg.StateDir, wipesFile), out); err != nil {
		return fmt.Errorf("agent: wipe journal: %w", err)
	}
	if drop != nil {
		a.mu.Lock()
		for i, x := range a.wipes {
			if x == drop {
				a.wipes = append(a.wipes[:i], a.wipes[i+1:]...)
				break
			}
		}
		a.mPendingWipes.Set(float64(len(a.wipes)))
		a.mu.Unlock()
	}
	return nil
}

// loadWipes reads the journal a previous run left. Entries naming devices
// the agent no longer lends are kept in the file but cannot be wiped, and
// their ranges stay refused.
func (a *Agent) loadWipes() error {
	var saved []wipeEntry
	if err := readJSON(filepath.Join(a.cfg.StateDir, wipesFile), &saved); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, w := range saved {
		a.wipes = append(a.wipes, &pendingWipe{wipeEntry: w})
	}
	a.mPendingWipes.Set(float64(len(a.wipes)))
	return nil
}

// runWipe zeroes w's range and, once the zeroes are durable, removes its
// journal entry. If a wipe of w is already under way (a heartbeat's
// retry), it waits for that one and returns its outcome: a teardown
// answers only once its range is wiped.
func (a *Agent) runWipe(ctx context.Context, w *pendingWipe) error {
	return a.runWipeOr(ctx, w, true)
}

// runWipeOr is runWipe; with wait false, a wipe under way elsewhere is
// left to finish there (nil at once): what the heartbeat's retry does,
// which must not hold the heartbeat.
func (a *Agent) runWipeOr(ctx context.Context, w *pendingWipe, wait bool) error {
	a.mu.Lock()
	switch {
	case w.live:
		a.mu.Unlock()
		return nil
	case !w.running && w.done != nil && w.err == nil:
		// Wiped by another run, its entry dropped: the range may be
		// another lease's by now.
		a.mu.Unlock()
		return nil
	case w.running && !wait:
		a.mu.Unlock()
		return nil
	case w.running:
		done := w.done
		w.waiting++
		a.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
		}
		a.mu.Lock()
		w.waiting--
		err := w.err
		a.mu.Unlock()
		select {
		case <-done:
			return err
		default:
			return fmt.Errorf("agent: wipe of lease %s on %s: waiting for the wipe under way: %w", w.LeaseID, w.DeviceName, ctx.Err())
		}
	}
	w.running = true
	w.done = make(chan struct{})
	dev, ok := a.wipeDeviceLocked(w.wipeEntry)
	a.mu.Unlock()
	err := a.wipe(ctx, w, dev, ok)
	if err == nil {
		err = a.persistWipes(w)
	}
	if err != nil {
		a.mWipes.WithLabelValues("failed").Inc()
		err = fmt.Errorf("agent: wipe of lease %s on %s: %w", w.LeaseID, w.DeviceName, err)
	} else {
		a.mWipes.WithLabelValues("ok").Inc()
		a.log.Info("wiped", "lease", w.LeaseID, "device", w.DeviceName, "offset", w.Offset, "length", w.Length)
	}
	a.mu.Lock()
	w.running = false
	w.err = err
	close(w.done)
	a.mu.Unlock()
	return err
}

func (a *Agent) wipe(ctx context.Context, w *pendingWipe, dev DeviceConfig, ok bool) error {
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoDevice, w.DeviceName)
	}
	wp, ok := a.drivers[dev.Kind].(Wiper)
	if !ok {
		return fmt.Errorf("%w: %s cannot wipe", ErrNoDriver, dev.Kind)
	}
	e := Export{Request: api.PrepareRequest{LeaseID: w.LeaseID, Kind: dev.Kind, DeviceName: dev.Name,
		Offset: w.Offset, Length: w.Length}, Device: dev}
	if f := a.Faults.BeforeWipe.Load(); f != nil {
		(*f)(ctx, w.LeaseID)
	}
	if a.Faults.CrashMidWipe.Load() {
		e.Request.Length = (w.Length / 2) &^ 4095
		if err := wp.Wipe(ctx, e); err != nil {
			return err
		}
		return errCrashInjected
	}
	return wp.Wipe(ctx, e)
}

// wipingLocked lists the leases whose ranges are in the wipe journal, for
// the heartbeat (api.Heartbeat.Wiping); a.mu is held.
func (a *Agent) wipingLocked() []string {
	var out []string
	for _, w := range a.wipes {
		if !slices.Contains(out, w.LeaseID) {
			out = append(out, w.LeaseID)
		}
	}
	sort.Strings(out)
	return out
}

// retryWipes runs every pending wipe not under way, returning their errors.
func (a *Agent) retryWipes(ctx context.Context) error {
	a.mu.Lock()
	ws := append([]*pendingWipe(nil), a.wipes...)
	a.mu.Unlock()
	var errs []error
	for _, w := range ws {
		if err := a.runWipeOr(ctx, w, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// withoutWiped drops the persisted exports whose range is in the wipe
// journal: their teardown was under way when the previous run stopped.
func (a *Agent) withoutWiped(saved []persistedExport) []persistedExport {
	out := saved[:0:0]
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range saved {
		path := p.DevicePath
		if path == "" {
			path = a.devices[p.DeviceName].Path
		}
		if a.wipeOverlapPathLocked(p.PrepareRequest, path) {
			a.mRestored.WithLabelValues("dropped").Inc()
			a.log.Info("a restored export was being torn down; its range is wiped instead", "lease", p.LeaseID)
			continue
		}
		out = append(out, p)
	}
	return out
}

// reasonUnrestorable is why a lease is lost whose restored block export
// no longer validates (journalUnrestorable).
const reasonUnrestorable = "its lender's configuration changed under it across a restart (its block device removed, renamed or shrunk); the range was wiped"

// journalUnrestorable takes out of saved the block exports a restart
// cannot serve again because their device or range no longer validates
// (the device removed from the configuration, renamed, shrunk or given
// another kind, or its name given to another file: validateRestored) and
// journals a wipe of what is left of their range: the
// range still holds the tenant's bytes, and dropping the entry alone would
// lend them on. A device renamed since is found by the path recorded with
// the export; a range past a shrunk device's end is cut at the end (what
// lies beyond is lent by no one). An entry whose device cannot be found is
// journalled under its old name: kept in the file, refused, never wiped
// (see loadWipes). What of the range an export that does restore holds (a
// damaged file listing overlapping entries) is not wiped: that export's
// own teardown wipes it; an entry whose range overlaps an earlier one's on
// the same file is not restored either, and wiped likewise. Entries of
// other kinds are left to restoreExports, which drops those it cannot
// serve. Every entry taken out is reported lost (loseLocked).
func (a *Agent) journalUnrestorable(saved []persistedExport) ([]persistedExport, error) {
	out := saved[:0:0]
	var added bool
	type span struct {
		path, export string
		lo, hi       int64
	}
	var kept []span               // the block ranges of the entries that restore
	unserved := map[int]error{}   // entries that validate but are not served, and why
	restored := map[string]bool{} // the exports of kept
	dropped := map[string]bool{}  // the exports of block entries not restored
	for i, p := range saved {
		req, dev, err := a.validateRestored(p)
		if err == nil && dropped[p.Export] && !restored[p.Export] {
			// Listed again after an entry that could not be restored:
			// the lease is reported lost, and not served under this
			// one either.
			unserved[i] = fmt.Errorf("%w: listed again after an entry that could not be restored", ErrConflict)
			continue
		}
		if err != nil && p.Kind == api.KindBlock {
			dropped[p.Export] = true
		}
		if err != nil || dev.Kind != api.KindBlock || restored[p.Export] {
			// An export listed again is served under its entry in
			// kept (restoreExports drops this one): its range is no
			// restored lease's.
			continue
		}
		s := span{dev.Path, p.Export, req.Offset, req.Offset + req.Length}
		for _, k := range kept {
			if sameFile(k.path, s.path) && k.lo < s.hi && s.lo < k.hi {
				// A damaged file: the first entry of the range
				// restores, this one is not served.
				unserved[i] = fmt.Errorf("%w: the range overlaps another restored lease's", ErrOverlap)
			}
		}
		if unserved[i] != nil {
			dropped[p.Export] = true
		} else {
			kept = append(kept, s)
			restored[p.Export] = true
		}
	}
	for i, p := range saved {
		_, _, err := a.validateRestored(p)
		if unserved[i] != nil {
			err = unserved[i]
		}
		if err == nil || p.Kind != api.KindBlock {
			out = append(out, p)
			continue
		}
		w := wipeEntry{LeaseID: p.LeaseID, Kind: api.KindBlock, DeviceName: p.DeviceName, DevicePath: p.DevicePath, Offset: p.Offset, Length: p.Length}
		if dev, ok := a.blockDevice(p.DeviceName, p.DevicePath); ok {
			// What of the range lies inside the device (a damaged
			// entry's range may start before it, or overflow).
			w.DeviceName, w.DevicePath = dev.Name, dev.Path
			w.Offset, w.Length = 0, 0
			if lo := max(p.Offset, 0); p.Length >= 0 && lo < dev.Size {
				hi := dev.Size // Length 0: to the end; or past the int64s
				if p.Length > 0 && (p.Offset <= 0 || p.Length <= math.MaxInt64-p.Offset) {
					hi = min(p.Offset+p.Length, dev.Size)
				}
				w.Offset, w.Length = lo, max(0, hi-lo)
			}
		}
		a.mRestored.WithLabelValues("dropped").Inc()
		if !restored[p.Export] {
			// (An export served under another entry of it is not
			// lost: only this damaged entry's range is wiped.)
			a.mu.Lock()
			a.loseLocked(p, reasonUnrestorable)
			a.mu.Unlock()
		}
		if w.Length <= 0 {
			a.log.Warn("a restored export no longer validates and none of its range is lent; dropping it", "lease", p.LeaseID, "err", err)
			continue
		}
		a.log.Warn("a restored export no longer validates; its range is wiped instead", "lease", p.LeaseID,
			"device", w.DeviceName, "offset", w.Offset, "length", w.Length, "err", err)
		pieces := [][2]int64{{w.Offset, w.Offset + w.Length}}
		for _, k := range kept {
			if w.DevicePath != "" && sameFile(k.path, w.DevicePath) {
				pieces = cut(pieces, k.lo, k.hi)
			}
		}
		a.mu.Lock()
		for _, r := range pieces {
			x := w
			x.Offset, x.Length = r[0], r[1]-r[0]
			a.wipes = append(a.wipes, &pendingWipe{wipeEntry: x})
		}
		a.mPendingWipes.Set(float64(len(a.wipes)))
		a.mu.Unlock()
		added = added || len(pieces) > 0
	}
	if added {
		if err := a.saveWipes(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// blockDevice finds the block device whose file is at path (the one named
// name if several are) or, when path is "" (an entry persisted before
// paths were), the one named name. A device that took the name of the
// file's since is not it.
func (a *Agent) blockDevice(name, path string) (DeviceConfig, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.blockDeviceLocked(name, path)
}

// wipeDeviceLocked finds the device a journal entry's range is on: the
// block device whose file is the entry's, else (an entry without a path)
// the device of its name; a.mu is held. None when the file is no longer
// lent: the entry is kept, and wiped once a device is that file again.
func (a *Agent) wipeDeviceLocked(w wipeEntry) (DeviceConfig, bool) {
	if w.DevicePath == "" {
		d, ok := a.devices[w.DeviceName]
		return d, ok
	}
	return a.blockDeviceLocked(w.DeviceName, w.DevicePath)
}

// blockDeviceLocked is blockDevice with a.mu held.
func (a *Agent) blockDeviceLocked(name, path string) (DeviceConfig, bool) {
	if path == "" {
		d, ok := a.devices[name]
		return d, ok && d.Kind == api.KindBlock
	}
	var found DeviceConfig
	var ok bool
	for _, d := range a.devices {
		if d.Kind == api.KindBlock && sameFile(path, d.Path) && (!ok || d.Name == name) {
			found, ok = d, true
		}
	}
	return found, ok
}

// validateRestored is validate for a persisted export, which also refuses
// a block export whose device's name now names another file than the one
// it was prepared on (DevicePath): its tenant would read that file's
// bytes, and its own range would be lent on unwiped.
func (a *Agent) validateRestored(p persistedExport) (api.PrepareRequest, DeviceConfig, error) {
	req, dev, _, err := a.validate(p.PrepareRequest)
	if err == nil && dev.Kind == api.KindBlock && p.DevicePath != "" && !sameFile(p.DevicePath, dev.Path) {
		err = fmt.Errorf("%w: device %s is now %s, not %s", ErrNoDevice, dev.Name, dev.Path, p.DevicePath)
	}
	return req, dev, err
}

// sameFile reports whether the paths name the same file: the same path, or
// two that reach the same file (a link, a relative and an absolute path).
func sameFile(p, q string) bool {
	if filepath.Clean(p) == filepath.Clean(q) {
		return true
	}
	pi, err := os.Stat(p)
	if err != nil {
		return false
	}
	qi, err := os.Stat(q)
	return err == nil && os.SameFile(pi, qi)
}

// wipeLostExports journals a wipe of every block device in full and then
// sets the unreadable exports file aside (exports.json.unreadable-UNIXTIME,
// kept for inspection): Config.WipeLostExports. The wipes run before
// anything is served, like any the journal holds; the journal is written
// before the file is moved, so a crash in between leaves the agent refusing
// to start again (or wiping again with the option).
func (a *Agent) wipeLostExports() error {
	n, err := a.journalWholeDevices("(lost exports)", func(DeviceConfig) bool { return true })
	if err != nil {
		return err
	}
	// Before the file goes aside: the next join, whenever it comes, tells
	// the control plane that the leases it listed are lost.
	a.mu.Lock()
	a.id.LostExports = true
	a.mu.Unlock()
	if err := a.saveIdentity(); err != nil {
		return err
	}
	path := filepath.Join(a.cfg.StateDir, exportsFile)
	aside := fmt.Sprintf("%s.unreadable-%d", path, a.clock.Now().Unix())
	if err := os.Rename(path, aside); err != nil {
		return fmt.Errorf("agent: set the unreadable %s aside: %w", path, err)
	}
	a.log.Warn("the exports file was unreadable: every block device is wiped before anything is served, and the file set aside",
		"devices", n, "file", aside)
	return nil
}

// cut removes [lo, hi) from the ranges rs ([from, to) pairs).
func cut(rs [][2]int64, lo, hi int64) [][2]int64 {
	var out [][2]int64
	for _, r := range rs {
		if hi <= r[0] || r[1] <= lo {
			out = append(out, r)
			continue
		}
		if r[0] < lo {
			out = append(out, [2]int64{r[0], lo})
		}
		if hi < r[1] {
			out = append(out, [2]int64{hi, r[1]})
		}
	}
	return out
}
