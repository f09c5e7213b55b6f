package gateway

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/metrics"
)

// Rejections. They wrap accel errors so that remote callers of a gateway
// served over the accel protocol see ErrBusy / ErrUnavailable / ErrTooLarge.
var (
	ErrQueueFull    = fmt.Errorf("gateway: queue full: %w", accel.ErrBusy)
	ErrQueueTimeout = fmt.Errorf("gateway: queued too long: %w", accel.ErrBusy)
	ErrGroupTooBig  = fmt.Errorf("gateway: group larger than the maximum batch: %w", accel.ErrTooLarge)
	ErrStopped      = fmt.Errorf("gateway: not running: %w", accel.ErrUnavailable)
	ErrConfig       = errors.New("gateway: bad config")
)

// Backend is one slot instance behind the gateway; *accel.Conn is one.
type Backend interface {
	CallBatch(ctx context.Context, entry string, ins [][]byte) ([][]byte, error)
}

// Local adapts an in-process role as a Backend.
func Local(r roles.Role) Backend { return localBackend{r} }

type localBackend struct{ r roles.Role }

func (l localBackend) CallBatch(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	return roles.RunBatch(ctx, l.r, entry, ins, accel.DefaultMaxPayload)
}

// Config tunes a gateway. Zero fields take the defaults noted.
type Config struct {
	Name           string                // metrics label; default "default"
	Role           string                // the role behind it, reported to clients (default "gateway:"+Name)
	Entries        []string              // the role's entries, reported to clients
	MaxBatch       int                   // items per execution; default 64
	PreferredBatch []int                 // dispatch as soon as one of these sizes can be formed
	MaxQueueDelay  time.Duration         // how long a batch may wait to grow; 0: dispatch at once
	Workers        int                   // concurrent executions; default 1
	QueueLimit     int                   // items accepted and not yet answered before ErrQueueFull; default 64×MaxBatch
	QueueTimeout   time.Duration         // a request queued longer fails with ErrQueueTimeout; 0: none
	Clock          clock.Clock           // nil: the real clock
	Metrics        prometheus.Registerer // optional; gateways sharing one tell their series apart by Name
	Logger         *slog.Logger
}

// Stats are the gateway's counters since New.
type Stats struct {
	Requests   uint64  `json:"requests"`   // accepted requests (a group counts once)
	Rejected   uint64  `json:"rejected"`   // queue full, group too big, stopped, timed out
	Failed     uint64  `json:"failed"`     // requests whose execution failed
	Items      uint64  `json:"items"`      // items executed ("inferences")
	Executions uint64  `json:"executions"` // backend calls
	AvgBatch   float64 `json:"avg_batch"`  // Items / Executions
	QueueSec   float64 `json:"queue_seconds"`
	ComputeSec float64 `json:"compute_seconds"`
	Pending    int64   `json:"pending"` // items accepted, not yet answered, whose callers still wait
}

type result struct {
	outs [][]byte
	err  error
}

type request struct {
	gone  <-chan struct{} // the caller's ctx.Done(): closed once it gave up
	lease *lease
	entry string
	key   string
	items [][]byte
	enq   time.Time
	done  chan result
	taken bool // scheduler scratch mark

	mu        sync.Mutex
	abandoned bool      // the caller gave up
	run       *inflight // the execution it is part of, if any
	counted   bool      // its items count in the gateway's and its lease's queued items
}

// inflight is one execution's cancellation: it is cancelled once every
// request it runs for has been abandoned (callers gone: a deadline, a
// lease's teardown), so that the slot stops work nobody waits for.
type inflight struct {
	mu     sync.Mutex
	live   int
	cancel context.CancelFunc
}

func (x *inflight) drop() {
	x.mu.Lock()
	x.live--
	done := x.live == 0
	x.mu.Unlock()
	if done {
		x.cancel()
	}
}

// abandon marks r's caller gone (ctx.AfterFunc of the caller's context):
// its items stop counting against the queue limits at once (the
// scheduler drops it from its queue when it wakes; an execution it is
// part of is cancelled if r was the last request waiting for it, and its
// lease was charged for that execution when it was dispatched).
func (g *Gateway) abandon(r *request) {
	r.mu.Lock()
	r.abandoned = true
	x := r.run
	r.mu.Unlock()
	g.uncount(r)
	if x != nil {
		x.drop()
	}
	select { // let the scheduler drop it from the queue now
	case g.wake <- struct{}{}:
	default:
	}
}

