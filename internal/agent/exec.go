package agent

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/httpx"
	"github.com/rialto-project/rialto/internal/pki"
	"github.com/rialto-project/rialto/internal/resource"
)

// Errors of Prepare.
var (
	// ErrConflict is returned when an export name is already used by another lease.
	ErrConflict = errors.New("agent: export already serves another lease")
	// ErrOverlap is returned when a range overlaps one that another export
	// still serves (for instance a lost lease not yet torn down) or that is
	// being wiped: the agent never lets two exports reach the same bytes.
	ErrOverlap = errors.New("agent: range in use")
	// ErrGaveUp is returned when the caller of a prepare gave up (its
	// context ended) before the export was ready: nobody takes the answer,
	// and the export, if it was prepared, is not served.
	ErrGaveUp = errors.New("agent: the caller gave up on the prepare")
)

// rangeBusyLocked reports whether req's range overlaps the range of
// another export on the same device (returning its lease), or a range
// whose wipe has not finished; a.mu is held.
//
// Another export of the same lease counts too: one left from an earlier
// placement of the lease (its teardown did not reach this agent before the
// lease was placed again) is torn down, and its range wiped, once a
// heartbeat answer no longer lists it. Had its range overlapped the new
// export's, that wipe would zero bytes the lease had written since.
func (a *Agent) rangeBusyLocked(req api.PrepareRequest) (other string, wiping bool) {
	for _, e := range a.exports {
		r := e.Request
		if r.DeviceName != req.DeviceName {
			continue
		}
		if r.Offset < req.Offset+req.Length && req.Offset < r.Offset+r.Length {
			return r.LeaseID, false
		}
	}
	return "", a.wipeOverlapLocked(req)
}

// validate checks req against the agent's devices and drivers and fills
// in its defaults (the kind, a zero length meaning the rest of the device).
func (a *Agent) validate(req api.PrepareRequest) (api.PrepareRequest, DeviceConfig, Driver, error) {
	if req.LeaseID == "" || req.Export == "" {
		return req, DeviceConfig{}, nil, fmt.Errorf("%w: lease_id and export are required", ErrBadRequest)
	}
	a.mu.Lock()
	dev, ok := a.devices[req.DeviceName]
	a.mu.Unlock()
	if !ok {
		return req, dev, nil, fmt.Errorf("%w: %q", ErrNoDevice, req.DeviceName)
	}
	if req.Kind == "" {
		req.Kind = dev.Kind
	}
	if req.Kind != dev.Kind {
		return req, dev, nil, fmt.Errorf("%w: device %s is %s, not %s", ErrNoDevice, dev.Name, dev.Kind, req.Kind)
	}
	size := dev.Size
	if dev.Kind == api.KindAccel {
		size *= api.SlotUnits // ranges count slot units (shares of a slot)
	}
	if req.Offset < 0 || req.Length < 0 || req.Offset > size || req.Length > size-req.Offset {
		return req, dev, nil, refuse(fmt.Sprintf("device %s has no room for the part (offset %d, length %d; the device has %d)", dev.Name, req.Offset, req.Length, size),
			fmt.Errorf("%w: offset %d length %d on %s of %d", ErrOutOfRange, req.Offset, req.Length, dev.Name, size))
	}
	if req.Length == 0 {
		req.Length = size - req.Offset
	}
	drv, ok := a.drivers[dev.Kind]
	if !ok {
		return req, dev, nil, fmt.Errorf("%w: %s", ErrNoDriver, dev.Kind)
	}
	return req, dev, drv, nil
}

