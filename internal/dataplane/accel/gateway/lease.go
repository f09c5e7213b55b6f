package gateway

// Per-lease scheduling: a shared gateway serves several leases (tenants),
// each with its own queues, a weight, and counters. The scheduler picks
// the next batch by start-time fair queueing over the leases (Goyal, Vin
// and Cheng's SFQ): a lease's virtual time advances by items/weight with
// every execution it gets, and the ready lease with the smallest virtual
// start time goes next. Under saturation the leases' served items follow
// their weights; a lease that falls idle does not bank credit.

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/metrics"
)

// anonLease labels the calls that carry no lease (a gateway used
// in-process, or served with Target and its one credential).
const anonLease = "default"

// lease is one tenant of a gateway. Its name is a non-secret label
// (metrics, listings), never the credential.
type lease struct {
	name   string
	weight atomic.Int64 // ≥ 1

	pending atomic.Int64 // items admitted by SharedTarget (Credentials.Limit) whose Execute has not returned

	admMu    sync.Mutex
	admitted map[*admission]struct{} // the calls pending counts, for recounting (admit)
	queued   atomic.Int64            // items accepted by the gateway and not yet answered

	served, cancelled, failed, service, executions atomic.Uint64
	left                                           atomic.Bool // its gateway forgot it: no more series

	mu      sync.Mutex
	running int           // executions of its batches under way
	idle    chan struct{} // closed when running drops to 0 (nil: idle)

	// deadline, if set, is when the lease stops being served
	// (Credentials.SetDeadline): its calls are refused as they arrive
	// and its batches as a worker takes them up once it has passed.
	deadline atomic.Pointer[clock.Deadline]
}

// expired reports whether l's deadline has passed: one atomic load, and
// one clock reading while a deadline is set.
func (l *lease) expired() bool { return l.deadline.Load().Passed() }

func newLease(name string, weight int) *lease {
	l := &lease{name: name}
	l.weight.Store(int64(max(weight, 1)))
	return l
}

// closed reports whether ch is closed; a nil ch (a caller that cannot
// give up) never is.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// admission is one call admitted against a lease's part of the queue.
type admission struct {
	gone <-chan struct{} // closed when its caller stops waiting (ctx.Done())
	n    int64
}

// admit admits a call of n items whose caller waits under ctx if the
// lease's live items (those of admitted calls whose callers still wait)
// stay within limit, and the items of calls abandoned but not yet
// returned within another limit; the caller must call the returned
// release when the call returns. A call abandoned (its deadline, a
// CANCEL) stops counting as live at once, not when its Execute returns:
// the server handles a connection's CANCEL before the START that follows
// it, but the goroutine running the cancelled call may run after the new
// one's. Its slot time is not given back: the scheduler charged the
// lease's virtual time when its batch was dispatched.
func (l *lease) admit(ctx context.Context, n, limit int64) (release func(), live int64, ok bool) {
	a := &admission{gone: ctx.Done(), n: n}
	l.admMu.Lock()
	defer l.admMu.Unlock()
	p := l.pending.Add(n)
	if p > limit {
		live = n
		for o := range l.admitted {
			if !closed(o.gone) {
				live += o.n
			}
		}
		if live > limit || p > 2*limit {
			l.pending.Add(-n)
			return nil, live - n, false
		}
	}
	if l.admitted == nil {
		l.admitted = map[*admission]struct{}{}
	}
	l.admitted[a] = struct{}{}
	return func() {
		l.admMu.Lock()
		delete(l.admitted, a)
		l.pending.Add(-n)
		l.admMu.Unlock()
	}, 0, true
}

// begin and end bracket an execution of the lease's work.
func (l *lease) begin() {
	l.mu.Lock()
	if l.running == 0 {
		l.idle = make(chan struct{})
	}
	l.running++
	l.mu.Unlock()
}