// uncount takes r's items out of the queued counts, once.
func (g *Gateway) uncount(r *request) {
	r.mu.Lock()
	c := r.counted
	r.counted = false
	r.mu.Unlock()
	if !c {
		return
	}
	g.queued.Add(-int64(len(r.items)))
	g.lqueued(r.lease, -len(r.items))
}

// attach makes r one of x's requests; false if r's caller already gave up.
func (r *request) attach(x *inflight) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.abandoned {
		return false
	}
	r.run = x
	return true
}

func (r *request) detach() {
	r.mu.Lock()
	r.run = nil
	r.mu.Unlock()
}

type batch struct {
	lease   *lease
	entry   string
	reqs    []*request
	n       int
	at      time.Time
	aliased bool // reqs is the queue's prefix
}

// instance is a backend with its executions under way.
type instance struct {
	b    Backend
	busy atomic.Int64

	mu      sync.Mutex
	removed bool
	calls   map[int]context.CancelFunc
	nextID  int
}

// call runs a batch on the instance; moved reports that the instance was
// removed (SetInstances) before or during the call, which must then run on
// another.
func (in *instance) call(ctx context.Context, entry string, ins [][]byte) (outs [][]byte, moved bool, err error) {
	in.mu.Lock()
	if in.removed {
		in.mu.Unlock()
		return nil, true, nil
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	id := in.nextID
	in.nextID++
	in.calls[id] = cancel
	in.busy.Add(1)
	in.mu.Unlock()
	outs, err = in.b.CallBatch(cctx, entry, ins)
	in.mu.Lock()
	delete(in.calls, id)
	in.busy.Add(-1)
	removed := in.removed
	in.mu.Unlock()
	if err != nil && removed && ctx.Err() == nil {
		return nil, true, nil
	}
	return outs, false, err
}

// remove takes the instance out: its running calls are cancelled (on the
// slot too, for an accel backend: CANCEL) and run again elsewhere.
func (in *instance) remove() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.removed = true
	for _, cancel := range in.calls {
		cancel()
	}
}

// Gateway batches calls onto backends.
type Gateway struct {
	cfg       Config
	instMu    sync.Mutex // serializes SetInstances
	instances atomic.Pointer[[]*instance]
	log       *slog.Logger
	in        chan *request
	stopped   chan struct{} // closed when Run stops taking requests
	finished  chan struct{} // closed when Run has answered every request it took
	started   atomic.Bool
	running   atomic.Bool
	queued    atomic.Int64 // items accepted and not yet answered
	received  atomic.Int64 // requests the scheduler has taken in (for tests)
	next      atomic.Uint64
	wake      chan struct{} // a queued request's caller gave up

	anon       *lease // the calls that carry no lease
	anonJoined atomic.Bool
	fair       fairQueue
	leases     leaseSet
	mLease     *leaseMetrics

	requests, rejected, failed, items, executions atomic.Uint64
	queueNs, computeNs                            atomic.Int64

	mReq      *prometheus.CounterVec
	mItems    prometheus.Counter
	mExec     prometheus.Counter
	mQueue    prometheus.Observer
	mCompute  prometheus.Observer
	mPending  prometheus.Gauge
	mBatchLen prometheus.Observer
}

