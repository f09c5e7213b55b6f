package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	memclient "github.com/rialto-project/rialto/internal/dataplane/memory/client"
)

// TestDelayedPrepareExpiry: a prepare counts its lease's time left from
// the earliest it can have left the control plane, its TimeoutSeconds
// before it arrived. Delayed on its way by up to that bound (after which
// the control plane gives the call up), it never makes the agent serve
// the export past the lease's real expiry, whatever the delay; without
// the bound (an older control plane) the time left is counted from the
// arrival, as before.
func TestDelayedPrepareExpiry(t *testing.T) {
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name    string
		timeout float64       // the prepare's TimeoutSeconds
		delay   time.Duration // on its way to the agent
		// stops is when the agent stops serving the export, counted
		// from when the control plane sent the prepare.
		stops time.Duration
	}{
		{name: "on time", timeout: 2, delay: 0, stops: ttl - 2*time.Second},
		{name: "delayed", timeout: 2, delay: 1500 * time.Millisecond, stops: ttl - 500*time.Millisecond},
		{name: "delayed by the bound", timeout: 2, delay: 2 * time.Second, stops: ttl},
		{name: "older control plane", timeout: 0, delay: 0, stops: ttl},
		{name: "older control plane delayed", timeout: 0, delay: time.Second, stops: ttl + time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, srv := newFakeCP(t)
			clk := clock.NewFake(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
			cpNow := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // the clocks need not agree
			cfg := testConfig(srv.URL, t.TempDir())
			cfg.Clock = clk
			a := start(t, cfg).a
			ctx := ctxFor(t)
			sent := clk.Now() // when the control plane sent it, on the agent's clock
			clk.Advance(tc.delay)
			resp, err := a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
				Length: leaseSize, Export: "x_lease-a", ExpiresAt: cpNow.Add(ttl), Now: cpNow, TimeoutSeconds: tc.timeout})
			if err != nil {
				t.Fatal(err)
			}
			cp.set(func(f *fakeCP) { f.down = true })
			at := func(d time.Duration) bool {
				t.Helper()
				clk.Advance(sent.Add(d).Sub(clk.Now()))
				a.Heartbeat(ctx)
				return served(t, resp.URI)
			}
			if !at(tc.stops - time.Millisecond) {
				t.Fatalf("stopped before %v after the prepare was sent", tc.stops)
			}
			if at(tc.stops) {
				t.Fatalf("served %v after the prepare was sent (the lease expires %v after)", tc.stops, ttl)
			}
		})
	}
}

