package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// noticingDriver is the block driver, telling the time on its clock each
// time it stops serving an export (Suspend: stopped) or serves one again
// (Resume: resumed).
type noticingDriver struct {
	*BlockDriver
	clk              clock.Clock
	stopped, resumed chan time.Time
}

func newNoticingDriver(clk clock.Clock) noticingDriver {
	return noticingDriver{BlockDriver: NewBlockDriver(slog.New(slog.DiscardHandler)), clk: clk,
		stopped: make(chan time.Time, 16), resumed: make(chan time.Time, 16)}
}

func (d noticingDriver) Suspend(ctx context.Context, e Export) error {
	err := d.BlockDriver.Suspend(ctx, e)
	if err == nil {
		d.stopped <- d.clk.Now()
	}
	return err
}

func (d noticingDriver) Resume(ctx context.Context, e Export) error {
	err := d.BlockDriver.Resume(ctx, e)
	if err == nil {
		d.resumed <- d.clk.Now()
	}
	return err
}

// expiryConfig is the configuration of an agent on clk whose block
// driver is a noticingDriver.
func expiryConfig(t *testing.T, url string, clk *clock.Fake) (Config, noticingDriver) {
	drv := newNoticingDriver(clk)
	cfg := testConfig(url, t.TempDir())
	cfg.Clock = clk
	cfg.Drivers = map[api.Kind]Driver{api.KindBlock: drv}
	return cfg, drv
}

// expiryAgent starts an agent on clk whose block driver is a
// noticingDriver, and waits until its heartbeat loop waits for its next
// round (an hour away: the fake control plane's interval).
func expiryAgent(t *testing.T, url string, clk *clock.Fake) (*Agent, noticingDriver) {
	t.Helper()
	cfg, drv := expiryConfig(t, url, clk)
	a := start(t, cfg).a
	if err := clk.BlockUntil(ctxFor(t), 1); err != nil {
		t.Fatal(err)
	}
	return a, drv
}

// prepareExpiring prepares lease-a's block export on a, expiring at exp,
// and opens a connection to it (closed when the test ends): it returns
// the export's URI and the connection.
func prepareExpiring(t *testing.T, a *Agent, exp time.Time) (string, *nbd.Client) {
	t.Helper()
	resp, err := a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-a", ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	open, err := nbd.DialURI(ctxFor(t), resp.URI)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { open.Close() })
	return resp.URI, open
}

// within returns what ch gets, failing the test with what if nothing
// comes within 10 s (of real time: the agent's goroutines run meanwhile).
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
	panic("unreachable")
}

// holdNextBeat makes the fake control plane hold the next heartbeat: in
// gets a value once it has arrived, and its answer is computed once
// answer is closed.
func holdNextBeat(cp *fakeCP) (in <-chan struct{}, answer chan<- struct{}) {
	i, n := make(chan struct{}), make(chan struct{})
	cp.set(func(f *fakeCP) { f.beatIn, f.beatGo = i, n })
	return i, n
}

// roundsDone waits for the heartbeat round under way, if any, to end.
func roundsDone(a *Agent) {
	a.hbMu.Lock()
	//lint:ignore SA2001 an empty critical section waits for the round in flight
	a.hbMu.Unlock()
}

// TestExpiryEarlierThanHeartbeatWait: a prepare whose lease has less time
// left than the heartbeat loop's wait (an hour here) stops being served at
// its expiry exactly while the control plane is unreachable, not when the
// loop would have woken for its next round; its open connections end.
func TestExpiryEarlierThanHeartbeatWait(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a, drv := expiryAgent(t, srv.URL, clk)
	ctx := ctxFor(t)
	cp.set(func(f *fakeCP) { f.down = true })
	exp := clk.Now().Add(30 * time.Second)
	uri, open := prepareExpiring(t, a, exp)

	clk.Advance(exp.Sub(clk.Now()) - time.Nanosecond)
	if !served(t, uri) {
		t.Fatal("stopped before its known expiry")
	}
	clk.Advance(time.Nanosecond)
	if at := within(t, drv.stopped, "still served 10 s after its known expiry: the agent did not wake for an expiry earlier than its heartbeat wait"); !at.Equal(exp) {
		t.Fatalf("stopped at %v, its known expiry is %v", at, exp)
	}
	if served(t, uri) {
		t.Fatal("served past its known expiry")
	}
	if _, err := open.ReadAtContext(ctx, make([]byte, 4096), 0); err == nil {
		t.Fatal("a connection opened before the expiry still reads")
	}
}

