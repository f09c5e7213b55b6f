package gateway

import (
	"context"
	"errors"

	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
	"github.com/rialto-project/rialto/internal/metrics"
)

// serveShared serves g over the accel protocol to the holders of cs's
// credentials until the test ends, and returns its address.
func serveShared(t *testing.T, g *Gateway, cs *Credentials) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	tgt := g.SharedTarget(cs)
	go func() { done <- (&accel.Server{Target: tgt}).Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

func dialLease(t *testing.T, addr, cred string) *accel.Conn {
	t.Helper()
	c, err := accel.Dial(context.Background(), addr, []byte(cred))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// leaseStats returns the named lease's counters.
func leaseStats(g *Gateway, name string) (LeaseStats, bool) {
	for _, s := range g.Leases() {
		if s.Lease == name {
			return s, true
		}
	}
	return LeaseStats{}, false
}

// gatedRecorder records every batch's items and holds the first execution
// until open is closed, so that the leases' queues fill up behind it.
type gatedRecorder struct {
	open    chan struct{}
	started chan struct{}
	once    sync.Once
	mu      sync.Mutex
	batches [][]string
}

func (r *gatedRecorder) CallBatch(ctx context.Context, _ string, ins [][]byte) ([][]byte, error) {
	first := false
	r.once.Do(func() { first = true })
	if first {
		close(r.started)
		select {
		case <-r.open:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	names := make([]string, len(ins))
	for i, in := range ins {
		names[i] = string(in)
	}
	r.mu.Lock()
	r.batches = append(r.batches, names)
	r.mu.Unlock()
	return ins, nil
}

// Under saturation, the items served to two leases of weights 1 and 3
// follow the weights (within 10%), and no batch mixes the leases.
func TestFairSharesFollowWeights(t *testing.T) {
	rec := &gatedRecorder{open: make(chan struct{}), started: make(chan struct{})}
	reg := prometheus.NewRegistry()
	g := run(t, Config{Name: "fair", MaxBatch: 4, Workers: 1, QueueLimit: 4096, Metrics: reg}, rec)
	var cs Credentials
	if err := cs.AddWeighted([]byte("cred-light"), "light", 1); err != nil {
		t.Fatal(err)
	}
	if err := cs.AddWeighted([]byte("cred-heavy"), "heavy", 3); err != nil {
		t.Fatal(err)
	}
	addr := serveShared(t, g, &cs)
	const perLease = 160
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 2*perLease+1)
	// One request first: its execution holds the only worker while both
	// leases queue up behind it.
	plug := dialLease(t, addr, "cred-light")
	wg.Add(1)
	go func() { defer wg.Done(); _, err := plug.Call(ctx, "e", []byte("plug")); errs <- err }()
	<-rec.started
	for _, l := range []struct{ cred, item string }{{"cred-light", "L"}, {"cred-heavy", "H"}} {
		c := dialLease(t, addr, l.cred)
		for range perLease {
			wg.Add(1)
			go func() { defer wg.Done(); _, err := c.Call(ctx, "e", []byte(l.item)); errs <- err }()
		}
	}
	waitFor(t, func() bool { return g.received.Load() == 2*perLease+1 })
	close(rec.open)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// While both leases were backlogged: the first perLease items after the
	// plug (each lease still had items queued at the end of them).
	var light, heavy int
	for _, b := range rec.batches[1:] {
		if strings.Contains(strings.Join(b, ""), "L") && strings.Contains(strings.Join(b, ""), "H") {
			t.Fatalf("a batch mixes the leases: %v", b)
		}
		if light+heavy >= perLease {
			break
		}
		for _, it := range b {
			if it == "L" {
				light++
			} else {
				heavy++
			}
		}
	}
	share := float64(heavy) / float64(light+heavy)
	t.Logf("served while backlogged: light %d, heavy %d (heavy's share %.3f, ideal 0.75)", light, heavy, share)
	if share < 0.75*0.9 || share > 0.75*1.1 || float64(light)/float64(light+heavy) < 0.25*0.9 || float64(light)/float64(light+heavy) > 0.25*1.1 {
		t.Fatalf("shares light %d heavy %d: not within 10%% of the weights 1:3", light, heavy)
	}
	// The per-lease series carry the lease names, never a credential.
	for _, l := range []string{"light", "heavy"} {
		v, ok := metrics.Value(reg, "rialto_gateway_lease_served_items_total", "gateway", "fair", "lease", l)
		want := float64(perLease)
		if l == "light" {
			want++ // the plug
		}
		if !ok || v != want {
			t.Fatalf("served items of %s: %v %v, want %v", l, v, ok, want)
		}
		if w, ok := metrics.Value(reg, "rialto_gateway_lease_weight", "lease", l); !ok || (l == "heavy") != (w == 3) {
			t.Fatalf("weight of %s: %v %v", l, w, ok)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if strings.Contains(lp.GetValue(), "cred-") {
					t.Fatalf("%s has a credential in label %s", mf.GetName(), lp.GetName())
				}
			}
		}
	}
	// SetWeight changes the weight; a revoked lease's series go.
	if err := cs.SetWeight([]byte("cred-light"), 2); err != nil {
		t.Fatal(err)
	}
	if w, _ := metrics.Value(reg, "rialto_gateway_lease_weight", "lease", "light"); w != 2 {
		t.Fatalf("weight after SetWeight: %v", w)
	}
	if err := cs.SetWeight([]byte("cred-none"), 2); !errors.Is(err, accel.ErrAuth) {
		t.Fatalf("SetWeight of an unknown credential: %v", err)
	}
	if err := cs.AddWeighted([]byte("cred-x"), "x", 0); !errors.Is(err, ErrConfig) {
		t.Fatalf("weight 0: %v", err)
	}
	cs.Revoke([]byte("cred-heavy"))
	if _, ok := metrics.Value(reg, "rialto_gateway_lease_weight", "lease", "heavy"); ok {
		t.Fatal("a revoked lease's series stayed")
	}
}

// slotGateway starts an appliance with n slots holding role, and a gateway
// over them (each slot a Redialer), served to cs's credentials.
func slotGateway(t *testing.T, n int, role roles.Spec, cfg Config, cs *Credentials) (*appliance.Appliance, *Gateway, string) {
	t.Helper()
	app, backs := slotBackends(t, n, role, max(cfg.Workers, 1))
	g := run(t, cfg, backs...)
	return app, g, serveShared(t, g, cs)
}

// slotBackends starts an appliance with n slots holding role, each running
// workers executions at once, and returns a Redialer for each slot.
func slotBackends(t *testing.T, n int, role roles.Spec, workers int) (*appliance.Appliance, []Backend) {
	t.Helper()
	ctx := context.Background()
	app := startAppliance(t, appliance.Config{Slots: n, SlotMemory: 1 << 16, Workers: workers})
	var backs []Backend
	for i := range n {
		if err := app.Load(ctx, i, role); err != nil {
			t.Fatal(err)
		}
		if err := app.SetCredential(i, []byte("slot-key")); err != nil {
			t.Fatal(err)
		}
		addr, err := app.Addr(i)
		if err != nil {
			t.Fatal(err)
		}
		r := NewRedialer(addr, []byte("slot-key"))
		t.Cleanup(func() { _ = r.Close() })
		backs = append(backs, r)
	}
	return app, backs
}

// busySlots counts the appliance's executions under way.
func busySlots(app *appliance.Appliance) int64 {
	var n int64
	for _, s := range app.Slots() {
		n += s.InFlight
	}
	return n
}

// medianLatency times k echo calls on c. A call that takes 10 s (blocked
// behind another lease's execution, say) fails the test.
func medianLatency(t *testing.T, c *accel.Conn, k int) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ds := make([]time.Duration, k)
	for i := range ds {
		t0 := time.Now()
		if out, err := c.Call(ctx, "echo", []byte("ping")); err != nil || string(out) != "ping" {
			t.Fatalf("echo: %q %v", out, err)
		}
		ds[i] = time.Since(t0)
	}
	slices.Sort(ds)
	return ds[k/2]
}

// bestMedian is the lowest of up to n medians of k echo calls on c,
// stopping at the first at or below limit (0: none, take all n): a loaded
// machine only ever slows a measurement down, while what blocks c's calls
// slows every one.
func bestMedian(t *testing.T, c *accel.Conn, k, n int, limit time.Duration) time.Duration {
	t.Helper()
	best := medianLatency(t, c, k)
	for i := 1; i < n && best > limit; i++ {
		best = min(best, medianLatency(t, c, k))
	}
	return best
}

// A WebAssembly call that never returns, submitted by lease A through a
// shared gateway, is stopped on its slot when A is revoked (its teardown),
// and lease B's calls on the same gateway keep their latency during and
// after it. Each latency is the best of several medians, so that the
// machine's load (and the runaway call, which keeps a CPU busy) does not
// fail the test, while a B blocked behind A's call fails every one.
func TestRevokeStopsRunawayWasm(t *testing.T) {
	cs := Credentials{RevokeWait: 10 * time.Second}
	_ = cs.AddWeighted([]byte("cred-a"), "a", 1)
	_ = cs.AddWeighted([]byte("cred-b"), "b", 1)
	app, g, addr := slotGateway(t, 2, roles.Spec{Name: "wasm", Module: wasmtest.EchoModule()},
		Config{Name: "wasm", MaxBatch: 8, Workers: 2}, &cs)
	a, b := dialLease(t, addr, "cred-a"), dialLease(t, addr, "cred-b")
	const k, tries = 20, 10
	before := bestMedian(t, b, k, 5, 0)
	limit := 4*before + 5*time.Millisecond // a loaded machine's noise, far below a blocked slot

	spun := make(chan error, 1)
	go func() { _, err := a.Call(context.Background(), "spin", nil); spun <- err }()
	waitFor(t, func() bool { return busySlots(app) == 1 })
	during := bestMedian(t, b, k, tries, limit)
	if busySlots(app) != 1 {
		t.Fatal("the runaway call stopped by itself")
	}

	t0 := time.Now()
	if !cs.Revoke([]byte("cred-a")) {
		t.Fatal("revoke")
	}
	revoke := time.Since(t0)
	if err := <-spun; err == nil {
		t.Fatal("the runaway call succeeded")
	}
	// The slot stops the module: wazero closes it once the execution's
	// context ends (CANCEL from the gateway).
	deadline := time.Now().Add(5 * time.Second)
	for busySlots(app) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the slot still runs the revoked lease's call 5 s after Revoke (Revoke took %v)", revoke)
		}
		runtimeGosched()
	}
	stopped := time.Since(t0)
	after := bestMedian(t, b, k, tries, limit)
	t.Logf("lease B's best median latency: before %v, during %v, after %v; Revoke took %v, the slot was free %v after it began",
		before, during, after, revoke, stopped)
	if during > limit || after > limit {
		t.Fatalf("lease B's latency grew: before %v, during %v, after %v (limit %v)", before, during, after, limit)
	}
	if revoke > cs.RevokeWait {
		t.Fatalf("Revoke took %v, above its bound %v", revoke, cs.RevokeWait)
	}
	if _, ok := leaseStats(g, "a"); ok {
		t.Fatal("the revoked lease is still listed")
	}
	// Both slots serve B again.
	for _, s := range app.Slots() {
		if s.Failed > 1 {
			t.Fatalf("slot %d: %d failed tasks", s.ID, s.Failed)
		}
	}
}