// New validates cfg and returns a gateway over instances.
func New(cfg Config, instances []Backend) (*Gateway, error) {
	if len(instances) == 0 {
		return nil, fmt.Errorf("%w: no instances", ErrConfig)
	}
	if cfg.Name == "" {
		cfg.Name = "default"
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 64
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.QueueLimit <= 0 {
		cfg.QueueLimit = 64 * cfg.MaxBatch
	}
	if cfg.MaxQueueDelay < 0 || cfg.QueueTimeout < 0 {
		return nil, fmt.Errorf("%w: negative duration", ErrConfig)
	}
	pref := append([]int(nil), cfg.PreferredBatch...)
	sort.Ints(pref)
	for _, p := range pref {
		if p <= 0 || p > cfg.MaxBatch {
			return nil, fmt.Errorf("%w: preferred batch size %d outside 1..%d", ErrConfig, p, cfg.MaxBatch)
		}
	}
	cfg.PreferredBatch = pref
	cfg.Clock = clock.Or(cfg.Clock)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{cfg: cfg, log: log, in: make(chan *request, 1024), wake: make(chan struct{}, 1),
		stopped: make(chan struct{}), finished: make(chan struct{}), anon: newLease(anonLease, 1)}
	g.SetInstances(instances)
	if r := cfg.Metrics; r != nil {
		n := cfg.Name
		g.mReq = metrics.Register(r, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_gateway_requests_total",
			Help: "Requests by outcome (ok, error, rejected, cancelled)."}, []string{"gateway", "outcome"}))
		for _, o := range []string{"ok", "error", "rejected", "cancelled"} {
			g.mReq.WithLabelValues(n, o)
		}
		g.mItems = metrics.Register(r, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_gateway_inferences_total",
			Help: "Items executed."}, []string{"gateway"})).WithLabelValues(n)
		g.mExec = metrics.Register(r, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_gateway_executions_total",
			Help: "Backend executions (batches); items/executions is the average batch size."}, []string{"gateway"})).WithLabelValues(n)
		g.mQueue = metrics.Register(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rialto_gateway_queue_seconds",
			Help: "Time requests wait in the queue.", Buckets: metrics.LatencyBuckets}, []string{"gateway"})).WithLabelValues(n)
		g.mCompute = metrics.Register(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rialto_gateway_compute_seconds",
			Help: "Time of each execution on a backend.", Buckets: metrics.LatencyBuckets}, []string{"gateway"})).WithLabelValues(n)
		g.mPending = metrics.Register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "rialto_gateway_pending_items",
			Help: "Items queued and not yet dispatched."}, []string{"gateway"})).WithLabelValues(n)
		g.mBatchLen = metrics.Register(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rialto_gateway_batch_items",
			Help: "Items per execution.", Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}}, []string{"gateway"})).WithLabelValues(n)
		g.mLease = newLeaseMetrics(r)
	}
	return g, nil
}

func (g *Gateway) count(outcome string) {
	if g.mReq != nil {
		g.mReq.WithLabelValues(g.cfg.Name, outcome).Inc()
	}
}

// SetInstances replaces the backends (a shared gateway grows and shrinks
// with its leases' slots). A backend kept (the same comparable value)
// keeps its executions; the executions running on a backend taken out are
// cancelled there (a slot reassigned must not go on running them: an accel
// backend sends CANCEL) and run again on the remaining ones. With no
// instances, executions fail with accel.ErrUnavailable.
func (g *Gateway) SetInstances(instances []Backend) {
	g.instMu.Lock()
	defer g.instMu.Unlock()
	var old []*instance
	if p := g.instances.Load(); p != nil {
		old = *p
	}
	is := make([]*instance, len(instances))
	kept := map[*instance]bool{}
	for i, b := range instances {
		for _, o := range old {
			if !kept[o] && sameBackend(o.b, b) {
				is[i] = o
				kept[o] = true
				break
			}
		}
		if is[i] == nil {
			is[i] = &instance{b: b, calls: map[int]context.CancelFunc{}}
		}
	}
	g.instances.Store(&is)
	for _, o := range old {
		if !kept[o] {
			o.remove()
		}
	}
}

// sameBackend reports whether a and b are the same backend (only
// comparable values can be).
func sameBackend(a, b Backend) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta != nil && ta.Comparable() && a == b
}

// pick returns the instance with the fewest executions under way (ties:
// in turn), so that a slot held by a long execution — a Wasm role that
// never returns, until its caller's deadline or its lease's teardown
// cancels it — does not delay the batches that other slots can run.
func (g *Gateway) pick() *instance {
	insts := *g.instances.Load()
	if len(insts) == 0 {
		return nil
	}
	start := int(g.next.Add(1) % uint64(len(insts)))
	best := insts[start]
	for i := 1; i < len(insts) && best.busy.Load() > 0; i++ {
		if in := insts[(start+i)%len(insts)]; in.busy.Load() < best.busy.Load() {
			best = in
		}
	}
	return best
}

