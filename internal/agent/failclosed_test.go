package agent

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	memclient "github.com/rialto-project/rialto/internal/dataplane/memory/client"
)

func (f *fakeCP) set(fn func(f *fakeCP)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// served reports whether the export answers a handshake at uri.
func served(t *testing.T, uri string) bool {
	t.Helper()
	c, err := nbd.DialURI(ctxFor(t), uri)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// exportAt reports whether the data plane at addr serves the export
// name: true if it opens, false if the data plane answers that it knows
// no such export. Any other outcome (nothing listening, a handshake that
// fails otherwise) fails the test: it would tell nothing about the
// export.
func exportAt(t *testing.T, addr, name string) bool {
	t.Helper()
	c, err := nbd.Dial(ctxFor(t), "tcp", addr, name)
	switch {
	case err == nil:
		c.Close()
		return true
	case errors.Is(err, nbd.ErrExportNotFound):
		return false
	}
	t.Fatalf("the data plane at %s did not answer for the export: %v", addr, err)
	return false
}

// TestRestoredExportHeldUntilConfirmed: a restarted agent restores its
// exports held: while the control plane does not answer its heartbeats
// not even a first request reaches one, wherever the restarted agent's
// data plane listens (at its last address, or at a new one when that is
// taken); the answer that lists the lease serves it, bytes intact.
func TestRestoredExportHeldUntilConfirmed(t *testing.T) {
	for _, taken := range []bool{false, true} {
		t.Run(map[bool]string{false: "same address", true: "address taken"}[taken], func(t *testing.T) {
			cp, srv := newFakeCP(t)
			dir := t.TempDir()
			cfg := testConfig(srv.URL, dir)
			r := start(t, cfg)
			ua := prepareBlock(t, r.a, "lease-a", 0, leaseSize)
			u, err := nbd.ParseURI(ua)
			if err != nil {
				t.Fatal(err)
			}
			data := bytes.Repeat([]byte("kept "), leaseSize/5+1)[:leaseSize]
			nbdWrite(t, ua, data, 0)
			old := r.a.Endpoint(api.KindBlock)
			r.halt(t)

			var squatter net.Listener
			if taken {
				// Someone else took the data plane's port meanwhile.
				if squatter, err = net.Listen("tcp", old); err != nil {
					t.Fatal(err)
				}
				defer squatter.Close()
			}
			cp.set(func(f *fakeCP) { f.down = true })
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			// The first request is made before the agent's join: its
			// data plane serves, the restored exports are held, and no
			// heartbeat has been sent.
			reached, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			hold := func(ctx context.Context) {
				once.Do(func() {
					close(reached)
					select {
					case <-release:
					case <-ctx.Done():
					}
				})
			}
			a.Faults.BeforeJoin.Store(&hold)
			ctx, cancel := context.WithCancel(context.Background())
			rr := &running{a: a, stop: cancel, done: make(chan error, 1)}
			go func() { rr.done <- a.Run(ctx) }()
			t.Cleanup(func() { rr.halt(t) })
			select {
			case <-reached:
			case err := <-rr.done:
				rr.done <- err
				t.Fatalf("agent stopped before its join: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("the restarted agent did not join")
			}
			addr := a.Endpoint(api.KindBlock)
			if taken == (addr == old) {
				t.Fatalf("address taken %v: the restarted data plane is at %s, it was at %s", taken, addr, old)
			}
			if exportAt(t, addr, u.Export) {
				t.Fatal("a restored export answered the first request, before the control plane confirmed it")
			}
			close(release)
			select {
			case <-a.Ready():
			case err := <-rr.done:
				rr.done <- err
				t.Fatalf("agent stopped before ready: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("agent not ready")
			}
			if squatter != nil {
				squatter.Close() // the old address refuses connections from now on
			}
			if got := a.Leases(); len(got) != 1 || got[0] != "lease-a" {
				t.Fatalf("leases after the restart: %v", got)
			}
			if exportAt(t, addr, u.Export) {
				t.Fatal("a restored export is served before the control plane confirmed it")
			}
			if !taken && served(t, ua) {
				t.Fatal("a restored export is served at its old URI before the control plane confirmed it")
			}
			if err := a.Heartbeat(ctxFor(t)); err == nil {
				t.Fatal("heartbeat to a control plane that is down succeeded")
			}
			if exportAt(t, addr, u.Export) {
				t.Fatal("a restored export is served while the control plane is down")
			}

			cp.set(func(f *fakeCP) { f.down = false })
			if err := a.Heartbeat(ctxFor(t)); err != nil {
				t.Fatal(err)
			}
			uri := (&url.URL{Scheme: "nbd", Host: addr, Path: "/" + u.Export}).String()
			if got := nbdRead(t, uri, leaseSize, 0); !bytes.Equal(got, data) {
				t.Fatal("the confirmed export lost its bytes")
			}
			if n := testutil.ToFloat64(a.mWithheld.WithLabelValues("held")); n != 0 {
				t.Errorf("%v exports still held", n)
			}
		})
	}
}

// TestRestoredLostLeaseWipedUnserved: the control plane's first answer to
// a restarted agent tears down a lease it declared lost: the export is
// never served and its range is wiped.
func TestRestoredLostLeaseWipedUnserved(t *testing.T) {
	cp, srv := newFakeCP(t)
	dir := t.TempDir()
	cfg := testConfig(srv.URL, dir)
	r := start(t, cfg)
	ua := prepareBlock(t, r.a, "lease-a", 0, leaseSize)
	nbdWrite(t, ua, bytes.Repeat([]byte{9}, leaseSize), 0)
	r.halt(t)

	cp.set(func(f *fakeCP) { f.teardown = []string{"lease-a"} })
	a := start(t, cfg).a // ready once the first answer is applied
	if got := a.Leases(); len(got) != 0 {
		t.Fatalf("leases after the restart: %v", got)
	}
	if served(t, ua) {
		t.Fatal("a lost lease's export is served")
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), make([]byte, leaseSize)) {
		t.Fatal("the lost lease's range was not wiped")
	}
	if n := testutil.ToFloat64(a.mRestored.WithLabelValues("dropped")); n != 1 {
		t.Errorf("%v restored exports dropped, want 1", n)
	}
}

// TestExpiryWithoutControlPlane: while the control plane is unreachable
// the agent serves a lease until its known expiry, then stops (closing open
// connections) and keeps the bytes; an answer that shows the lease renewed
// serves it again; an answer with the old expiry keeps it stopped; a
// lease whose expiry the agent does not know stops at the first
// unanswered heartbeat.
func TestExpiryWithoutControlPlane(t *testing.T) {
	cp, srv := newFakeCP(t)
	dir := t.TempDir()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg := testConfig(srv.URL, dir)
	cfg.Clock = clk
	a := start(t, cfg).a
	ctx := ctxFor(t)
	exp := clk.Now().Add(time.Minute)
	resp, err := a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-a", ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	ua := resp.URI
	uz := prepareBlock(t, a, "lease-z", leaseSize, 4096) // no expiry known
	data := bytes.Repeat([]byte("until expiry "), leaseSize/13+1)[:leaseSize]
	nbdWrite(t, ua, data, 0)

	cp.set(func(f *fakeCP) { f.down = true })
	open, err := nbd.DialURI(ctx, ua)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	clk.Advance(59 * time.Second)
	if err := a.Heartbeat(ctx); err == nil {
		t.Fatal("heartbeat to a control plane that is down succeeded")
	}
	if !served(t, ua) {
		t.Fatal("a lease before its expiry stopped with the control plane")
	}
	if served(t, uz) {
		t.Fatal("a lease of unknown expiry is served without the control plane")
	}

	clk.Advance(time.Second)
	a.Heartbeat(ctx)
	if served(t, ua) {
		t.Fatal("an expired lease is served without the control plane")
	}
	if _, err := open.ReadAtContext(ctx, make([]byte, 4096), 0); err == nil {
		t.Fatal("a connection opened before the expiry still reads")
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), data) {
		t.Fatal("the expired lease's bytes were not kept")
	}

	// The control plane answers again with the old expiry: still stopped.
	cp.set(func(f *fakeCP) { f.down, f.expires = false, map[string]time.Time{"lease-a": exp} })
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if served(t, ua) {
		t.Fatal("served again without a renewal")
	}
	// Renewed: served again, bytes intact.
	cp.set(func(f *fakeCP) { f.expires["lease-a"] = clk.Now().Add(time.Hour) })
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if got := nbdRead(t, ua, leaseSize, 0); !bytes.Equal(got, data) {
		t.Fatal("the renewed lease lost its bytes")
	}
	if n := testutil.ToFloat64(a.mSuspends.WithLabelValues("block")); n != 2 {
		t.Errorf("%v suspensions counted, want 2", n)
	}
}

// TestExpiredMemoryLeaseKeepsItsBytes: a memory lease whose expiry passes
// without the control plane is suspended, not wiped: its region refuses
// connections until a renewal shows up, and then holds the same bytes.
func TestExpiredMemoryLeaseKeepsItsBytes(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Devices = append(cfg.Devices, DeviceConfig{Name: "mem0", Kind: api.KindMemory, Size: 4 << 20})
	cfg.Clock = clk
	a := start(t, cfg).a
	ctx := ctxFor(t)
	mc, addr, cred := dialMemory(t, a, api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindMemory, DeviceName: "mem0",
		Length: 1 << 20, Export: "x_lease-m", ExpiresAt: clk.Now().Add(time.Minute)})
	want := bytes.Repeat([]byte("memory kept "), 400)
	if err := mc.Write(ctx, memclient.ChannelSync, want, 4096); err != nil {
		t.Fatal(err)
	}
	mc.Close()

	cp.set(func(f *fakeCP) { f.down = true })
	clk.Advance(time.Minute)
	a.Heartbeat(ctx)
	if c, err := memclient.Dial(ctx, addr, cred, memclient.Options{}); err == nil {
		c.Close()
		t.Fatal("an expired memory lease is served without the control plane")
	}
	cp.set(func(f *fakeCP) {
		f.down, f.expires = false, map[string]time.Time{"lease-m": clk.Now().Add(time.Hour)}
	})
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	mc, err := memclient.Dial(ctx, addr, cred, memclient.Options{})
	if err != nil {
		t.Fatalf("the renewed memory lease: %v", err)
	}
	defer mc.Close()
	got := make([]byte, len(want))
	if err := mc.Read(ctx, memclient.ChannelSync, got, 4096); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the renewed memory lease's bytes: %v (equal: %v)", err, bytes.Equal(got, want))
	}
}

