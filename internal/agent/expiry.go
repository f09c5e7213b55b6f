package agent

import (
	"context"
	"errors"
	"math"
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
//     or for a part moved here its TransferIn's, then its commit's:
//     api.TransferCommitRequest; then every heartbeat answer), as the
//     time left by the control plane's clock (ExpiresAt - Now) counted on
//     the agent's own clock from a moment no later than the control
//     plane's Now: for a heartbeat answer, when the heartbeat left; for a
//     prepare (or a move's TransferIn or commit), the most time the
//     request may have been on its way (api.PrepareRequest.TimeoutSeconds,
//     the control plane's bound on the call, after which it counts the
//     call failed) before it arrived. The
//     clocks need not agree, and a slow answer or a request delayed within
//     its bound only makes the agent stop earlier: the expiry the agent
//     knows is never later than the one the control plane sent. (A
//     control plane that predates TimeoutSeconds sends none: the time
//     left of a prepare then counts from its arrival, later by the delay
//     on its way. A prepare arriving after its bound, which the control
//     plane counts failed, see below.) When it passes,
//     without an answer showing a renewal, the agent stops serving the
//     export: a Suspender driver keeps its data (block ranges stay as they
//     are) and a sealed move of it as it is (its writes stay held until
//     the commit), other drivers tear it down. An answer that shows the lease
//     renewed serves it again. While the control plane is unreachable an
//     export whose expiry the agent does not know is not served.
//   - The heartbeat loop (heartbeatLoop) does this on time, whether a
//     heartbeat round or a join is under way or not: it stops serving an
//     export when its known expiry passes (the loop's timer on the
//     agent's clock fires; the stop waits only for the agent's other work
//     on exports under way, such as a prepare, a teardown or another
//     stop, and for a move of the lease from here to end; a stop that
//     fails is tried again every 50 ms). That stop can come late (the
//     work it waits for, a loaded machine): the data plane itself refuses
//     every request of the export from its known expiry on, whether the
//     stop has happened or not (Export.deadline, which the drivers pass
//     to their data planes: the block driver's NBD exports check it as
//     each request arrives and as a worker takes it up; the memory
//     driver's donor as each READ or WRITE arrives; the accel driver's
//     slots on each memory access, task and block move, and its gateways
//     as a shared lease's call arrives and as a worker takes up its
//     batch; the NIC driver's lender as it forwards each packet, either
//     way, dropping it and ending the borrower's session, and at each
//     HELLO). So that a renewal reaches the agent before then, the loop
//     asks the control plane (a heartbeat round)
//     expiryAskAhead before the earliest known expiry of a served export,
//     unless a round began since then; after stopping an export it asks
//     again, and an answer that shows the lease renewed serves it again.
//     A prepare (or anything else) that brings the earliest known expiry
//     before the one the loop waits for wakes it (exportsChangedLocked).
//     A round or join under way is given up expiryRoundTimeout after that
//     expiry (untilExpiryRound), so that the agent asks again.
//   - A prepare with no time left (after that deduction) is prepared, its
//     URI answered, but not served, as if its expiry had passed: an answer
//     that shows the lease has time left (renewed, or the request spent
//     less than its bound on its way) serves it. So is a part moved here
//     whose commit leaves it no time left (activate): the driver makes it
//     the lease's export suspended, serving no request. A prepare whose caller gave
//     up (the control plane's bound passed: it counts the prepare failed
//     and tears down) is refused, or, if the export is ready by then, kept
//     not served for the control plane's teardown or the next answer. A
//     prepare that arrives after its bound while the agent cannot tell
//     (the caller's hang-up has not reached it) is served until that
//     teardown or the first answer after it, and at most until the expiry
//     it counted, which can be later than the lease's by the delay beyond
//     the bound.
//   - Renewals reach the agent only in heartbeat answers. An answer judges
//     only the exports prepared before its heartbeat left (it may have
//     been computed before a later prepare was sent): it does not change
//     the expiry of a later one, serve it, or drop it.
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

// requestExpiry is localExpiry for a request of the control plane that
// arrived at arrived and was sent at most timeoutSeconds before
// (api.PrepareRequest.TimeoutSeconds): the time left is counted from the
// earliest the request can have left.
func requestExpiry(exp, cpNow, arrived time.Time, timeoutSeconds float64) time.Time {
	return localExpiry(exp, cpNow, arrived.Add(-inFlight(timeoutSeconds)))
}

// inFlight is a request's TimeoutSeconds as a duration: 0 for none (or
// a value that is not positive), at most about 292 years.
func inFlight(seconds float64) time.Duration {
	switch {
	case !(seconds > 0):
		return 0
	case seconds >= float64(math.MaxInt64/int64(time.Second)):
		return math.MaxInt64
	}
	return time.Duration(seconds * float64(time.Second))
}

// stopServing has the driver stop serving e, as when its lease's known
// expiry passes: a Suspender keeps its data (suspended), other drivers
// tear it down (held). The caller holds opMu and records the result.
func (a *Agent) stopServing(ctx context.Context, drv Driver, e Export) (Export, error) {
	if s, ok := drv.(Suspender); ok {
		if err := s.Suspend(ctx, e); err != nil {
			return e, err
		}
		e.suspended = true
		return e, nil
	}
	if err := drv.Teardown(ctx, e); err != nil {
		return e, err
	}
	e.held = true
	return e, nil
}

// reconcile applies a heartbeat answer's leases: their expiries (cpNow is
// the control plane's clock in the answer, sent the agent's clock when
// the heartbeat left), and the confirmation of held or suspended exports
// whose lease has not expired; an export whose range the answer lists in
// its lease's Doubt is left as it is (api.LeaseExpiry.Doubt). Expiries
// are kept in memory only: a restart holds every export until the next
// answer brings them again. The answer
// judges only the exports prepared before the heartbeat left
// (Export.prepared ≤ mark): it may have been computed before a later
// prepare was sent, so it neither drops such an export for a range it does
// not list, nor changes its expiry (the prepare's is newer), nor serves it
// (one prepared with no time left, or whose caller gave up); the next
// answer does.
func (a *Agent) reconcile(ctx context.Context, leases []api.LeaseExpiry, cpNow, sent time.Time, mark uint64) {
	if len(leases) == 0 {
		return
	}
	wanted := make(map[string]time.Time, len(leases))
	ranges := map[string]map[api.PartRef]bool{} // lease → the ranges wanted here (absent: all)
	doubt := map[string]map[api.PartRef]bool{}  // lease → the ranges to leave as they are
	for _, l := range leases {
		wanted[l.ID] = localExpiry(l.ExpiresAt, cpNow, sent)
		if l.Parts != nil {
			set := make(map[api.PartRef]bool, len(l.Parts))
			for _, p := range l.Parts {
				set[p] = true
			}
			ranges[l.ID] = set
		}
		for _, p := range l.Doubt {
			if doubt[l.ID] == nil {
				doubt[l.ID] = map[api.PartRef]bool{}
			}
			doubt[l.ID][p] = true
		}
	}
	a.opMu.Lock()
	a.mu.Lock()
	now := a.clock.Now() // after the locks: a renewal already past is not served
	var resume, confirm []Export
	unwanted := map[string][]string{} // lease → export names
	changed := false
	for name, e := range a.exports {
		exp, ok := wanted[e.Request.LeaseID]
		if !ok || e.prepared > mark {
			// Not listed, or prepared after the heartbeat left (a
			// placement the answer may not know of yet).
			continue
		}
		if doubt[e.Request.LeaseID][partRef(e.Request)] && !ranges[e.Request.LeaseID][partRef(e.Request)] {
			// The control plane does not place it here, and may adopt
			// it (its database restored from an older backup): left as
			// it is until an answer says.
			continue
		}
		if set, ok := ranges[e.Request.LeaseID]; ok && !e.incoming && !set[partRef(e.Request)] {
			// A part that moved away or was lost, or a stale copy
			// restored after a restart: never served again.
			unwanted[e.Request.LeaseID] = append(unwanted[e.Request.LeaseID], name)
			continue
		}
		if !exp.IsZero() && !exp.Equal(e.Request.ExpiresAt) {
			e.Request.ExpiresAt = exp
			a.exports[name] = e
			changed = true
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
	if changed {
		a.exportsChangedLocked() // a renewal that shortens a lease
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
			a.exportsChangedLocked()
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
		err := a.abortTransfer(ctx, t, "the control plane no longer wants the part here", true)
		if errors.Is(err, errSealed) {
			var wipes []*pendingWipe
			if wipes, err = a.commitOut(ctx, t); err == nil {
				err = a.runWipes(ctx, wipes)
			}
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
// passed; with keepUnknown false (a call to the control plane just went
// unanswered) also those whose expiry the agent does not know. It returns
// how many it stopped. Calls are serialized: one that stops an export has
// done so when another returns.
func (a *Agent) enforceExpiry(ctx context.Context, keepUnknown bool) int {
	a.enforceMu.Lock()
	defer a.enforceMu.Unlock()
	now := a.clock.Now()
	isDue := func(e Export) bool {
		exp := e.Request.ExpiresAt
		return e.serving() && ((exp.IsZero() && !keepUnknown) || (!exp.IsZero() && !now.Before(exp)))
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
	if len(stopping) == 0 {
		return 0
	}
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
	stopped := 0
	for _, e := range due {
		e, err := a.stopServing(ctx, a.drivers[e.Device.Kind], e)
		if err != nil {
			a.log.Warn("stopping an expired lease's export failed", "lease", e.Request.LeaseID, "err", err)
			continue
		}
		stopped++
		a.mu.Lock()
		if _, ok := a.exports[e.Request.Export]; ok {
			a.exports[e.Request.Export] = e
			a.exportsChangedLocked()
		}
		a.mu.Unlock()
		a.mSuspends.WithLabelValues(string(e.Device.Kind)).Inc()
		a.mu.Lock()
		reachable, answered := a.cpAnswered, a.cpAnsweredAt
		a.mu.Unlock()
		attrs := []any{"lease", e.Request.LeaseID, "kind", e.Device.Kind, "expired", !e.Request.ExpiresAt.IsZero(),
			"control_plane_reachable", reachable}
		if !answered.IsZero() {
			attrs = append(attrs, "control_plane_last_answer", answered)
		}
		a.log.Warn("stopped serving a lease whose expiry passed without a renewal the control plane confirmed", attrs...)
	}
	return stopped
}

// nextExpiry is the earliest known expiry of a served export.
func (a *Agent) nextExpiry() (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.nextExpiryLocked()
}

// nextExpiryLocked is nextExpiry; a.mu is held.
func (a *Agent) nextExpiryLocked() (time.Time, bool) {
	var next time.Time
	for _, e := range a.exports {
		if exp := e.Request.ExpiresAt; e.serving() && !exp.IsZero() && (next.IsZero() || exp.Before(next)) {
			next = exp
		}
	}
	return next, !next.IsZero()
}

// nextExpiryAfter is the earliest known expiry of a served export
// prepared (or moved here) after mark (Export.prepared).
func (a *Agent) nextExpiryAfter(mark uint64) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var next time.Time
	for _, e := range a.exports {
		if exp := e.Request.ExpiresAt; e.prepared > mark && e.serving() && !exp.IsZero() && (next.IsZero() || exp.Before(next)) {
			next = exp
		}
	}
	return next, !next.IsZero()
}

// wakeLoop wakes the heartbeat loop to plan again.
func (a *Agent) wakeLoop() {
	select {
	case a.wake <- struct{}{}:
	default: // one is pending
	}
}