// Instances returns the number of backends.
func (g *Gateway) Instances() int { return len(*g.instances.Load()) }

// Running reports whether Run is serving.
func (g *Gateway) Running() bool { return g.running.Load() }

// Stats returns the counters.
func (g *Gateway) Stats() Stats {
	s := Stats{Requests: g.requests.Load(), Rejected: g.rejected.Load(), Failed: g.failed.Load(),
		Items: g.items.Load(), Executions: g.executions.Load(),
		QueueSec: float64(g.queueNs.Load()) / 1e9, ComputeSec: float64(g.computeNs.Load()) / 1e9,
		Pending: g.queued.Load()}
	if s.Executions > 0 {
		s.AvgBatch = float64(s.Items) / float64(s.Executions)
	}
	return s
}

// Call submits one item and waits for its output.
func (g *Gateway) Call(ctx context.Context, entry string, in []byte) ([]byte, error) {
	outs, err := g.CallGroup(ctx, entry, [][]byte{in})
	if err != nil {
		return nil, err
	}
	return outs[0], nil
}

// CallGroup submits items that belong together: they run in one execution
// (possibly with other callers' items) and come back in order.
func (g *Gateway) CallGroup(ctx context.Context, entry string, items [][]byte) ([][]byte, error) {
	return g.CallKeyed(ctx, "", entry, items)
}

// CallKeyed is CallGroup with a batch key: requests that share a non-empty
// key (say, the queries of one user request, submitted from several
// goroutines) and are queued together are put into the same execution,
// ahead of other callers' requests, as far as MaxBatch allows.
func (g *Gateway) CallKeyed(ctx context.Context, key, entry string, items [][]byte) ([][]byte, error) {
	if len(items) == 0 {
		return nil, nil
	}
	reject := func(err error) ([][]byte, error) {
		g.rejected.Add(1)
		g.count("rejected")
		return nil, err
	}
	if !g.running.Load() {
		return reject(ErrStopped)
	}
	if len(items) > g.cfg.MaxBatch {
		return reject(fmt.Errorf("%w (%d items, max %d)", ErrGroupTooBig, len(items), g.cfg.MaxBatch))
	}
	if n := g.queued.Add(int64(len(items))); n > int64(g.cfg.QueueLimit) {
		g.queued.Add(-int64(len(items)))
		return reject(fmt.Errorf("%w (%d items queued, limit %d)", ErrQueueFull, n-int64(len(items)), g.cfg.QueueLimit))
	}
	l := g.leaseOf(ctx)
	g.lqueued(l, len(items))
	r := &request{gone: ctx.Done(), lease: l, entry: entry, key: key, items: items, enq: g.cfg.Clock.Now(), done: make(chan result, 1), counted: true}
	select {
	case g.in <- r:
	case <-g.stopped:
		g.queued.Add(-int64(len(items)))
		g.lqueued(l, -len(items))
		return reject(ErrStopped)
	case <-ctx.Done():
		g.queued.Add(-int64(len(items)))
		g.lqueued(l, -len(items))
		l.cancelled.Add(1)
		if m := g.lm(l); m != nil {
			m.cancelled.WithLabelValues(g.cfg.Name, l.name).Inc()
		}
		g.count("cancelled")
		return nil, ctx.Err()
	}
	// The caller giving up (its deadline, its lease's teardown) cancels the
	// execution it waits for, unless others wait for it too.
	stop := context.AfterFunc(ctx, func() { g.abandon(r) })
	defer stop()
	g.requests.Add(1)
	select {
	case res := <-r.done:
		return r.outcome(ctx, res)
	case <-ctx.Done():
		// The AfterFunc runs in a goroutine of its own, which may not
		// have started yet: stopped here (by the deferred stop), the
		// execution would go on for nobody, its slot busy until it
		// ended by itself (a runaway call: never). Abandon r here then.
		if stop() {
			g.abandon(r)
		}
		return nil, ctx.Err()
	case <-g.finished:
		select {
		case res := <-r.done:
			return r.outcome(ctx, res)
		default: // slipped into the queue after the final drain
			return nil, ErrStopped
		}
	}
}