// memoryTarget splits a rialto-mem:// URI into address and credential.
func memoryTarget(t *testing.T, uri string) (string, string) {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host, strings.TrimPrefix(u.Path, "/")
}

// TestExpiryCountsTimeLeft: the agent counts a lease's time left on its
// own clock, whatever the control plane's clock says: with the control
// plane's clock a year behind, a lease with a minute left is served for a
// minute (not stopped at once), and a renewal read from a heartbeat
// answer extends it from when the heartbeat left.
func TestExpiryCountsTimeLeft(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
	cpNow := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Clock = clk
	a := start(t, cfg).a
	ctx := ctxFor(t)
	resp, err := a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-a", ExpiresAt: cpNow.Add(time.Minute), Now: cpNow})
	if err != nil {
		t.Fatal(err)
	}
	cp.set(func(f *fakeCP) { f.down = true })
	clk.Advance(59 * time.Second)
	a.Heartbeat(ctx)
	if !served(t, resp.URI) {
		t.Fatal("a lease with time left stopped: the clocks were compared")
	}
	// The control plane answers at its 00:00:59 that the lease runs to
	// 00:02:00: 61 s left, counted from when the heartbeat left.
	cp.set(func(f *fakeCP) {
		f.down, f.now = false, cpNow.Add(59*time.Second)
		f.expires = map[string]time.Time{"lease-a": cpNow.Add(2 * time.Minute)}
	})
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	cp.set(func(f *fakeCP) { f.down = true })
	clk.Advance(60 * time.Second)
	a.Heartbeat(ctx)
	if !served(t, resp.URI) {
		t.Fatal("the renewal was not counted")
	}
	clk.Advance(time.Second)
	a.Heartbeat(ctx)
	if served(t, resp.URI) {
		t.Fatal("served past the renewed expiry without the control plane")
	}
}