func (l *lease) end() {
	l.mu.Lock()
	l.running--
	if l.running == 0 {
		close(l.idle)
		l.idle = nil
	}
	l.mu.Unlock()
}

// waitIdle waits until none of the lease's executions runs, or ctx ends.
func (l *lease) waitIdle(ctx context.Context) error {
	l.mu.Lock()
	idle := l.idle
	l.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// LeaseStats are one lease's counters at a gateway.
type LeaseStats struct {
	Lease      string  `json:"lease"`
	Weight     int     `json:"weight"`
	Queued     int64   `json:"queued"`     // items accepted, not yet answered, whose callers still wait
	Served     uint64  `json:"served"`     // items answered with their output
	Cancelled  uint64  `json:"cancelled"`  // requests whose caller gave up (deadline, teardown) before the answer
	Failed     uint64  `json:"failed"`     // requests answered with an error
	Service    uint64  `json:"service"`    // items executed for the lease, reruns included: its use of the slots
	Executions uint64  `json:"executions"` // executions of its batches (Service/Executions: its batch size)
	Share      float64 `json:"share"`      // its part of the items the gateway executed since it joined
}

// fairQueue is the virtual clock of start-time fair queueing over leases.
type fairQueue struct {
	mu sync.Mutex
	vt map[*lease]float64 // each lease's virtual finish time
	v  float64            // the start tag of the last batch dispatched
}

// tag is the virtual start time of l's next batch.
func (f *fairQueue) tag(l *lease) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return max(f.vt[l], f.v)
}

// charge advances l's virtual time by n items of service; dispatch says
// the scheduler starts the batch now (moving the virtual clock), else the
// service is extra (the one-by-one reruns of a failed batch).
func (f *fairQueue) charge(l *lease, n int, dispatch bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.vt == nil {
		f.vt = map[*lease]float64{}
	}
	s := max(f.vt[l], f.v)
	if dispatch {
		f.v = s
	}
	f.vt[l] = s + float64(n)/float64(l.weight.Load())
	if len(f.vt) > 64 { // leases at or behind the clock have no credit to keep
		for k, t := range f.vt {
			if t <= f.v {
				delete(f.vt, k)
			}
		}
	}
}

func (f *fairQueue) forget(l *lease) {
	f.mu.Lock()
	delete(f.vt, l)
	f.mu.Unlock()
}

// leaseMetrics are the per-lease series of a gateway (label: the lease's
// name, never its credential).
type leaseMetrics struct {
	queued, weight                                 *prometheus.GaugeVec
	served, cancelled, failed, service, executions *prometheus.CounterVec
	share                                          *prometheus.GaugeVec
}

func newLeaseMetrics(r prometheus.Registerer) *leaseMetrics {
	l := []string{"gateway", "lease"}
	c := func(name, help string) *prometheus.CounterVec {
		return metrics.Register(r, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, l))
	}
	g := func(name, help string) *prometheus.GaugeVec {
		return metrics.Register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, l))
	}
	return &leaseMetrics{
		queued:     g("rialto_gateway_lease_queued_items", "Items of the lease accepted and not yet answered."),
		weight:     g("rialto_gateway_lease_weight", "The lease's scheduling weight (its ideal share is weight / sum of the weights of the backlogged leases)."),
		share:      g("rialto_gateway_lease_share_ratio", "The lease's part of the items the gateway executed since the lease joined."),
		served:     c("rialto_gateway_lease_served_items_total", "Items of the lease answered with their output."),
		cancelled:  c("rialto_gateway_lease_cancelled_total", "Requests of the lease whose caller gave up (deadline, lease teardown) before the answer."),
		failed:     c("rialto_gateway_lease_failed_total", "Requests of the lease answered with an error."),
		service:    c("rialto_gateway_lease_service_items_total", "Items executed for the lease, one-by-one reruns included: its use of the slots."),
		executions: c("rialto_gateway_lease_executions_total", "Executions of the lease's batches."),
	}
}