// leaseOf returns the lease a call belongs to: its session's credential
// (SharedTarget), or the gateway's default lease.
func (g *Gateway) leaseOf(ctx context.Context) *lease {
	if c, ok := ctx.Value(credKey{}).(*credential); ok && c.lease != nil {
		return c.lease
	}
	if !g.anonJoined.Swap(true) {
		g.join(g.anon)
	}
	return g.anon
}

// lqueued adds n items to l's queued count.
func (g *Gateway) lqueued(l *lease, n int) {
	v := l.queued.Add(int64(n))
	if m := g.lm(l); m != nil {
		m.queued.WithLabelValues(g.cfg.Name, l.name).Set(float64(v))
	}
}

// errCallerGone is the result of a request whose caller gave up; the
// caller returns its ctx's error instead.
var errCallerGone = errors.New("gateway: the caller gave up")

// callerGone reports whether r's caller gave up.
func (r *request) callerGone() bool {
	select {
	case <-r.gone:
		return true
	default:
		return false
	}
}

// outcome is what the caller of r, whose context is ctx, returns for res.
func (r *request) outcome(ctx context.Context, res result) ([][]byte, error) {
	if res.err == errCallerGone {
		return nil, ctx.Err()
	}
	return res.outs, res.err
}

// queue is the FIFO of one entry.
type queue struct {
	reqs  []*request
	n     int
	keyed int // requests with a batch key
}

// Run runs the scheduler and the workers until ctx ends; queued requests
// then fail with ErrStopped. A gateway runs once.
func (g *Gateway) Run(ctx context.Context) error {
	if g.started.Swap(true) {
		return fmt.Errorf("%w: Run called twice", ErrConfig)
	}
	g.running.Store(true)
	defer close(g.finished)
	work := make(chan batch)
	var wg sync.WaitGroup
	for w := 0; w < g.cfg.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range work {
				g.execute(ctx, b)
			}
		}()
	}
	g.schedule(ctx, work)
	g.running.Store(false)
	close(g.stopped)
	close(work)
	wg.Wait()
	// Fail whatever is still arriving.
	for {
		select {
		case r := <-g.in:
			g.finish(r, result{err: ErrStopped}, "rejected")
		default:
			return nil
		}
	}
}

func (g *Gateway) finish(r *request, res result, outcome string) {
	g.uncount(r)
	if g.mPending != nil {
		g.mPending.Set(float64(g.queued.Load()))
	}
	l := r.lease
	m := g.lm(l)
	switch outcome {
	case "ok":
		l.served.Add(uint64(len(r.items)))
		if m != nil {
			m.served.WithLabelValues(g.cfg.Name, l.name).Add(float64(len(r.items)))
		}
	case "cancelled":
		l.cancelled.Add(1)
		if m != nil {
			m.cancelled.WithLabelValues(g.cfg.Name, l.name).Inc()
		}
	default:
		l.failed.Add(1)
		if m != nil {
			m.failed.WithLabelValues(g.cfg.Name, l.name).Inc()
		}
	}
	// Counted before the caller is answered, so that a caller that reads
	// the metrics after its call returns sees it.
	g.count(outcome)
	r.done <- res
}

// qkey names a queue: one lease's requests for one entry. A batch comes
// from one queue, so that a lease's bad items never fail, nor split into
// one-by-one reruns, another lease's batch.
type qkey struct {
	lease *lease
	entry string
}