// TestUnwantedPartOfKeptLeaseWiped: the control plane's answer lists the
// parts of a lease a lender is to serve. A restarted agent holding two
// exports of one lease, of which the answer wants one (the other moved
// away before the restart, and this is a stale copy of it), never serves
// the stale one and wipes its range, and serves the other, bytes intact;
// a running agent drops a served part the answer stops listing (lost, or
// moved away) the same way.
func TestUnwantedPartOfKeptLeaseWiped(t *testing.T) {
	cp, srv := newFakeCP(t)
	dir := t.TempDir()
	cfg := testConfig(srv.URL, dir)
	r := start(t, cfg)
	prep := func(a *Agent, export string, off int64) string {
		t.Helper()
		return prepareExport(t, a, "lease-a", export, off, leaseSize)
	}
	stale := prep(r.a, "x_part0", 0)
	kept := prep(r.a, "x_part1", leaseSize)
	nbdWrite(t, stale, bytes.Repeat([]byte{7}, leaseSize), 0)
	data := bytes.Repeat([]byte("kept "), leaseSize/5+1)[:leaseSize]
	nbdWrite(t, kept, data, 0)
	r.halt(t)

	// The prepares named the device by name only: the ranges' device ID
	// is empty.
	cp.set(func(f *fakeCP) {
		f.parts = map[string][]api.PartRef{"lease-a": {{Offset: leaseSize, Length: leaseSize}}}
	})
	a0 := start(t, cfg).a // ready once the first answer is applied
	if served(t, stale) {
		t.Fatal("a stale part of a lease kept here is served")
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), make([]byte, leaseSize)) {
		t.Fatal("the stale part's range was not wiped")
	}
	if got := nbdRead(t, kept, leaseSize, 0); !bytes.Equal(got, data) {
		t.Fatal("the wanted part lost its bytes")
	}
	if got := a0.Leases(); len(got) != 1 || got[0] != "lease-a" {
		t.Fatalf("leases: %v", got)
	}

	// Running: the answer stops listing the served part; another range
	// is listed instead (the lease keeps a part here).
	other := prep(a0, "x_part2", 2*leaseSize)
	cp.set(func(f *fakeCP) {
		f.parts = map[string][]api.PartRef{"lease-a": {{Offset: 2 * leaseSize, Length: leaseSize}}}
	})
	if err := a0.Heartbeat(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if served(t, kept) {
		t.Fatal("a part no longer listed is still served")
	}
	if !bytes.Equal(diskBytes(t, dir, leaseSize, leaseSize), make([]byte, leaseSize)) {
		t.Fatal("the dropped part's range was not wiped")
	}
	if !served(t, other) {
		t.Fatal("the listed part stopped")
	}
}