// A caller's deadline stops its execution on the slot: the slot becomes
// free, and the lease's cancelled counter says so.
func TestDeadlineStopsSlotExecution(t *testing.T) {
	var cs Credentials
	_ = cs.AddWeighted([]byte("cred-a"), "a", 1)
	reg := prometheus.NewRegistry()
	app, g, addr := slotGateway(t, 1, roles.Spec{Name: "wasm", Module: wasmtest.EchoModule()},
		Config{Name: "dl", MaxBatch: 8, Workers: 1, Metrics: reg}, &cs)
	a := dialLease(t, addr, "cred-a")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := a.Call(ctx, "spin", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("spin: %v", err)
	}
	waitFor(t, func() bool { return busySlots(app) == 0 })
	waitFor(t, func() bool { s, _ := leaseStats(g, "a"); return s.Cancelled == 1 && s.Queued == 0 })
	// The metric is counted just after the lease's figure.
	waitFor(t, func() bool {
		v, _ := metrics.Value(reg, "rialto_gateway_lease_cancelled_total", "lease", "a")
		return v == 1
	})
	// The only slot, with one worker, serves the next call.
	if out, err := a.Call(context.Background(), "echo", []byte("next")); err != nil || string(out) != "next" {
		t.Fatalf("after the deadline: %q %v", out, err)
	}
}