// Prepare executes a prepare request: it checks the device and range,
// asks the kind's driver to serve the export and remembers it. Preparing
// an export again for the same lease and range returns the same answer
// (and serves it again if it was held or suspended: the control plane
// wants it); for another range it is refused (ErrOverlap).
//
// The lease's time left is counted from the earliest the request can
// have left the control plane (api.PrepareRequest.TimeoutSeconds before
// it arrived). An export with no time left after that is prepared but
// not served, as if its expiry had passed: a heartbeat answer that shows
// the lease has time left serves it. ctx is the caller's: a prepare whose
// caller gives up (the control plane's bound passed: it counts the
// prepare failed) is refused while it waits for the agent's other work,
// and once the export is ready it is kept not served, for the control
// plane's teardown or the next heartbeat answer to judge (ErrGaveUp).
func (a *Agent) Prepare(ctx context.Context, req api.PrepareRequest) (api.PrepareResponse, error) {
	req.ExpiresAt = requestExpiry(req.ExpiresAt, req.Now, a.clock.Now(), req.TimeoutSeconds)
	req.Now, req.TimeoutSeconds = time.Time{}, 0
	return a.prepare(ctx, req, false, "", false)
}

// prepare is Prepare. restoring is set when a held export is confirmed:
// prevURI is then the URI the control plane was given for it by a
// previous run (which the driver tries to serve it at again), and report
// says the heartbeats must report where it is served whatever that is.
func (a *Agent) prepare(ctx context.Context, req api.PrepareRequest, restoring bool, prevURI string, report bool) (api.PrepareResponse, error) {
	req, dev, drv, err := a.validate(req)
	if err != nil {
		return api.PrepareResponse{}, err
	}
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if err := ctx.Err(); err != nil && !restoring {
		a.mPrepares.WithLabelValues("error").Inc()
		return api.PrepareResponse{}, fmt.Errorf("%w: %s: %w", ErrGaveUp, req.LeaseID, err)
	}
	a.mu.Lock()
	endpoint, host := a.endpoints[req.Kind], a.host
	old, exists := a.exports[req.Export]
	var other string
	var wiping bool
	if !exists {
		other, wiping = a.rangeBusyLocked(req)
	}
	a.mu.Unlock()
	if exists && old.Request.LeaseID != req.LeaseID {
		return api.PrepareResponse{}, ErrConflict
	}
	if exists && !sameRange(old.Request, req) {
		// The part was placed again at another range here while the
		// teardown of its earlier placement did not reach this agent: the
		// driver would go on serving the old range under the name, which
		// the control plane has freed, and a teardown would wipe the new
		// one. The control plane places elsewhere; its teardown (or a
		// heartbeat answer) wipes the old range.
		a.log.Warn("refused a prepare naming an export served for another range", "lease", req.LeaseID, "device", dev.Name)
		return api.PrepareResponse{}, fmt.Errorf("%w: the part's export is served here for another range (an earlier placement of the lease)", ErrOverlap)
	}
	switch {
	case other != "":
		// The reason reaches the requesting tenant: the other lease's ID
		// stays in this agent's log.
		a.log.Warn("refused an overlapping range", "lease", req.LeaseID, "device", dev.Name, "served_for", other)
		if other == req.LeaseID {
			return api.PrepareResponse{}, fmt.Errorf("%w: the range overlaps an export this agent still serves from an earlier placement of the lease", ErrOverlap)
		}
		// (The control plane places around the range: api.RangeStillServed.)
		return api.PrepareResponse{}, fmt.Errorf("%w: the range overlaps one this agent %s", ErrOverlap, api.RangeStillServed)
	case wiping:
		a.log.Warn("refused a range whose wipe has not finished", "lease", req.LeaseID, "device", dev.Name)
		return api.PrepareResponse{}, refuse(wipingWords(dev.Name), fmt.Errorf("%w: the range is being wiped", ErrOverlap))
	}
	if exists {
		if req.ExpiresAt.IsZero() {
			req.ExpiresAt = old.Request.ExpiresAt
		}
		// The latest placement it was prepared for (a late prepare of an
		// earlier one does not make it a late teardown's).
		req.Placement = max(req.Placement, old.Request.Placement)
		if old.suspended && a.noTimeLeft(req) {
			// Stays suspended, with the new expiry.
			old.Request = req
			if err := a.storeLocked(old); err != nil {
				a.log.Warn("persisting exports", "err", err) // recorded before
			}
			a.mPrepares.WithLabelValues("held").Inc()
			a.log.Warn("prepared a lease with no time left; not serving it until a heartbeat answer shows time left", "lease", req.LeaseID, "device", dev.Name)
			return api.PrepareResponse{URI: old.servedURI()}, nil
		}
		if old.suspended {
			// Suspended by a Suspender: serve it again, same URI, until
			// the new expiry.
			old.Request = req
			old.syncDeadline()
			if err := drv.(Suspender).Resume(ctx, old); err != nil {
				a.mPrepares.WithLabelValues("error").Inc()
				return api.PrepareResponse{}, deviceRefusal("resume", req, dev.Name, err)
			}
			old.Request, old.suspended = req, false
			if err := a.storeLocked(old); err != nil {
				a.log.Warn("persisting exports", "err", err) // recorded before
			}
			a.mPrepares.WithLabelValues("ok").Inc()
			return api.PrepareResponse{URI: old.servedURI()}, nil
		}
	}
	e := Export{Request: req, Device: dev, Endpoint: endpoint, Host: host, URI: prevURI, deadline: old.deadline}
	if e.deadline == nil {
		e.deadline = clock.NewDeadline(a.clock)
	}
	e.syncDeadline() // before the driver serves a request
	if exists && !restoring {
		e.URI = old.URI // where the driver tries to serve it again
	}
	resp, err := drv.Prepare(ctx, e)
	if err != nil {
		a.mPrepares.WithLabelValues("error").Inc()
		return api.PrepareResponse{}, deviceRefusal("prepare", req, dev.Name, err)
	}
	switch {
	case !restoring || prevURI == "":
		// The control plane keeps this answer as the lease's URI (or,
		// for an export persisted without its URI, it is served
		// wherever the data plane is now).
		e.URI = resp.URI
	case resp.URI != prevURI || report:
		// A restored export served elsewhere keeps the URI the control
		// plane has until heartbeats have told it the new one (see
		// Heartbeat), so that a restart before then tries it again.
		e.Moved = resp.URI
	}
	// Not served after all: with no time left, or (a prepare) when the
	// caller gave up meanwhile. (The driver served it only under opMu,
	// before anyone had its answer.)
	gaveUp := !restoring && ctx.Err() != nil
	hold := gaveUp || a.noTimeLeft(req)
	if hold {
		stopped, err := a.stopServing(context.WithoutCancel(ctx), drv, e)
		if err != nil {
			// Still served: recorded as such, the known expiry stops it
			// (or the control plane's teardown, which an error brings).
			a.log.Warn("could not hold back an export prepared with no time left or whose caller gave up", "lease", req.LeaseID, "err", err)
			if err := a.storeLocked(e); err != nil {
				a.log.Warn("persisting exports", "err", err)
			}
			a.mPrepares.WithLabelValues("error").Inc()
			return api.PrepareResponse{}, deviceRefusal("prepare", req, dev.Name, fmt.Errorf("holding it back: %w", err))
		}
		e = stopped
	}
	if err := a.storeLocked(e); err != nil {
		if !exists {
			// Not recorded, a restart would forget the export, and with
			// it the wipe its teardown owes the range. Nobody has its
			// URI yet: it is undone.
			a.mu.Lock()
			delete(a.exports, req.Export)
			a.exportsChangedLocked()
			a.mu.Unlock()
			if terr := drv.Teardown(ctx, e); terr != nil {
				a.log.Warn("undoing an export that could not be recorded", "lease", req.LeaseID, "err", terr)
			}
			a.mPrepares.WithLabelValues("error").Inc()
			return api.PrepareResponse{}, deviceRefusal("prepare", req, dev.Name, err)
		}
		a.log.Warn("persisting exports", "err", err) // recorded before
	}
	if hold {
		a.mPrepares.WithLabelValues("held").Inc()
		if gaveUp {
			a.log.Warn("prepared an export whose caller gave up; not serving it (the control plane tears it down, or a heartbeat answer decides)",
				"lease", req.LeaseID, "device", dev.Name)
			return api.PrepareResponse{}, fmt.Errorf("%w: %s: %w", ErrGaveUp, req.LeaseID, ctx.Err())
		}
		a.log.Warn("prepared a lease with no time left; not serving it until a heartbeat answer shows time left", "lease", req.LeaseID, "device", dev.Name)
		return resp, nil
	}
	a.mPrepares.WithLabelValues("ok").Inc()
	a.log.Info("prepared", "lease", req.LeaseID, "device", dev.Name, "kind", dev.Kind,
		"offset", req.Offset, "length", req.Length, "export", resource.Fingerprint(req.Export))
	return resp, nil
}

