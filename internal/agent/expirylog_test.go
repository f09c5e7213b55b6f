package agent

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/logtest"
)

// TestExpiryStopLogsReachability: the log line of a stop at a lease's
// expiry says whether the control plane answered the agent's last
// heartbeat: reachable for an answer that did not renew the lease, not
// reachable once heartbeats fail with "connection refused" (the stop on
// the heartbeat loop's timer said reachable whatever the heartbeats did).
func TestExpiryStopLogsReachability(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 13, 40, 0, 0, time.UTC))
	cfg, drv := expiryConfig(t, srv.URL, clk)
	logs := &logtest.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	a := start(t, cfg).a
	ctx := ctxFor(t)
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	exp := clk.Now().Add(30 * time.Second)
	prepareExpiring(t, a, exp)
	// stopLogs waits for the stop at the lease's expiry and returns the
	// log lines of stops so far.
	stopLogs := func(exp time.Time) []string {
		t.Helper()
		clk.Advance(exp.Sub(clk.Now()))
		within(t, drv.stopped, "not stopped at its expiry")
		a.enforceMu.Lock() // the stop is logged before enforceExpiry returns
		//lint:ignore SA2001 an empty critical section waits for the stop's log
		a.enforceMu.Unlock()
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "stopped serving a lease whose expiry passed") {
				out = append(out, l)
			}
		}
		return out
	}

	// Answered, not renewed.
	cp.set(func(f *fakeCP) { f.expires = map[string]time.Time{"lease-a": exp} })
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	got := stopLogs(exp)
	if len(got) != 1 || !strings.Contains(got[0], "control_plane_reachable=true") {
		t.Fatalf("the stop after an answer logged %q, want control_plane_reachable=true", got)
	}

	// Renewed, then the control plane is gone: connection refused.
	exp = clk.Now().Add(30 * time.Second)
	cp.set(func(f *fakeCP) { f.expires["lease-a"] = exp })
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	within(t, drv.resumed, "not served again after its renewal")
	srv.Close()
	if err := a.Heartbeat(ctx); err == nil {
		t.Fatal("a heartbeat to a closed control plane succeeded")
	}
	got = stopLogs(exp)
	if len(got) != 2 || !strings.Contains(got[1], "control_plane_reachable=false") || !strings.Contains(got[1], "control_plane_last_answer=") {
		t.Fatalf("the stop with the control plane gone logged %q, want control_plane_reachable=false with its last answer", got[len(got)-1])
	}
}