// schedule is the single goroutine that owns the queues and forms batches:
// of the queues that can dispatch, the one whose lease has the smallest
// virtual start time (fair queueing by weight; ties: the oldest head).
func (g *Gateway) schedule(ctx context.Context, work chan<- batch) {
	queues := map[qkey]*queue{}
	var order []qkey // queues in arrival order
	var timer clock.Timer
	var timerAt time.Time
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		for _, q := range queues {
			for _, r := range q.reqs {
				g.finish(r, result{err: ErrStopped}, "rejected")
			}
		}
	}()
	for {
		now := g.cfg.Clock.Now()
		var cand batch
		var candTag float64
		have := false
		var wake time.Time
		kept := order[:0]
		for _, k := range order {
			q := queues[k]
			g.expire(q, now)
			if len(q.reqs) == 0 {
				delete(queues, k)
				continue
			}
			kept = append(kept, k)
			b, ok, at := g.form(k.entry, q, now)
			if ok {
				b.lease = k.lease
				tag := g.fair.tag(k.lease)
				if !have || tag < candTag || (tag == candTag && b.reqs[0].enq.Before(cand.reqs[0].enq)) {
					cand, candTag, have = b, tag, true
				}
			}
			if !at.IsZero() && (wake.IsZero() || at.Before(wake)) {
				wake = at
			}
		}
		clear(order[len(kept):])
		order = kept
		var sendTo chan<- batch
		if have {
			sendTo = work
		}
		var timerC <-chan time.Time
		if !wake.IsZero() {
			if timer == nil || !timerAt.Equal(wake) {
				if timer != nil {
					timer.Stop()
				}
				timer, timerAt = g.cfg.Clock.NewTimer(wake.Sub(now)), wake
			}
			timerC = timer.C()
		}
		select {
		case <-ctx.Done():
			return
		case r := <-g.in:
			k := qkey{r.lease, r.entry}
			q := queues[k]
			if q == nil {
				q = &queue{}
				queues[k] = q
				order = append(order, k)
			}
			q.reqs = append(q.reqs, r)
			q.n += len(r.items)
			if r.key != "" {
				q.keyed++
			}
			g.received.Add(1)
			if g.mPending != nil {
				g.mPending.Set(float64(g.queued.Load()))
			}
		case sendTo <- cand:
			g.fair.charge(cand.lease, cand.n, true)
			q := queues[qkey{cand.lease, cand.entry}]
			if cand.aliased {
				q.reqs = q.reqs[len(cand.reqs):]
			} else {
				q.remove(cand.reqs)
			}
			q.n -= cand.n
		case <-g.wake:
		case <-timerC:
			timer = nil
		}
	}
}

// expire drops cancelled and timed-out requests from q.
func (g *Gateway) expire(q *queue, now time.Time) {
	kept := q.reqs[:0]
	for _, r := range q.reqs {
		var res result
		outcome := ""
		if r.callerGone() {
			res, outcome = result{err: errCallerGone}, "cancelled"
		} else if g.cfg.QueueTimeout > 0 && now.Sub(r.enq) >= g.cfg.QueueTimeout {
			g.rejected.Add(1)
			res, outcome = result{err: fmt.Errorf("%w (%v)", ErrQueueTimeout, g.cfg.QueueTimeout)}, "rejected"
		}
		if outcome == "" {
			kept = append(kept, r)
			continue
		}
		q.n -= len(r.items)
		if r.key != "" {
			q.keyed--
		}
		g.finish(r, res, outcome)
	}
	clear(q.reqs[len(kept):])
	q.reqs = kept
}

// form decides whether q can be dispatched now: it returns the batch, or
// the time at which waiting must end.
func (g *Gateway) form(entry string, q *queue, now time.Time) (batch, bool, time.Time) {
	if len(q.reqs) == 0 {
		return batch{}, false, time.Time{}
	}
	c := g.cfg
	target := 0
	switch {
	case q.n >= c.MaxBatch:
		target = c.MaxBatch
	case len(c.PreferredBatch) > 0 && q.n >= c.PreferredBatch[0]:
		for _, p := range c.PreferredBatch {
			if p <= q.n {
				target = p
			}
		}
	case now.Sub(q.reqs[0].enq) >= c.MaxQueueDelay:
		target = q.n
	}
	var wake time.Time
	if c.QueueTimeout > 0 {
		wake = q.reqs[0].enq.Add(c.QueueTimeout)
	}
	if target == 0 {
		d := q.reqs[0].enq.Add(c.MaxQueueDelay)
		if wake.IsZero() || d.Before(wake) {
			wake = d
		}
		return batch{}, false, wake
	}
	b := batch{entry: entry, at: now}
	if q.keyed == 0 {
		k := 0
		for _, r := range q.reqs {
			if b.n+len(r.items) > target && b.n > 0 {
				break
			}
			b.n += len(r.items)
			k++
		}
		// The batch aliases the queue's prefix; the scheduler never writes
		// there again once the batch is handed over.
		b.reqs, b.aliased = q.reqs[:k:k], true
		return b, true, wake
	}
	// With batch keys: FIFO, but a keyed request pulls the queued requests
	// sharing its key into the batch (up to MaxBatch).
	add := func(r *request) {
		r.taken = true
		b.reqs = append(b.reqs, r)
		b.n += len(r.items)
	}
	for i, r := range q.reqs {
		if r.taken {
			continue
		}
		if b.n+len(r.items) > target && b.n > 0 {
			break
		}
		add(r)
		if r.key == "" {
			continue
		}
		for _, r2 := range q.reqs[i+1:] {
			if !r2.taken && r2.key == r.key && b.n+len(r2.items) <= c.MaxBatch {
				add(r2)
			}
		}
	}
	for _, r := range b.reqs {
		r.taken = false
	}
	return b, true, wake
}