// noTimeLeft reports whether req's known expiry has passed.
func (a *Agent) noTimeLeft(req api.PrepareRequest) bool {
	return !req.ExpiresAt.IsZero() && !a.clock.Now().Before(req.ExpiresAt)
}

// sameRange reports whether a and b name the same range of the same device.
func sameRange(a, b api.PrepareRequest) bool {
	return a.DeviceName == b.DeviceName && a.Offset == b.Offset && a.Length == b.Length
}

// servedURI is where the export is served now.
func (e Export) servedURI() string {
	if e.Moved != "" {
		return e.Moved
	}
	return e.URI
}

// storeLocked records e and persists the exports; opMu is held.
func (a *Agent) storeLocked(e Export) error {
	a.mu.Lock()
	a.prepares++
	e.prepared = a.prepares
	a.exports[e.Request.Export] = e
	a.exportsChangedLocked()
	a.mu.Unlock()
	return a.saveExportsLocked()
}

// exportsChangedLocked is called, a.mu held, after any change to
// a.exports (an export added, removed, stopped, served again, or its
// expiry changed): it updates the export gauges and, when the earliest
// known expiry of a served export is now earlier than the one the
// heartbeat loop planned for (or the loop is planning), wakes the loop to
// plan again (heartbeatLoop), and brings the bound of the calls to the
// control plane under way earlier (untilExpiryRound).
func (a *Agent) exportsChangedLocked() {
	var held, suspended float64
	for _, e := range a.exports {
		switch {
		case e.held:
			held++
		case e.suspended:
			suspended++
		}
	}
	for _, e := range a.exports {
		e.syncDeadline() // a renewal, a shortened lease
	}
	a.mExports.Set(float64(len(a.exports)))
	a.mWithheld.WithLabelValues("held").Set(held)
	a.mWithheld.WithLabelValues("suspended").Set(suspended)
	next, ok := a.nextExpiryLocked()
	if !a.loopPlanned || (ok && (a.loopExpiry.IsZero() || next.Before(a.loopExpiry))) {
		a.wakeLoop()
	}
	for b := range a.calls {
		a.boundCallLocked(b) // an earlier expiry bounds the calls under way
	}
}