// TestExpiryAskedAhead: the agent asks the control plane about a lease
// expiryAskAhead before its known expiry (here one a prepare brought,
// earlier than the heartbeat loop's wait). A renewal the control plane
// has by then keeps the export served past the old expiry without a
// break. Without one, the export stops at its expiry exactly, before
// the agent asks again, and is not served while that round is under way;
// an answer that shows the lease renewed serves it again.
func TestExpiryAskedAhead(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a, drv := expiryAgent(t, srv.URL, clk)
	ctx := ctxFor(t)
	exp, renewed := clk.Now().Add(30*time.Second), clk.Now().Add(90*time.Second)
	// The control plane has the renewal; the agent does not know it yet.
	cp.set(func(f *fakeCP) { f.expires = map[string]time.Time{"lease-a": renewed} })
	uri, open := prepareExpiring(t, a, exp)

	in, answer := holdNextBeat(cp)
	clk.Advance(exp.Add(-expiryAskAhead).Sub(clk.Now()))
	within(t, in, "the agent did not ask the control plane before the lease's known expiry")
	in, next := holdNextBeat(cp)
	close(answer) // renewed
	roundsDone(a)

	// Past the old expiry, up to when the agent asks about the new one.
	clk.Advance(renewed.Add(-expiryAskAhead).Sub(clk.Now()))
	within(t, in, "the agent did not ask the control plane before the renewed expiry")
	if n := testutil.ToFloat64(a.mSuspends.WithLabelValues("block")); n != 0 {
		t.Fatalf("stopped %v times though renewed before its known expiry", n)
	}
	if _, err := open.ReadAtContext(ctx, make([]byte, 4096), 0); err != nil {
		t.Fatalf("a connection did not outlast a renewal the agent learned of before the expiry: %v", err)
	}
	in, answer = holdNextBeat(cp)
	close(next) // not renewed again
	roundsDone(a)

	clk.Advance(expiryAskAhead - time.Nanosecond)
	if !served(t, uri) {
		t.Fatal("stopped before its known expiry")
	}
	clk.Advance(time.Nanosecond)
	if at := within(t, drv.stopped, "still served 10 s after its known expiry"); !at.Equal(renewed) {
		t.Fatalf("stopped at %v, its known expiry is %v", at, renewed)
	}
	within(t, in, "the agent did not ask the control plane again after stopping the export")
	// The round is under way: the export is not served meanwhile.
	if served(t, uri) {
		t.Fatal("served past its known expiry while the agent asks the control plane")
	}
	if _, err := open.ReadAtContext(ctx, make([]byte, 4096), 0); err == nil {
		t.Fatal("a connection opened before the expiry still reads")
	}
	cp.set(func(f *fakeCP) { f.expires["lease-a"] = clk.Now().Add(time.Hour) })
	close(answer)
	within(t, drv.resumed, "a renewal in the answer to the round after the expiry did not serve the export again")
	if !served(t, uri) {
		t.Fatal("not served once renewed")
	}
}