// remove drops the batch's requests from the queue, keeping the order of
// the others.
func (q *queue) remove(reqs []*request) {
	for _, r := range reqs {
		r.taken = true
		if r.key != "" {
			q.keyed--
		}
	}
	kept := q.reqs[:0]
	for _, r := range q.reqs {
		if !r.taken {
			kept = append(kept, r)
		}
	}
	clear(q.reqs[len(kept):])
	q.reqs = kept
}

// itemError reports whether err is one that a single item can cause (bad
// input, a role that fails on it) or the batch as a whole (inputs or
// outputs above what a slot's frame carries): in a batch, the caller of
// that item's failure, or nobody's, not the others'.
func itemError(err error) bool {
	return errors.Is(err, roles.ErrBadInput) || errors.Is(err, roles.ErrWasmTrap) || errors.Is(err, accel.ErrRoleFailed) ||
		errors.Is(err, accel.ErrTooLarge)
}

// execute runs one batch (one lease's requests) on an instance and answers
// its requests. If one item makes the execution fail, the requests are run
// again one by one, so that only that item's caller gets the error; the
// reruns are charged to the lease. An execution whose callers have all
// gone is cancelled (on the slot too: the accel client sends CANCEL).
func (g *Gateway) execute(ctx context.Context, b batch) {
	for _, r := range b.reqs {
		qd := b.at.Sub(r.enq)
		g.queueNs.Add(int64(qd))
		if g.mQueue != nil {
			g.mQueue.Observe(qd.Seconds())
		}
	}
	if b.lease.expired() {
		// Queued before the lease's deadline, taken up after it (one
		// clock reading per batch).
		g.answer(b.reqs, nil, fmt.Errorf("%w: lease %s", accel.ErrLeaseExpired, b.lease.name))
		return
	}
	outs, gone, err := g.run(ctx, b.lease, b.entry, b.reqs, b.n)
	switch {
	case gone:
		g.abandoned(b.reqs)
	case err != nil && len(b.reqs) > 1 && itemError(err):
		for _, r := range b.reqs {
			if r.callerGone() {
				g.finish(r, result{err: errCallerGone}, "cancelled")
				continue
			}
			g.fair.charge(b.lease, len(r.items), false)
			o, gone, err := g.run(ctx, b.lease, b.entry, []*request{r}, len(r.items))
			if gone {
				g.abandoned([]*request{r})
				continue
			}
			g.answer([]*request{r}, o, err)
		}
	default:
		g.answer(b.reqs, outs, err)
	}
}

// abandoned answers requests whose callers have gone.
func (g *Gateway) abandoned(reqs []*request) {
	for _, r := range reqs {
		g.finish(r, result{err: errCallerGone}, "cancelled")
	}
}