// Teardown stops serving every export of a lease and wipes the block
// ranges they used (see [Wiper]). An unknown lease is not an error.
func (a *Agent) Teardown(ctx context.Context, leaseID string) error {
	return a.teardownLease(ctx, leaseID)
}

// TeardownPlacement is Teardown of the exports prepared for placement
// (api.TeardownRequest.Placement) or an earlier one of the lease, and of
// those whose placement is unknown; placement 0 is Teardown. The control
// plane asks for it before it places the lease again: arriving late, once
// the lease has been prepared here again, it leaves the new exports
// served and their ranges unwiped (an export prepared again keeps the
// latest placement), and it leaves the lease's transfers alone.
func (a *Agent) TeardownPlacement(ctx context.Context, leaseID string, placement int) error {
	if placement <= 0 {
		return a.teardownLease(ctx, leaseID)
	}
	wipes, err := a.retireExports(ctx, leaseID, func(e Export) bool {
		return !e.incoming && e.Request.Placement <= placement
	})
	return errors.Join(err, a.runWipes(ctx, a.withWipesUnderWay(leaseID, wipes)))
}

// teardownLease tears a lease's exports down. Each block range is entered
// in the wipe journal before its export stops, and wiped once no request
// of the lease can reach it any more; a wipe that fails stays in the
// journal (its range refused) and is retried with every heartbeat round.
// A call answers only once the lease's ranges are wiped: those of a
// teardown of the lease under way elsewhere (a heartbeat answer's, say,
// which retired the exports first) as well (withWipesUnderWay).
func (a *Agent) teardownLease(ctx context.Context, leaseID string) error {
	// A part of the lease moving to or from here is given up first.
	a.abortLeaseTransfers(ctx, leaseID, "the lease is being torn down", true)
	wipes, err := a.retireExports(ctx, leaseID, func(e Export) bool { return !e.incoming })
	return errors.Join(err, a.runWipes(ctx, a.withWipesUnderWay(leaseID, wipes)))
}