// A tenant that sends only bad items leaves another tenant's batch size
// and throughput within 10% of their values when alone: its items never
// share the other's batches, so its failures never split them into
// one-by-one reruns.
func TestBadTenantIsolated(t *testing.T) {
	key := []byte("0123456789abcdef")
	var cs Credentials
	_ = cs.AddWeighted([]byte("cred-good"), "good", 1)
	_ = cs.AddWeighted([]byte("cred-bad"), "bad", 1)
	// The good tenant's 4 callers fill a batch every MaxQueueDelay: its
	// throughput is set by the gateway's batching, not by the machine, and
	// the workers are enough for both tenants' batches.
	_, g, addr := slotGateway(t, 2, roles.Spec{Name: "aesgcm", Config: key},
		Config{Name: "iso", MaxBatch: 8, MaxQueueDelay: 100 * time.Millisecond, Workers: 4}, &cs)
	good, bad := dialLease(t, addr, "cred-good"), dialLease(t, addr, "cred-bad")
	item := append(make([]byte, 12), "hello"...)
	const callers, rounds = 4, 8
	phase := func(withBad bool) (batch, perSec float64) {
		ctx, stop := context.WithCancel(context.Background())
		var bwg sync.WaitGroup
		if withBad {
			for range callers {
				bwg.Add(1)
				go func() {
					defer bwg.Done()
					for ctx.Err() == nil {
						if _, err := bad.Call(ctx, "seal", []byte("short")); err == nil {
							t.Error("a bad item succeeded")
							return
						}
					}
				}()
			}
			waitFor(t, func() bool { s, _ := leaseStats(g, "bad"); return s.Failed > 0 })
		}
		s0, _ := leaseStats(g, "good")
		t0 := time.Now()
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					if _, err := good.Call(context.Background(), "seal", item); err != nil {
						t.Errorf("good item: %v", err)
						return
					}
				}
			}()
		}
		wg.Wait()
		d := time.Since(t0)
		stop()
		bwg.Wait()
		s1, _ := leaseStats(g, "good")
		items := float64(s1.Service - s0.Service)
		return items / float64(s1.Executions-s0.Executions), items / d.Seconds()
	}
	// Alternate, so that the machine's load hits both alike, and compare
	// the best of each: a loaded machine only ever slows a phase down. At
	// least 3 pairs; up to 8 while the best with the bad tenant is below
	// the bound (the bad tenant's callers themselves load the machine
	// during its phases), which a bad tenant that does hurt never reaches.
	var ab, ap, mb, mp float64
	hurt := func() bool { return mb < 0.9*ab || mp < 0.9*ap }
	for i := 0; i < 3 || (i < 8 && hurt()); i++ {
		b, p := phase(false)
		ab, ap = max(ab, b), max(ap, p)
		b, p = phase(true)
		mb, mp = max(mb, b), max(mp, p)
	}
	t.Logf("good tenant alone: batch %.2f, %.0f items/s; with a bad tenant: batch %.2f, %.0f items/s", ab, ap, mb, mp)
	if hurt() {
		t.Fatalf("the bad tenant hurt the good one: batch %.2f→%.2f, throughput %.0f→%.0f items/s", ab, mb, ap, mp)
	}
	if s, _ := leaseStats(g, "good"); s.Failed != 0 {
		t.Fatalf("good tenant: %d failed requests", s.Failed)
	}
	if s, _ := leaseStats(g, "bad"); s.Served != 0 || s.Failed == 0 {
		t.Fatalf("bad tenant: %+v", s)
	}
}