// TestExpiryDuringFirstRound: an export prepared while the agent's first
// heartbeat round (Run's, before it is ready) is under way stops being
// served at its known expiry, however long that round lasts. Nothing
// stopped it before the round ended: the heartbeat loop began after it.
func TestExpiryDuringFirstRound(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg, drv := expiryConfig(t, srv.URL, clk)
	cfg.HTTPClient = &http.Client{} // the round lasts as long as the control plane holds it
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	in, answer := holdNextBeat(cp)
	answered := false
	defer func() {
		if !answered {
			close(answer)
		}
	}()
	ctx, cancel := context.WithCancel(ctxFor(t))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := within(t, done, "the agent did not stop"); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	within(t, in, "the agent's first heartbeat did not come")

	exp := clk.Now().Add(30 * time.Second)
	resp, err := a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-a", ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	if !served(t, resp.URI) {
		t.Fatal("not served before its known expiry")
	}
	clk.Advance(exp.Sub(clk.Now()))
	if at := within(t, drv.stopped, "still served past its known expiry while the first heartbeat round was under way"); !at.Equal(exp) {
		t.Fatalf("stopped at %v, its known expiry is %v", at, exp)
	}
	if served(t, resp.URI) {
		t.Fatal("served past its known expiry")
	}
	close(answer)
	answered = true
	within(t, a.Ready(), "the agent was not ready once its first round ended")
}

// TestRoundGivenUpAfterALaterExpiry: a heartbeat round under way when an
// export is prepared (no served export had a known expiry when it began)
// is given up expiryRoundTimeout after that export's expiry, as after
// one known when it began, and the agent asks again. Its call was
// bounded only by the expiry known as it began: the agent asked again
// only when the HTTP client gave up, or never.
func TestRoundGivenUpAfterALaterExpiry(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg, drv := expiryConfig(t, srv.URL, clk)
	cfg.HTTPClient = &http.Client{} // a call lasts as long as the control plane holds it
	a := start(t, cfg).a
	if err := clk.BlockUntil(ctxFor(t), 1); err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t)
	in, answer := holdNextBeat(cp)
	defer close(answer)
	clk.Advance(a.heartbeatInterval())
	within(t, in, "no heartbeat round after the interval")

	exp := clk.Now().Add(30 * time.Second)
	if _, err := a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-a", ExpiresAt: exp}); err != nil {
		t.Fatal(err)
	}
	next, again := holdNextBeat(cp)
	defer close(again)
	clk.Advance(exp.Sub(clk.Now()))
	within(t, drv.stopped, "not stopped at its known expiry")
	clk.Advance(expiryRoundTimeout)
	within(t, next, "the round under way was not given up after the expiry: the agent did not ask again")
}

// stubbornDriver is a noticingDriver whose Suspend fails while stuck is
// set.
type stubbornDriver struct {
	noticingDriver
	stuck *atomic.Bool
}

func (d stubbornDriver) Suspend(ctx context.Context, e Export) error {
	if d.stuck.Load() {
		return errors.New("the export cannot be stopped")
	}
	return d.noticingDriver.Suspend(ctx, e)
}

// TestRoundAfterAFailedStop: a heartbeat round that begins when a served
// export's known expiry has passed (its stop failed) is given its
// expiryRoundTimeout from its start: the control plane's answer reaches
// the agent, which learns of the renewal. A bound of the expiry's time
// plus expiryRoundTimeout, past already, gave every round up at once.
func TestRoundAfterAFailedStop(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	drv := stubbornDriver{noticingDriver: newNoticingDriver(clk), stuck: new(atomic.Bool)}
	drv.stuck.Store(true)
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Clock = clk
	cfg.Drivers = map[api.Kind]Driver{api.KindBlock: drv}
	a := start(t, cfg).a
	ctx := ctxFor(t)
	exp := clk.Now().Add(time.Minute)
	cp.set(func(f *fakeCP) { f.expires = map[string]time.Time{"lease-a": exp} })
	resp, err := a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-a", ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute + expiryRoundTimeout)
	if n := a.enforceExpiry(ctx, true); n != 0 {
		t.Fatalf("stopped %d exports whose stop fails", n)
	}
	renewed := clk.Now().Add(time.Hour)
	cp.set(func(f *fakeCP) { f.expires["lease-a"] = renewed })
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatalf("a round begun after an expiry whose stop failed: %v", err)
	}
	a.mu.Lock()
	got := a.exports["x_lease-a"].Request.ExpiresAt
	a.mu.Unlock()
	if !got.Equal(renewed) {
		t.Fatalf("the export's known expiry is %v after the answer, want the renewal %v", got, renewed)
	}
	if !served(t, resp.URI) {
		t.Fatal("a renewed export is not served")
	}
}