// withWipesUnderWay is own, the wipes a teardown of lease leaseID owes,
// with the lease's wipes another teardown owes or runs: journalled, their
// exports torn down, and not failed yet. runWipes waits for one under way
// and runs one not started yet (its owner's run then waits for this one):
// without them, a teardown call that came second found no export left and
// answered while the range still held the tenant's bytes. A wipe that
// failed is left to the heartbeats' retries, as before.
func (a *Agent) withWipesUnderWay(leaseID string, own []*pendingWipe) []*pendingWipe {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := own
	for _, w := range a.wipes {
		if w.LeaseID == leaseID && !w.live && (w.running || w.done == nil) && !slices.Contains(own, w) {
			out = append(out, w)
		}
	}
	return out
}

// teardownAnswered is teardownLease for a heartbeat answer, which judges
// only the exports prepared before its heartbeat left (mark): one the
// control plane asked for since (the lease placed here again) is left to
// the next answer.
func (a *Agent) teardownAnswered(ctx context.Context, leaseID string, mark uint64) error {
	a.abortLeaseTransfers(ctx, leaseID, "the lease is being torn down", true)
	return a.teardownExports(ctx, leaseID, func(e Export) bool { return !e.incoming && e.prepared <= mark })
}

// teardownExports tears down the exports of lease leaseID that pick
// selects (teardownLease's work) and wipes their ranges.
func (a *Agent) teardownExports(ctx context.Context, leaseID string, pick func(Export) bool) error {
	wipes, err := a.retireExports(ctx, leaseID, pick)
	return errors.Join(err, a.runWipes(ctx, wipes))
}

// retireExports tears down the exports of lease leaseID that pick selects,
// each range journalled (durably, refused to every prepare) before its
// export stops, and returns the wipes it owes: teardownExports runs them,
// a moved part's commit leaves them to its caller (commitOut). An
// export whose wipe cannot be journalled is kept (served), with an error.
func (a *Agent) retireExports(ctx context.Context, leaseID string, pick func(Export) bool) ([]*pendingWipe, error) {
	a.opMu.Lock()
	a.mu.Lock()
	var victims []Export
	for _, e := range a.exports {
		if e.Request.LeaseID == leaseID && pick(e) {
			victims = append(victims, e)
		}
	}
	a.mu.Unlock()
	if len(victims) == 0 {
		a.opMu.Unlock()
		return nil, nil
	}
	var errs []error
	var wipes []*pendingWipe
	for _, e := range victims {
		var w *pendingWipe
		if a.needsWipe(e) {
			// Entered live (no wipe retry takes it) until its export
			// is torn down: a wipe under a served export could end
			// before the tenant's last write, and drop the entry of a
			// range that holds it.
			var err error
			if w, err = a.journalWipe(e, true); err != nil {
				// Not journalled: a crash before the wipe finished would
				// leave the range with the tenant's bytes, named by
				// neither file, to the next lease. The export stays
				// (served) until a teardown that can journal its wipe:
				// the control plane asks again (heartbeats).
				a.forgetWipe(w)
				errs = append(errs, err)
				continue
			}
		}
		if drv, ok := a.drivers[e.Device.Kind]; ok && !e.held {
			if err := drv.Teardown(ctx, e); err != nil {
				errs = append(errs, err)
				if w != nil {
					// Still served: no wipe under a live export. The
					// control plane asks again (heartbeats).
					if err := a.persistWipes(w); err != nil {
						errs = append(errs, err)
					}
				}
				continue
			}
		}
		if e.held {
			a.mRestored.WithLabelValues("dropped").Inc()
		}
		a.mu.Lock()
		delete(a.exports, e.Request.Export)
		a.exportsChangedLocked()
		if w != nil {
			w.live = false // no request of the lease reaches the range
		}
		a.mu.Unlock()
		if w != nil {
			wipes = append(wipes, w)
		}
	}
	if err := a.saveExportsLocked(); err != nil {
		errs = append(errs, err)
	}
	a.opMu.Unlock()
	a.log.Info("torn down", "lease", leaseID, "exports", len(victims))
	return wipes, errors.Join(errs...)
}