// leaseSet is the leases a gateway knows, with the gateway's executed
// items when each joined (for Share).
type leaseSet struct {
	mu    sync.Mutex
	base  map[*lease]uint64
	total atomic.Uint64 // items executed by the gateway
}

func (g *Gateway) join(l *lease) {
	g.leases.mu.Lock()
	if g.leases.base == nil {
		g.leases.base = map[*lease]uint64{}
	}
	if _, ok := g.leases.base[l]; !ok {
		g.leases.base[l] = g.leases.total.Load()
	}
	g.leases.mu.Unlock()
	if m := g.lm(l); m != nil {
		n := g.cfg.Name
		m.weight.WithLabelValues(n, l.name).Set(float64(l.weight.Load()))
		m.queued.WithLabelValues(n, l.name).Set(float64(l.queued.Load()))
		for _, v := range []*prometheus.CounterVec{m.served, m.cancelled, m.failed, m.service, m.executions} {
			v.WithLabelValues(n, l.name)
		}
		m.share.WithLabelValues(n, l.name)
	}
}

// lm returns the gateway's per-lease metrics, nil if it has none or l
// has left (its series are gone and stay gone).
func (g *Gateway) lm(l *lease) *leaseMetrics {
	if g.mLease == nil || l.left.Load() {
		return nil
	}
	return g.mLease
}

// leave forgets l: its series go, its virtual time goes.
func (g *Gateway) leave(l *lease) {
	l.left.Store(true)
	g.leases.mu.Lock()
	delete(g.leases.base, l)
	g.leases.mu.Unlock()
	g.fair.forget(l)
	if m := g.mLease; m != nil {
		n := g.cfg.Name
		for _, v := range []*prometheus.GaugeVec{m.queued, m.weight, m.share} {
			v.DeleteLabelValues(n, l.name)
		}
		for _, v := range []*prometheus.CounterVec{m.served, m.cancelled, m.failed, m.service, m.executions} {
			v.DeleteLabelValues(n, l.name)
		}
	}
}

// setWeight records l's new weight in its series.
func (g *Gateway) setWeight(l *lease) {
	if m := g.lm(l); m != nil {
		m.weight.WithLabelValues(g.cfg.Name, l.name).Set(float64(l.weight.Load()))
	}
}

// accountService accounts an execution of n items for l.
func (g *Gateway) accountService(l *lease, n int) {
	l.service.Add(uint64(n))
	l.executions.Add(1)
	total := g.leases.total.Add(uint64(n))
	if m := g.lm(l); m != nil {
		m.service.WithLabelValues(g.cfg.Name, l.name).Add(float64(n))
		m.executions.WithLabelValues(g.cfg.Name, l.name).Inc()
		g.leases.mu.Lock()
		base, ok := g.leases.base[l]
		g.leases.mu.Unlock()
		if ok && total > base {
			m.share.WithLabelValues(g.cfg.Name, l.name).Set(float64(l.service.Load()) / float64(total-base))
		}
	}
}

// Leases returns the counters of the leases the gateway knows, by name.
func (g *Gateway) Leases() []LeaseStats {
	g.leases.mu.Lock()
	total := g.leases.total.Load()
	out := make([]LeaseStats, 0, len(g.leases.base))
	for l, base := range g.leases.base {
		s := LeaseStats{Lease: l.name, Weight: int(l.weight.Load()), Queued: l.queued.Load(),
			Served: l.served.Load(), Cancelled: l.cancelled.Load(), Failed: l.failed.Load(),
			Service: l.service.Load(), Executions: l.executions.Load()}
		if total > base {
			s.Share = float64(s.Service) / float64(total-base)
		}
		out = append(out, s)
	}
	g.leases.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Lease < out[j].Lease })
	return out
}

// DefaultRevokeWait bounds how long Credentials.Revoke waits for a
// revoked lease's running executions to return after cancelling them.
const DefaultRevokeWait = 5 * time.Second
