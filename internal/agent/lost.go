package agent

import (
	"sort"

	"github.com/rialto-project/rialto/api"
)

// Ephemeral is implemented by drivers whose exports keep their data in
// the agent's process (a memory lease's region): a restarted agent cannot
// serve such an export again as if it still held the lease's data, so it
// does not restore it, and reports its lease's part lost instead.
type Ephemeral interface {
	// Ephemeral says why an export of the driver is gone after a
	// restart (the reason the control plane records with the loss).
	Ephemeral() string
}

// loseEphemeral takes out of saved the exports whose data did not survive
// the restart (their driver is Ephemeral) and keeps them as lost: each
// heartbeat reports them (api.Heartbeat.Lost) until the control plane
// acknowledges them, and exports.json keeps them until then (marked
// "lost"), so that a restart in between reports them again. The agent
// warns once per export, naming the lease, and counts it in
// rialto_agent_restored_exports_total{result="lost"}. There is nothing to
// wipe: the data went with the process.
func (a *Agent) loseEphemeral(saved []persistedExport) []persistedExport {
	out := saved[:0:0]
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range saved {
		if p.Lost == "" {
			eph, ok := a.drivers[p.Kind].(Ephemeral)
			if !ok {
				out = append(out, p)
				continue
			}
			p.Lost = eph.Ephemeral()
			a.mRestored.WithLabelValues("lost").Inc()
			a.log.Warn("an export's data did not survive the restart: it is not served again, and the control plane is told its lease is lost",
				"lease", p.LeaseID, "kind", p.Kind, "reason", p.Lost)
		}
		a.loseLocked(p, p.Lost)
	}
	return out
}

// loseLocked keeps the restored export p as lost for reason: it is not
// served, and heartbeats report its lease's part lost until the control
// plane acknowledges it (see loseEphemeral); a.mu is held.
func (a *Agent) loseLocked(p persistedExport, reason string) {
	p.Lost, p.Moved = reason, ""
	if _, dup := a.lost[p.Export]; !dup {
		a.lost[p.Export] = p
	}
}

// lostLocked lists the lost exports to report; a.mu is held.
func (a *Agent) lostLocked() []api.LostExport {
	out := make([]api.LostExport, 0, len(a.lost))
	for _, p := range a.lost {
		out = append(out, api.LostExport{LeaseID: p.LeaseID, DeviceID: p.DeviceID, Offset: p.Offset, Reason: p.Lost})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].LeaseID != out[j].LeaseID {
			return out[i].LeaseID < out[j].LeaseID
		}
		return out[i].Offset < out[j].Offset
	})
	return out
}

// recordLost forgets the lost exports of the leases the control plane
// acknowledged, and persists the rest.
func (a *Agent) recordLost(leases []string) {
	acked := setOf(leases)
	a.opMu.Lock()
	defer a.opMu.Unlock()
	n := 0
	a.mu.Lock()
	for name, p := range a.lost {
		if acked[p.LeaseID] {
			delete(a.lost, name)
			n++
		}
	}
	a.mu.Unlock()
	if n == 0 {
		return
	}
	a.log.Info("the control plane recorded the lost exports", "exports", n)
	if err := a.saveExportsLocked(); err != nil {
		a.log.Warn("persisting exports", "err", err)
	}
}

// setOf is the set of ids.
func setOf(ids []string) map[string]bool {
	set := make(map[string]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	return set
}