// saveExportsLocked persists the exports; opMu must be held.
func (a *Agent) saveExportsLocked() error {
	a.mu.Lock()
	out := sortedExports(a.exports, a.lost)
	a.mu.Unlock()
	return writeJSON(filepath.Join(a.cfg.StateDir, exportsFile), out)
}

// restoreExports takes back the exports persisted by a previous run, held:
// the driver serves none of them until the control plane confirms its
// lease is still reserved or active (see confirmHeld), so that a lease the
// control plane declared lost while the agent was away is never served
// again, not even for a first request, and not while the control plane
// is unreachable. Entries Prepare would refuse are dropped: those whose
// device changed under them were wiped already (journalUnrestorable), as
// were those whose teardown was under way (withoutWiped).
func (a *Agent) restoreExports(_ context.Context, saved []persistedExport) {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	for _, p := range saved {
		req, dev, err := a.validateRestored(p)
		a.mu.Lock()
		if _, lost := a.lost[p.Export]; lost {
			// Reported lost under another entry of it (a damaged
			// file): never served as well.
			a.mu.Unlock()
			a.mRestored.WithLabelValues("dropped").Inc()
			a.log.Warn("a restored export is listed again after an entry reported lost; dropping it", "lease", p.LeaseID)
			continue
		}
		if err == nil {
			if _, dup := a.exports[req.Export]; dup {
				err = fmt.Errorf("%w: export listed twice", ErrConflict)
			} else if other, wiping := a.rangeBusyLocked(req); other != "" {
				err = fmt.Errorf("%w: the range overlaps another restored lease's", ErrOverlap)
			} else if wiping {
				a.mu.Unlock()
				a.mRestored.WithLabelValues("dropped").Inc()
				a.log.Info("a restored export was being torn down; its range is wiped instead", "lease", p.LeaseID)
				continue
			}
		}
		if err != nil {
			a.mRestored.WithLabelValues("failed").Inc()
			if errors.Is(err, ErrConflict) {
				// An entry listed twice is served under its first.
				a.mu.Unlock()
				a.log.Warn("an export is listed twice; dropping the second entry", "lease", p.LeaseID, "err", err)
				continue
			}
			// Not served again: its lease is lost.
			a.loseLocked(p, "its lender could not restore its export after a restart: "+err.Error())
			a.mu.Unlock()
			a.log.Warn("restoring an export failed; dropping it, and the control plane is told its lease is lost", "lease", p.LeaseID, "err", err)
			continue
		}
		a.exports[req.Export] = Export{Request: req, Device: dev, Endpoint: a.endpoints[dev.Kind], Host: a.host,
			URI: p.URI, Moved: p.Moved, held: true}
		a.exportsChangedLocked()
		a.mu.Unlock()
	}
	if err := a.saveExportsLocked(); err != nil {
		a.log.Warn("persisting exports", "err", err)
	}
}

// confirmHeld serves a held export the control plane confirmed, at the
// address it was served at when that can be bound again.
//
// An export that comes back at another address (its port taken by another
// process, a changed data port or advertised host) is served there; the
// agent warns, naming the lease and both addresses, counts it in
// rialto_agent_restored_exports_total{result="new_address"}, and reports
// the new URI in its heartbeats until the control plane has recorded it as
// the lease's (borrowers then get it from the lease). Until then the state
// file keeps the old URI, so a restart tries that address again. Entries
// persisted without a URI (state files of agents that did not keep them)
// are served wherever the data planes are now. One that cannot be served
// stays held, and is tried again at the next confirmation.
func (a *Agent) confirmHeld(ctx context.Context, e Export) {
	a.reserved.release(append(uriPorts(e.URI), uriPorts(e.Moved)...)...)
	resp, err := a.prepare(ctx, e.Request, true, e.URI, e.Moved != "")
	switch {
	case err != nil:
		a.mRestored.WithLabelValues("failed").Inc()
		a.log.Warn("serving a restored export failed; it stays held", "lease", e.Request.LeaseID, "err", err)
	case e.URI == "":
		a.mRestored.WithLabelValues("unknown_address").Inc()
	case resp.URI == e.URI:
		a.mRestored.WithLabelValues("same_address").Inc()
	default:
		a.mRestored.WithLabelValues("new_address").Inc()
		a.log.Warn("restored export is served at a new address; the next heartbeat reports it to the control plane, and borrowers must fetch the lease again to reach it",
			"lease", e.Request.LeaseID, "kind", e.Request.Kind, "old", uriAddress(e.URI), "new", uriAddress(resp.URI))
	}
}