// run executes the items of reqs (n in all, of lease l) on an instance,
// under a context that ends once every caller of reqs has gone; gone
// reports that the execution failed because it did.
func (g *Gateway) run(ctx context.Context, l *lease, entry string, reqs []*request, n int) (outs [][]byte, gone bool, err error) {
	ins := make([][]byte, 0, n)
	for _, r := range reqs {
		ins = append(ins, r.items...)
	}
	xctx, cancel := context.WithCancel(ctx)
	defer cancel()
	x := &inflight{live: len(reqs), cancel: cancel}
	for _, r := range reqs {
		if !r.attach(x) {
			x.drop()
		}
	}
	defer func() {
		for _, r := range reqs {
			r.detach()
		}
	}()
	l.begin()
	defer l.end()
	t0 := time.Now()
	for {
		in := g.pick()
		if in == nil {
			return nil, false, fmt.Errorf("%w: gateway %s has no instances", accel.ErrUnavailable, g.cfg.Name)
		}
		if err := xctx.Err(); err != nil { // every caller gave up before it started
			return nil, ctx.Err() == nil, err
		}
		var moved bool
		if outs, moved, err = in.call(xctx, entry, ins); !moved {
			break
		}
	}
	d := time.Since(t0)
	g.computeNs.Add(int64(d))
	g.executions.Add(1)
	g.items.Add(uint64(len(ins)))
	g.accountService(l, len(ins))
	if g.mExec != nil {
		g.mExec.Inc()
		g.mItems.Add(float64(len(ins)))
		g.mCompute.Observe(d.Seconds())
		g.mBatchLen.Observe(float64(len(ins)))
	}
	if err != nil && xctx.Err() != nil && ctx.Err() == nil {
		return nil, true, err
	}
	if err == nil && len(outs) != len(ins) {
		err = fmt.Errorf("%w: %d outputs for %d inputs", accel.ErrRoleFailed, len(outs), len(ins))
	}
	return outs, false, err
}

// answer answers reqs with their outputs, in order, or with err; a
// request whose caller has gone (an execution that ran to its end though
// cancelled: a role with no cancellation point) counts as cancelled.
func (g *Gateway) answer(reqs []*request, outs [][]byte, err error) {
	off := 0
	for _, r := range reqs {
		if r.callerGone() {
			g.finish(r, result{err: errCallerGone}, "cancelled")
			off += len(r.items)
			continue
		}
		if err != nil {
			g.failed.Add(1)
			g.finish(r, result{err: err}, "error")
			continue
		}
		g.finish(r, result{outs: outs[off : off+len(r.items) : off+len(r.items)]}, "ok")
		off += len(r.items)
	}
}

// Target exposes the gateway over the accel protocol (serve it with
// accel.Server): clients Dial it with credential and use Call (one item)
// or CallBatch (a group). It has no memory: mailbox WRITE/READ fail.
func (g *Gateway) Target(credential []byte) accel.Target {
	cred := append([]byte(nil), credential...)
	return g.TargetFunc(func(c []byte) error {
		if len(cred) == 0 || subtle.ConstantTimeCompare(c, cred) != 1 {
			return accel.ErrAuth
		}
		return nil
	})
}

// TargetFunc is Target with a caller-supplied authenticator, for a gateway
// shared by several leases (each with its own credential).
func (g *Gateway) TargetFunc(auth func(credential []byte) error) accel.Target {
	return &target{g: g, auth: auth}
}

type target struct {
	g    *Gateway
	auth func([]byte) error
}

func (t *target) Authenticate(c []byte) error {
	if err := t.auth(c); err != nil {
		return fmt.Errorf("%w: gateway %s", accel.ErrAuth, t.g.cfg.Name)
	}
	return nil
}

func (t *target) Info() accel.Info { return t.g.info() }

func (g *Gateway) info() accel.Info {
	role := g.cfg.Role
	if role == "" {
		role = "gateway:" + g.cfg.Name
	}
	return accel.Info{Role: role, Entries: append([]string(nil), g.cfg.Entries...)}
}

func (t *target) WriteMem(uint64, []byte) error {
	return fmt.Errorf("%w: a gateway has no memory; use inline calls", accel.ErrOutOfRange)
}

func (t *target) ReadMem(uint64, uint32) ([]byte, error) {
	return nil, fmt.Errorf("%w: a gateway has no memory; use inline calls", accel.ErrOutOfRange)
}

func (t *target) Execute(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	return t.g.CallGroup(ctx, entry, ins)
}
