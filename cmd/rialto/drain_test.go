package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestDrainSaysEachReasonOnce: `rialto node drain` of a node whose lease
// has nowhere to go prints placement's reason once, says the lease is
// tried again until the deadline (room may free up meanwhile: a lease
// released, a node joining), does not print the reason again when the
// retries give the same one or when the lease is left at the deadline,
// and exits 1 with the report, which has the reason whole.
func TestDrainSaysEachReasonOnce(t *testing.T) {
	var logs logtest.Buffer
	c := testcluster.Start(t, testcluster.Options{Nodes: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20}}})
	ctx := context.Background()
	// Each node's disk holds a 6MiB lease: neither fits on the other's.
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 6 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 6 << 20}); err != nil {
		t.Fatal(err)
	}
	var out, errb logtest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"node", "drain", c.NodeByID(l.NodeID).Name, "--deadline", "10s"}, clusterEnv(c, t.TempDir(), &out, &errb))
	}()
	tries := func() int { return strings.Count(logs.String(), "drain: a lease cannot move yet") }
	c.Eventually("the drain's first reason", func() bool { return strings.Contains(errb.String(), "cannot move yet") })
	// The control plane's clock: the lease is tried again (every 3s),
	// the nodes heartbeat meanwhile, and the deadline passes.
	for i := range 6 {
		c.Advance(2 * time.Second)
		c.Heartbeat()
		if i == 1 { // 4s on: tried again, with the same reason
			c.Eventually("the lease tried again", func() bool { return tries() >= 2 })
		}
	}
	var code int
	select {
	case code = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the drain did not end:\n%s", errb.String())
	}
	const reason = "capacity: 2MiB free, needs 6MiB"
	if code != 1 || strings.Count(errb.String(), reason) != 1 || strings.Count(out.String(), reason) != 1 {
		t.Fatalf("exit %d; want 1, and the reason (%q) once in the progress and once in the report:\nstderr:\n%s\nstdout:\n%s", code, reason, errb.String(), out.String())
	}
	for _, w := range []string{"; tried again until the drain's deadline (", "move left: the drain's deadline passed (cannot move yet: as above)", "drain of " + c.NodeByID(l.NodeID).Name + " incomplete"} {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("stderr lacks %q:\n%s", w, errb.String())
		}
	}
	if tries() < 2 {
		t.Errorf("the lease was tried %d time(s)", tries())
	}
}

// TestDrainProgressSaysActionChange: a lease whose action changes with
// the same state and reason (a move become a leave) gets a line of
// progress for the change; the same lease seen again unchanged does not.
func TestDrainProgressSaysActionChange(t *testing.T) {
	var b strings.Builder
	p := newDrainProgress(&b)
	const reason = "cannot move yet: capacity: 2MiB free, needs 6MiB"
	drain := func(action string) api.Drain {
		return api.Drain{State: api.DrainRunning, Deadline: time.Now().Add(time.Minute),
			Leases: []api.DrainLease{{LeaseID: "l-1", Kind: api.KindBlock, Action: action, State: api.DrainLeasePending, Reason: reason}}}
	}
	p.print(drain(api.DrainMove))
	p.print(drain(api.DrainMove))
	p.print(drain(api.DrainLeave))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], ": move pending: ") || !strings.Contains(lines[1], ": leave pending: ") {
		t.Fatalf("progress:\n%s\nwant a line for the move, and one for the leave", b.String())
	}
}