// A backend taken out of the gateway (its slot reassigned) stops the
// executions running on it, which run again on the remaining backends.
func TestSetInstancesMovesRunningWork(t *testing.T) {
	app, backs := slotBackends(t, 2, roles.Spec{Name: "wasm", Module: wasmtest.EchoModule()}, 2)
	g := run(t, Config{MaxBatch: 4, Workers: 2}, backs...)
	inFlight := func(i int) int64 { st, _ := app.Slot(i); return st.InFlight }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := g.Call(ctx, "spin", nil); done <- err }()
	waitFor(t, func() bool { return inFlight(0)+inFlight(1) == 1 })
	from, to := 0, 1
	if inFlight(1) == 1 {
		from, to = 1, 0
	}
	g.SetInstances([]Backend{backs[to]})
	waitFor(t, func() bool { return inFlight(from) == 0 && inFlight(to) == 1 })
	select {
	case err := <-done:
		t.Fatalf("the call failed when its slot left: %v", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("call: %v", err)
	}
	waitFor(t, func() bool { return inFlight(to) == 0 })
	// A kept backend keeps its executions: the same value is the same
	// instance.
	g.SetInstances([]Backend{backs[to], backs[from]})
	if out, err := g.Call(context.Background(), "echo", []byte("x")); err != nil || string(out) != "x" {
		t.Fatalf("after: %q %v", out, err)
	}
}

// stubborn is a backend that ignores its context (a native kernel with no
// cancellation point) until released.
type stubborn struct {
	started chan struct{}
	release chan struct{}
}

func (s stubborn) CallBatch(_ context.Context, _ string, ins [][]byte) ([][]byte, error) {
	s.started <- struct{}{}
	<-s.release
	return ins, nil
}

// Revoke waits at most RevokeWait for the revoked lease's executions, so a
// teardown never waits for a runaway that ignores cancellation.
func TestRevokeIsBounded(t *testing.T) {
	s := stubborn{started: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(s.release)
	g := run(t, Config{MaxBatch: 4}, s)
	cs := Credentials{RevokeWait: 50 * time.Millisecond}
	_ = cs.AddWeighted([]byte("cred-a"), "a", 1)
	a := dialLease(t, serveShared(t, g, &cs), "cred-a")
	done := make(chan error, 1)
	go func() { _, err := a.Call(context.Background(), "e", []byte("x")); done <- err }()
	<-s.started
	revoked := make(chan struct{})
	go func() { cs.Revoke([]byte("cred-a")); close(revoked) }()
	select {
	case <-revoked:
	case <-time.After(10 * time.Second):
		t.Fatal("Revoke waited for an execution that ignores cancellation")
	}
	if err := <-done; err == nil {
		t.Fatal("the revoked lease's call succeeded")
	}
}