// Handler is the agent's HTTP API: POST /agent/v1/prepare and
// /agent/v1/teardown (bearer agent key), GET /agent/v1/status (bearer
// agent key), the transfers of moving parts under /agent/v1/transfers
// (bearer agent key; transfer.go), POST /agent/v1/role-config (bearer
// agent key: an accelerator export's role, for a re-placement), GET
// /agent/v1/ping (open, for RTT
// probes) and GET /metrics.
// An enrolled agent (Config.CAFile) serves it over TLS and takes the
// bearer-key routes only from the control plane's certificate. Every
// request presenting a client certificate is checked against the
// revocation list and the CA certificates held then (checkPeer).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /agent/v1/ping", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /agent/v1/prepare", a.auth(a.handlePrepare))
	mux.HandleFunc("POST /agent/v1/teardown", a.auth(a.handleTeardown))
	mux.HandleFunc("GET /agent/v1/status", a.auth(func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"id": a.NodeID(), "state": "ready", "leases": a.Leases()})
	}))
	a.transferRoutes(mux)
	a.roleConfigRoute(mux)
	return a.checkPeer(mux)
}

// checkPeer refuses a request whose connection presented a client
// certificate that the revocation list held now revokes, or whose CA the
// CA certificates held now no longer hold (dropped since: `rialto ca
// drop-old`), with 401 and the connection closed (HTTP/2: a GOAWAY). The
// handshake checked it against the list and the CA certificates of then;
// a keep-alive connection opened before the revocation (the control
// plane's, a peer's) would carry requests until it closed. This is the
// check the control plane makes on every node call (its
// checkPeerRevoked): a lookup by serial number.
func (a *Agent) checkPeer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.tls == nil || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			h.ServeHTTP(w, r)
			return
		}
		err := a.tls.crl.CheckConn(*r.TLS)
		if err == nil {
			h.ServeHTTP(w, r)
			return
		}
		leaf := r.TLS.PeerCertificates[0]
		state, why := "revoked", "a revocation list the agent took since this connection's handshake names it"
		if errors.Is(err, pki.ErrUntrusted) {
			state, why = "no longer trusted", fmt.Sprintf("its CA (%q) was dropped since this connection's handshake", leaf.Issuer.CommonName)
		}
		a.log.Warn("refused a request: the connection's client certificate is "+state+"; the connection is closed",
			"peer", r.RemoteAddr, "path", r.URL.Path, "serial", leaf.SerialNumber.Text(16), "subject", leaf.Subject.CommonName, "err", err)
		w.Header().Set("Connection", "close")
		httpx.WriteError(w, http.StatusUnauthorized, api.CodeUnauthorized,
			fmt.Sprintf("the client certificate %q (serial %s) is %s: %s", leaf.Subject.CommonName, leaf.SerialNumber.Text(16), state, why))
	})
}

// joinWait bounds how long a control-plane call waits for the agent to
// take the answer of its join.
const joinWait = 10 * time.Second

