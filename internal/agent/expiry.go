package agent

import (
	"context"
	"time"

	"github.com/rialto-project/rialto/api"
)

// Fail closed. The agent serves an export only while the control plane
// vouches for its lease:
//
//   - An export restored after a restart is held (the driver does not
//     serve it) until a heartbeat answer lists its lease as still reserved
//     or active (api.HeartbeatResponse.Leases); a lease the answer says to
//     tear down is torn down and its range wiped without ever being served.
//   - Each export knows its lease's expiry (api.PrepareRequest.ExpiresAt,
//     then every heartbeat answer), as the time left by the control
//     plane's clock (ExpiresAt - Now) counted on the agent's own clock
//     from when the request arrived or the heartbeat left: the clocks need
//     not agree, and a slow answer only makes the agent stop earlier.
//     When it passes,
//     without an answer showing a renewal, the agent stops serving the
//     export: a Suspender driver keeps its data (block ranges stay as they
//     are) and a sealed move of it as it is (its writes stay held until
//     the commit), other drivers tear it down. An answer that shows the lease
//     renewed serves it again. While the control plane is unreachable an
//     export whose expiry the agent does not know is not served.
//   - Nothing is wiped because the control plane is unreachable: only a
//     teardown the control plane asks for wipes.

// localExpiry is the control plane's expiry exp, stamped cpNow by the
// control plane's clock, on the agent's clock counted from since: the time
// left is measured, not the clocks compared. Without cpNow (an older
// control plane), exp is taken as it is.
func localExpiry(exp, cpNow, since time.Time) time.Time {
	if exp.IsZero() || cpNow.IsZero() {
		return exp
	}
	return since.Add(exp.Sub(cpNow))
}

// reconcile applies a heartbeat answer's leases: their expiries (cpNow is
// the control plane's clock in the answer, sent the agent's clock when
// the heartbeat left), and the confirmation of held or suspended exports
// whose lease has not expired. Expiries are kept in memory only: a restart
// holds every export until the next answer brings them again. Only
// exports prepared before the heartbeat left (Export.prepared ≤ mark)
// are dropped for a range the answer does not list.
func (a *Agent) reconcile(ctx context.Context, leases []api.LeaseExpiry, cpNow, sent time.Time, mark uint64) {
	if len(leases) == 0 {
		return
	}
	wanted := make(map[string]time.Time, len(leases))
	ranges := map[string]map[api.PartRef]bool{} // lease → the ranges wanted here (absent: all)
	for _, l := range leases {
		wanted[l.ID] = localExpiry(l.ExpiresAt, cpNow, sent)
		if l.Parts != nil {
			set := make(map[api.PartRef]bool, len(l.Parts))
			for _, p := range l.Parts {
				set[p] = true
			}
			ranges[l.ID] = set
		}
	}
	now := a.clock.Now()
	a.opMu.Lock()
	a.mu.Lock()
	var resume, confirm []Export
	unwanted := map[string][]string{} // lease → export names
	for name, e := range a.exports {
		exp, ok := wanted[e.Request.LeaseID]
		if !ok {
			continue
		}
		if set, ok := ranges[e.Request.LeaseID]; ok && !e.incoming && e.prepared <= mark && !set[partRef(e.Request)] {
			// A part that moved away or was lost, or a stale copy
			// restored after a restart: never served again. (One
			// prepared after the heartbeat left may be a placement the
			// answer did not know of yet.)
			unwanted[e.Request.LeaseID] = append(unwanted[e.Request.LeaseID], name)
			continue
		}
		if !exp.IsZero() {
			e.Request.ExpiresAt = exp
			a.exports[name] = e
		}
		if !e.Request.ExpiresAt.IsZero() && !now.Before(e.Request.ExpiresAt) {
			continue
		}
		switch {
		case e.held:
			confirm = append(confirm, e)
		case e.suspended:
			resume = append(resume, e)
		}
	}
	a.mu.Unlock()
	for _, e := range resume {
		if err := a.drivers[e.Device.Kind].(Suspender).Resume(ctx, e); err != nil {
			a.log.Warn("serving a renewed lease again failed", "lease", e.Request.LeaseID, "err", err)
			continue
		}
		a.mu.Lock()
		if cur, ok := a.exports[e.Request.Export]; ok {
			cur.suspended = false
			a.exports[e.Request.Export] = cur
			a.countExportsLocked()
		}
		a.mu.Unlock()
		a.log.Info("lease renewed; serving it again", "lease", e.Request.LeaseID)
	}
	a.opMu.Unlock()
	for _, e := range confirm {
		a.confirmHeld(ctx, e)
	}
	for id, names := range unwanted {
		if err := a.dropExports(ctx, id, names); err != nil {
			a.log.Warn("tearing down exports the control plane no longer wants", "lease", id, "err", err)
		}
	}
}