// TestAnswerDoesNotJudgeLaterPrepares: a heartbeat answer says what the
// control plane wanted when it read the lease, which may be before a
// prepare that reaches the agent while the answer is on its way (the
// lease placed again here, at another range, after a failed prepare
// round). An export prepared after the heartbeat left is not torn down,
// nor its range wiped, by that answer: neither as a range the answer does
// not list, nor by a teardown of its lease.
func TestAnswerDoesNotJudgeLaterPrepares(t *testing.T) {
	for _, teardown := range []bool{false, true} {
		cp, srv := newFakeCP(t)
		dir := t.TempDir()
		a := start(t, testConfig(srv.URL, dir)).a
		prep := func(export string, off int64) string {
			t.Helper()
			return prepareExport(t, a, "lease-a", export, off, leaseSize)
		}
		prep("x_first", 0) // the earlier placement
		in, next := make(chan struct{}), make(chan struct{})
		cp.set(func(f *fakeCP) {
			f.beatIn, f.beatGo = in, next
			if teardown {
				f.teardown = []string{"lease-a"} // read after the lease left this node
			} else {
				f.parts = map[string][]api.PartRef{"lease-a": {{Offset: 0, Length: leaseSize}}} // read before it was placed again
			}
		})
		done := make(chan error, 1)
		go func() { done <- a.Heartbeat(ctxFor(t)) }()
		<-in
		// While the answer is on its way: the earlier placement's
		// teardown, then the lease placed here again at another range.
		if err := a.Teardown(ctxFor(t), "lease-a"); err != nil {
			t.Fatal(err)
		}
		uri := prep("x_again", 2*leaseSize)
		data := bytes.Repeat([]byte("placed again "), leaseSize/13+1)[:leaseSize]
		nbdWrite(t, uri, data, 0)
		close(next)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !served(t, uri) {
			t.Errorf("teardown %v: an export prepared after the heartbeat left was stopped by its answer", teardown)
		}
		if !bytes.Equal(diskBytes(t, dir, 2*leaseSize, leaseSize), data) {
			t.Errorf("teardown %v: an export prepared after the heartbeat left was wiped by its answer", teardown)
		}
	}
}