func (a *Agent) auth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := a.requireCP(r); err != nil {
			httpx.WriteError(w, http.StatusForbidden, api.CodeForbidden, "the control plane's certificate was not accepted: "+err.Error())
			return
		}
		a.mu.Lock()
		key, lost := a.id.AgentKey, a.id.LostExports
		a.mu.Unlock()
		if lost || key == "" {
			// The control plane may call as soon as it has answered the
			// join, before this agent has taken the answer: wait for it
			// (briefly: a call from a control plane this agent never
			// joined gets an error below). Until the join that tells the
			// control plane the node's leases are lost (a lost state
			// directory, --wipe-lost-exports) is answered, a lease
			// prepared here, with the last run's key, would be lost by
			// it; lost is set only before this process's first join.
			ctx, cancel := context.WithTimeout(r.Context(), joinWait)
			select {
			case <-a.joined:
			case <-ctx.Done():
			}
			cancel()
			a.mu.Lock()
			key, lost = a.id.AgentKey, a.id.LostExports
			a.mu.Unlock()
		}
		if lost {
			httpx.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "agent has not yet told the control plane that it lost its exports; it takes lease calls after its join")
			return
		}
		if key == "" {
			httpx.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "agent has not joined a control plane yet")
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || got == "" {
			httpx.WriteError(w, http.StatusUnauthorized, api.CodeUnauthorized, "the call carried no agent key")
			return
		}
		if subtle.ConstantTimeCompare([]byte(got), []byte(key)) != 1 {
			httpx.WriteError(w, http.StatusUnauthorized, api.CodeUnauthorized, "the control plane's agent key is not the one this lender was given at its last join")
			return
		}
		h(w, r)
	}
}

func (a *Agent) handlePrepare(w http.ResponseWriter, r *http.Request) {
	if a.Faults.IgnorePrepare.Load() {
		a.mPrepares.WithLabelValues("ignored").Inc()
		<-r.Context().Done()
		return
	}
	if a.Faults.RefusePrepare.Load() {
		a.mPrepares.WithLabelValues("refused").Inc()
		httpx.WriteError(w, http.StatusServiceUnavailable, api.CodeUnavailable, ErrRefused.Error()+" (fault injected)")
		return
	}
	var req api.PrepareRequest
	if err := httpx.DecodeJSONTolerant(w, r, maxBody, &req); err != nil {
		httpx.WriteError(w, http.StatusBadRequest, api.CodeInvalid, "bad prepare request: "+err.Error())
		return
	}
	resp, err := a.Prepare(r.Context(), req)
	if err != nil {
		a.answerError(w, r, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, resp)
}

// maxBody bounds the agent API's request bodies.
const maxBody = 1 << 20

// errorMap maps the agent API's errors to statuses and codes (anything
// else is 500 internal).
var errorMap = httpx.ErrorMap{
	{Err: ErrBadRequest, Status: http.StatusBadRequest, Code: api.CodeInvalid},
	{Err: ErrOutOfRange, Status: http.StatusBadRequest, Code: api.CodeInvalid},
	{Err: ErrCannotMove, Status: http.StatusBadRequest, Code: api.CodeInvalid},
	{Err: ErrNoDevice, Status: http.StatusNotFound, Code: api.CodeNotFound},
	{Err: ErrNoTransfer, Status: http.StatusNotFound, Code: api.CodeNotFound},
	{Err: ErrConflict, Status: http.StatusConflict, Code: api.CodeConflict},
	{Err: ErrOverlap, Status: http.StatusConflict, Code: api.CodeConflict},
	{Err: ErrTransferState, Status: http.StatusConflict, Code: api.CodeConflict},
	{Err: ErrNoDriver, Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable},
	{Err: ErrGaveUp, Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable},
}

func (a *Agent) handleTeardown(w http.ResponseWriter, r *http.Request) {
	var req api.TeardownRequest
	if err := httpx.DecodeJSONTolerant(w, r, maxBody, &req); err != nil || req.LeaseID == "" {
		httpx.WriteError(w, http.StatusBadRequest, api.CodeInvalid, "bad teardown request: lease_id is required")
		return
	}
	if err := a.TeardownPlacement(r.Context(), req.LeaseID, req.Placement); err != nil {
		a.answerError(w, r, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]string{"id": req.LeaseID, "state": "released"})
}

// uriAddress is a data-plane URI without its path, which holds the export
// name (a secret): what may be logged.
func uriAddress(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return "(unparsable URI)"
	}
	u.User, u.Path, u.RawPath, u.Fragment = nil, "", "", ""
	return u.String()
}