// TestPrepareWithNoTimeLeft: a prepare whose lease has no time left once
// the most time it may have spent on its way is deducted is prepared (the
// control plane gets its URI) but not served, as if its expiry had passed:
// a suspending driver keeps it suspended, another holds it. An answer
// that shows the lease's old expiry keeps it so; one that shows it
// renewed serves it.
func TestPrepareWithNoTimeLeft(t *testing.T) {
	type reachFunc func(ctx context.Context, uri string) bool
	block := func(ctx context.Context, uri string) bool { return served(t, uri) }
	memory := func(ctx context.Context, uri string) bool {
		addr, cred := memoryTarget(t, uri)
		c, err := memclient.Dial(ctx, addr, cred, memclient.Options{})
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
	slot := func(ctx context.Context, uri string) bool {
		u, cred := accelURI(t, uri)
		c, err := accel.Dial(ctx, u.Host, []byte(cred))
		if err != nil {
			return false
		}
		defer c.Close()
		out, err := c.Call(ctx, "echo", []byte("ping"))
		return err == nil && bytes.Equal(out, []byte("ping"))
	}
	for _, tc := range []struct {
		name  string
		req   api.PrepareRequest
		reach reachFunc
		state string // rialto_agent_exports_withheld's while not served
	}{
		{"block", api.PrepareRequest{Kind: api.KindBlock, DeviceName: "disk0", Length: leaseSize}, block, "suspended"},
		{"memory", api.PrepareRequest{Kind: api.KindMemory, DeviceName: "mem0", Length: 1 << 20}, memory, "suspended"},
		{"accel", api.PrepareRequest{Kind: api.KindAccel, DeviceName: "gpu", Length: api.SlotUnits, Role: "echo"}, slot, "held"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, srv := newFakeCP(t)
			clk := clock.NewFake(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
			cpNow := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			cfg := testConfig(srv.URL, t.TempDir())
			cfg.Devices = append(cfg.Devices, DeviceConfig{Name: "mem0", Kind: api.KindMemory, Size: 4 << 20})
			cfg.Clock = clk
			a := start(t, cfg).a
			ctx := ctxFor(t)
			req := tc.req
			req.LeaseID, req.Export = "lease-a", "x_lease-a"
			req.ExpiresAt, req.Now, req.TimeoutSeconds = cpNow.Add(time.Second), cpNow, 2
			resp, err := a.Prepare(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.URI == "" {
				t.Fatal("prepared without a URI")
			}
			if tc.reach(ctx, resp.URI) {
				t.Fatal("a lease with no time left is served")
			}
			if n := testutil.ToFloat64(a.mWithheld.WithLabelValues(tc.state)); n != 1 {
				t.Errorf("%v exports %s, want 1", n, tc.state)
			}
			if n := testutil.ToFloat64(a.mPrepares.WithLabelValues("held")); n != 1 {
				t.Errorf("%v prepares held back, want 1", n)
			}

			// The answer shows the lease's expiry, passed: still not served.
			cp.set(func(f *fakeCP) {
				f.now = cpNow.Add(time.Second)
				f.expires = map[string]time.Time{"lease-a": cpNow.Add(time.Second)}
			})
			if err := a.Heartbeat(ctx); err != nil {
				t.Fatal(err)
			}
			if tc.reach(ctx, resp.URI) {
				t.Fatal("served without a renewal")
			}
			// Renewed: served.
			cp.set(func(f *fakeCP) { f.expires["lease-a"] = cpNow.Add(time.Hour) })
			if err := a.Heartbeat(ctx); err != nil {
				t.Fatal(err)
			}
			a.mu.Lock()
			uri := a.exports["x_lease-a"].servedURI()
			a.mu.Unlock()
			if !tc.reach(ctx, uri) {
				t.Fatal("not served once renewed")
			}
		})
	}
}

// gaveUpDriver is the block driver whose caller gives up while it
// prepares an export (cancel), as the control plane does once its call's
// bound passes during a slow prepare.
type gaveUpDriver struct {
	*BlockDriver
	cancel *atomic.Pointer[context.CancelFunc] // nil: nobody gives up
}

func (d gaveUpDriver) Prepare(ctx context.Context, e Export) (api.PrepareResponse, error) {
	resp, err := d.BlockDriver.Prepare(ctx, e)
	if c := d.cancel.Load(); c != nil {
		(*c)()
	}
	return resp, err
}

// goneCtx is the context of a caller that gave up before the agent got
// to its call: done already.
func goneCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(ctxFor(t))
	cancel()
	return ctx
}

// givingUp runs call as a caller that gives up while it is under way:
// with a context that the driver (which calls giveUp's function, if set)
// ends meanwhile.
func givingUp[T any](t *testing.T, giveUp *atomic.Pointer[context.CancelFunc], call func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	giveUp.Store(&cancel)
	defer giveUp.Store(nil)
	return call(ctx)
}

// TestPrepareCallerGaveUp: a prepare whose caller gave up (the control
// plane, past its call's bound, counts it failed) is not served: refused
// if the caller is gone before the agent gets to it, kept not served if
// the caller goes while it is prepared. An answer whose heartbeat left
// before that prepare does not serve it, even though it lists the lease;
// the next answer, which no longer lists its range, drops it and wipes
// the range.
func TestPrepareCallerGaveUp(t *testing.T) {
	cp, srv := newFakeCP(t)
	dir := t.TempDir()
	cfg := testConfig(srv.URL, dir)
	var giveUp atomic.Pointer[context.CancelFunc]
	cfg.Drivers = map[api.Kind]Driver{api.KindBlock: gaveUpDriver{BlockDriver: NewBlockDriver(slog.New(slog.DiscardHandler)), cancel: &giveUp}}
	a := start(t, cfg).a
	kept := prepareExport(t, a, "lease-a", "x_part0", 0, leaseSize) // served before
	part1 := api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Offset: leaseSize, Length: leaseSize, Export: "x_part1"}

	// Gone before the agent got to it: refused, nothing prepared.
	if _, err := a.Prepare(goneCtx(t), part1); !errors.Is(err, ErrGaveUp) {
		t.Fatalf("a prepare whose caller is gone: %v, want ErrGaveUp", err)
	}
	a.mu.Lock()
	_, exists := a.exports["x_part1"]
	a.mu.Unlock()
	if exists {
		t.Fatal("a prepare whose caller was gone was recorded")
	}

	// Gone while it is prepared, and while a heartbeat's answer is on its way.
	in, next := make(chan struct{}), make(chan struct{})
	cp.set(func(f *fakeCP) {
		f.beatIn, f.beatGo = in, next
		f.expires = map[string]time.Time{"lease-a": time.Now().Add(time.Hour)}
	})
	done := make(chan error, 1)
	go func() { done <- a.Heartbeat(ctxFor(t)) }()
	<-in
	resp, err := givingUp(t, &giveUp, func(ctx context.Context) (api.PrepareResponse, error) { return a.Prepare(ctx, part1) })
	if !errors.Is(err, ErrGaveUp) {
		t.Fatalf("a prepare whose caller gave up meanwhile: %v, want ErrGaveUp", err)
	}
	a.mu.Lock()
	uri := a.exports["x_part1"].servedURI()
	a.mu.Unlock()
	if resp.URI != "" || uri == "" {
		t.Fatalf("answer %q, export kept at %q", resp.URI, uri)
	}
	if served(t, uri) {
		t.Fatal("a prepare whose caller gave up is served")
	}
	close(next) // the answer lists lease-a, renewed
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if served(t, uri) {
		t.Fatal("an answer whose heartbeat left before the prepare served it")
	}
	if !served(t, kept) {
		t.Fatal("the lease's other part stopped")
	}

	// The control plane gave the placement up: the next answer lists
	// only the part it has here.
	cp.set(func(f *fakeCP) { f.parts = map[string][]api.PartRef{"lease-a": {{Offset: 0, Length: leaseSize}}} })
	if err := a.Heartbeat(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	_, exists = a.exports["x_part1"]
	a.mu.Unlock()
	if exists || served(t, uri) {
		t.Fatal("the given-up export was not dropped")
	}
	if !served(t, kept) {
		t.Fatal("the lease's other part stopped")
	}
}
