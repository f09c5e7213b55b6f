package controlplane

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
)

// Device usage: agents report each device's cumulative data-plane byte
// counters with their heartbeats (api.Heartbeat.Usage); the control plane
// keeps the recent history of every device in memory, in a small ring,
// and answers GET /v1/usage with bandwidth over time (for the dashboard's
// plots). Nothing of it is stored: a restarted control plane starts with
// an empty history.

const (
	// usageSamples is how many samples a device's ring keeps.
	usageSamples = 256
	// usageGap is the least time between two kept samples; heartbeats in
	// between replace the newest sample, so that a ring spans at least
	// usageSamples × usageGap (about 4 minutes).
	usageGap = time.Second
	// usageFresh is how old a device's latest report may be for its
	// bandwidth to count as current (link load).
	usageFresh = 10 * time.Second
)

type usageKey struct{ node, name string }

type usagePoint struct {
	at                  time.Time
	read, written, used int64 // used < 0: unknown
}

// usageRing is one device's history, oldest first once full (start is
// the oldest's index).
type usageRing struct {
	pts   []usagePoint
	start int
}

func (r *usageRing) len() int { return len(r.pts) }

func (r *usageRing) at(i int) *usagePoint { return &r.pts[(r.start+i)%len(r.pts)] }

func (r *usageRing) add(p usagePoint) {
	n := r.len()
	if n > 0 {
		last := r.at(n - 1)
		if p.at.Before(last.at) {
			return // out of order: a late heartbeat
		}
		same := p.read == last.read && p.written == last.written && p.used == last.used
		// An idle device's flat stretch is two points, its ends: move the
		// second forward. A busy device's samples are usageGap apart: a
		// sample sooner than that replaces the newest one.
		if n > 1 {
			prev := r.at(n - 2)
			flat := same && prev.read == last.read && prev.written == last.written && prev.used == last.used
			if flat || last.at.Sub(prev.at) < usageGap {
				*last = p
				return
			}
		}
	}
	if n < usageSamples {
		r.pts = append(r.pts, p)
		return
	}
	r.pts[r.start] = p
	r.start = (r.start + 1) % n
}

// rates turns the ring's cumulative counters into bandwidth samples: one
// per interval between consecutive points. A counter that went back (the
// agent restarted) counts from zero.
func (r *usageRing) rates() []api.UsageSample {
	n := r.len()
	out := make([]api.UsageSample, 0, max(n-1, 0))
	for i := 1; i < n; i++ {
		a, b := r.at(i-1), r.at(i)
		dt := b.at.Sub(a.at).Seconds()
		if dt <= 0 {
			continue
		}
		delta := func(x, y int64) float64 {
			if y < x {
				return float64(y) / dt
			}
			return float64(y-x) / dt
		}
		out = append(out, api.UsageSample{At: b.at, ReadBps: delta(a.read, b.read), WriteBps: delta(a.written, b.written)})
	}
	return out
}

// usageTracker holds every device's ring. The zero value is ready; it is
// safe for concurrent use.
type usageTracker struct {
	mu    sync.Mutex
	rings map[usageKey]*usageRing
}

// checkUsage validates a heartbeat's counters.
func checkUsage(cs []api.DeviceCounters) error {
	if len(cs) > 4096 {
		return fmt.Errorf("%w: heartbeat usage lists more than 4096 devices", ErrInvalid)
	}
	for _, c := range cs {
		if c.Name == "" || len(c.Name) > 256 || c.ReadBytes < 0 || c.WrittenBytes < 0 || (c.UsedBytes != nil && *c.UsedBytes < 0) {
			return fmt.Errorf("%w: usage needs a device name and non-negative counters", ErrInvalid)
		}
	}
	return nil
}

// record adds a node's reported counters at now.
func (u *usageTracker) record(node string, cs []api.DeviceCounters, now time.Time) {
	if len(cs) == 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.rings == nil {
		u.rings = map[usageKey]*usageRing{}
	}
	for _, c := range cs {
		k := usageKey{node, c.Name}
		r := u.rings[k]
		if r == nil {
			r = &usageRing{}
			u.rings[k] = r
		}
		used := int64(-1)
		if c.UsedBytes != nil {
			used = *c.UsedBytes
		}
		r.add(usagePoint{at: now, read: c.ReadBytes, written: c.WrittenBytes, used: used})
	}
}

// usage answers for devs: those with a history, in devs' order.
func (u *usageTracker) usage(devs []api.Device) []api.DeviceUsage {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := []api.DeviceUsage{}
	for _, d := range devs {
		r := u.rings[usageKey{d.NodeID, d.Name}]
		if r == nil || r.len() == 0 {
			continue
		}
		du := api.DeviceUsage{DeviceID: d.ID, NodeID: d.NodeID, Samples: r.rates()}
		if used := r.at(r.len() - 1).used; used >= 0 {
			du.UsedBytes = &used
		}
		if n := len(du.Samples); n > 0 {
			du.ReadBps, du.WriteBps = du.Samples[n-1].ReadBps, du.Samples[n-1].WriteBps
		}
		out = append(out, du)
	}
	return out
}

// loadWindow is the span a link's load averages over.
const loadWindow = 10 * time.Second

// load is the bytes/s the device moved over the last loadWindow (or
// what the ring holds of it), if its latest report is fresh.
func (r *usageRing) load(now time.Time) (float64, bool) {
	n := r.len()
	if n < 2 {
		return 0, false
	}
	last := r.at(n - 1)
	if now.Sub(last.at) > usageFresh {
		return 0, false
	}
	i := n - 2
	for i > 0 && last.at.Sub(r.at(i).at) < loadWindow {
		i--
	}
	first := r.at(i)
	dt := last.at.Sub(first.at).Seconds()
	if dt <= 0 || last.read < first.read || last.written < first.written { // restarted in between
		return 0, false
	}
	return float64(last.read-first.read+last.written-first.written) / dt, true
}

// nodeLoad is the bytes/s each node's devices moved over the last
// loadWindow, counting devices with fresh reports.
func (u *usageTracker) nodeLoad(now time.Time) map[string]float64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]float64{}
	for k, r := range u.rings {
		if bps, ok := r.load(now); ok {
			out[k.node] += bps
		}
	}
	return out
}

// withLoad sets the load of each node's link to the control plane (its
// uplink, which all of its data-plane traffic crosses) to its devices'
// bandwidth over the last loadWindow. links is not modified.
func (u *usageTracker) withLoad(links []api.Link, now time.Time) []api.Link {
	load := u.nodeLoad(now)
	if len(load) == 0 {
		return links
	}
	out := make([]api.Link, len(links))
	for i, l := range links {
		if l.To == "controlplane" {
			l.LoadBps = int64(load[l.From])
		}
		out[i] = l
	}
	return out
}

func (s *Server) hUsage(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	devs, err := s.st.Devices(ctx)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, s.usage.usage(devs), nil
}