// partRef is the range an export serves.
func partRef(r api.PrepareRequest) api.PartRef {
	return api.PartRef{DeviceID: r.DeviceID, Offset: r.Offset, Length: r.Length}
}

// dropExports tears down (and wipes) the exports names of lease leaseID
// that the control plane no longer wants while it keeps the lease's other
// parts here. A move of one of them that is sealed is committed (the lease
// already points at its destination); any other transfer of it is given
// up first.
func (a *Agent) dropExports(ctx context.Context, leaseID string, names []string) error {
	drop := make(map[string]bool, len(names))
	for _, n := range names {
		drop[n] = true
	}
	for _, t := range a.xfers.list() {
		st := t.status()
		if t.role != "out" || st.LeaseID != leaseID || st.Done() || !drop[t.e.Request.Export] {
			continue
		}
		var err error
		if st.State == api.TransferSealed {
			err = a.commitOut(ctx, t)
		} else {
			err = a.abortTransfer(ctx, t, "the control plane no longer wants the part here")
		}
		if err != nil {
			a.log.Warn("ending the transfer of a part no longer wanted", "transfer", t.id, "err", err)
		}
	}
	a.log.Warn("tearing down exports of a lease whose parts here the control plane no longer lists (moved away or lost)",
		"lease", leaseID, "exports", len(names))
	return a.teardownExports(ctx, leaseID, func(e Export) bool { return drop[e.Request.Export] && !e.incoming })
}

// enforceExpiry stops serving the exports whose lease's known expiry has
// passed; with reachable false (no answer from the control plane) also
// those whose expiry the agent does not know.
func (a *Agent) enforceExpiry(ctx context.Context, reachable bool) {
	now := a.clock.Now()
	isDue := func(e Export) bool {
		exp := e.Request.ExpiresAt
		return e.serving() && ((exp.IsZero() && !reachable) || (!exp.IsZero() && !now.Before(exp)))
	}
	// A part moving from here stops moving first.
	a.mu.Lock()
	stopping := map[string]bool{}
	for _, e := range a.exports {
		if isDue(e) {
			stopping[e.Request.LeaseID] = true
		}
	}
	a.mu.Unlock()
	for id := range stopping {
		a.abortLeaseTransfers(ctx, id, "the lease's known expiry passed", false)
	}
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	var due []Export
	for _, e := range a.exports {
		if isDue(e) {
			due = append(due, e)
		}
	}
	a.mu.Unlock()
	for _, e := range due {
		drv := a.drivers[e.Device.Kind]
		var err error
		if s, ok := drv.(Suspender); ok {
			if err = s.Suspend(ctx, e); err == nil {
				e.suspended = true
			}
		} else if err = drv.Teardown(ctx, e); err == nil {
			e.held = true
		}
		if err != nil {
			a.log.Warn("stopping an expired lease's export failed", "lease", e.Request.LeaseID, "err", err)
			continue
		}
		a.mu.Lock()
		if _, ok := a.exports[e.Request.Export]; ok {
			a.exports[e.Request.Export] = e
			a.countExportsLocked()
		}
		a.mu.Unlock()
		a.mSuspends.WithLabelValues(string(e.Device.Kind)).Inc()
		a.log.Warn("stopped serving a lease whose expiry passed without a renewal the control plane confirmed",
			"lease", e.Request.LeaseID, "kind", e.Device.Kind, "expired", !e.Request.ExpiresAt.IsZero(), "control_plane_reachable", reachable)
	}
}

// nextExpiry is the earliest known expiry of a served export.
func (a *Agent) nextExpiry() (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var next time.Time
	for _, e := range a.exports {
		if exp := e.Request.ExpiresAt; e.serving() && !exp.IsZero() && (next.IsZero() || exp.Before(next)) {
			next = exp
		}
	}
	return next, !next.IsZero()
}