// TestExpiryDuringSlowRound: a heartbeat round the control plane does
// not answer does not keep an export served past its lease's known
// expiry: the export stops at the expiry exactly while the round is under
// way, and the round gives up expiryRoundTimeout after it (on the agent's
// clock), even when it began before the expiry was due.
func TestExpiryDuringSlowRound(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a, drv := expiryAgent(t, srv.URL, clk)
	exp := clk.Now().Add(time.Minute)
	resp, err := a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-a", ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	in, next := holdNextBeat(cp)
	defer close(next)
	done := make(chan error, 1)
	go func() { done <- a.Heartbeat(ctxFor(t)) }()
	<-in // the control plane has the heartbeat, and does not answer
	clk.Advance(time.Minute)
	if at := within(t, drv.stopped, "served past its known expiry while a round was under way"); !at.Equal(exp) {
		t.Fatalf("stopped at %v, its known expiry is %v", at, exp)
	}
	if served(t, resp.URI) {
		t.Fatal("served past its known expiry while the control plane did not answer")
	}
	clk.Advance(expiryRoundTimeout)
	if err := within(t, done, "the round went on past the lease's expiry and the bound after it"); err == nil {
		t.Fatal("an unanswered heartbeat succeeded")
	}
}

// TestExpiryDuringRejoin: an agent the control plane no longer knows
// (401) joins again; a join the control plane does not answer does not
// keep an export served past its lease's known expiry either: it stops at
// the expiry exactly, and the join is given up expiryRoundTimeout after.
func TestExpiryDuringRejoin(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a, drv := expiryAgent(t, srv.URL, clk)
	exp := clk.Now().Add(time.Minute)
	resp, err := a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-a", ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	in, next := make(chan struct{}), make(chan struct{})
	cp.set(func(f *fakeCP) { f.forgetful, f.joinIn, f.joinGo = true, in, next })
	ctx, cancel := context.WithCancel(ctxFor(t))
	done := make(chan error, 1)
	go func() { done <- a.Heartbeat(ctx) }()
	defer func() {
		close(next)
		cancel()
		<-done
	}()
	<-in // the join has reached the control plane, which does not answer
	clk.Advance(time.Minute)
	if at := within(t, drv.stopped, "served past its known expiry while joining again"); !at.Equal(exp) {
		t.Fatalf("stopped at %v, its known expiry is %v", at, exp)
	}
	if served(t, resp.URI) {
		t.Fatal("served past its known expiry while joining again")
	}
	// The join given up, the agent waits to try again: the one timer
	// (the heartbeat loop, with nothing served, waits for its round,
	// which waits for the join).
	clk.Advance(expiryRoundTimeout)
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := clk.BlockUntil(wctx, 1); err != nil {
		t.Fatal("the join went on past the lease's expiry and the bound after it")
	}
}
