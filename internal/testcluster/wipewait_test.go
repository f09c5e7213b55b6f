package testcluster

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
)

// cpMetric reads a control-plane metric without labels from GET /metrics.
func cpMetric(t *testing.T, c *Cluster, name string) string {
	t.Helper()
	resp, err := c.HTTPClient().Get(c.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

// TestPlacementWaitsForWipe: a lease released while its lender cannot
// finish wiping its range (the wipe fails half-way and stays in the
// lender's journal) keeps the range out of placement: a lease created at
// once that needs it is neither placed on it (and refused by the lender)
// nor failed as infeasible; it waits until the lender's heartbeats show
// the wipe done, and is placed there.
func TestPlacementWaitsForWipe(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20},
	}})
	cl := c.Client()
	ctx := ctxT(t)
	lender := c.Nodes[0]
	first := createBlock(t, cl, 16<<20, api.ModeDedicated)
	lender.Faults().CrashMidWipe.Store(true)
	if _, err := cl.ReleaseLease(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   api.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 16 << 20, Mode: api.ModeDedicated})
		done <- result{l, err}
	}()
	var early *result
	c.Eventually("the new lease to wait for the wipe", func() bool {
		select {
		case r := <-done:
			early = &r
			return true
		default:
		}
		return cpMetric(t, c, "rialto_placement_wipe_waits") == "1"
	})
	if early != nil {
		t.Fatalf("the lease created while the only range was being wiped ended before the wipe: %+v, %v", early.l, early.err)
	}
	lender.Faults().CrashMidWipe.Store(false) // the next heartbeat round finishes the wipe
	r := <-done
	if r.err != nil {
		t.Fatalf("the lease created while the only range was being wiped: %v", r.err)
	}
	if r.l.State != api.LeaseActive || r.l.DeviceID != first.DeviceID {
		t.Fatalf("the lease created while the only range was being wiped: %s on %s", r.l.State, r.l.DeviceID)
	}
}

// TestPlacementAvoidsRangeBeingWiped: with a range being wiped and
// another device free on the same lender, a new lease lands on the free
// device at once (spread would choose the emptier device being wiped),
// rather than on the range the lender refuses.
func TestPlacementAvoidsRangeBeingWiped(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20},
		{Name: "disk1", Kind: api.KindBlock, Path: "disk1.img", Size: 16 << 20},
	}})
	cl := c.Client()
	ctx := ctxT(t)
	lender := c.Nodes[0]
	a := createBlock(t, cl, 16<<20, api.ModeDedicated)
	b, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, Mode: api.ModeShared})
	if err != nil || b.DeviceID == a.DeviceID {
		t.Fatalf("second lease: %+v %v", b, err)
	}
	lender.Faults().CrashMidWipe.Store(true)
	t.Cleanup(func() { lender.Faults().CrashMidWipe.Store(false) })
	if _, err := cl.ReleaseLease(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, Mode: api.ModeShared, Strategy: "spread"})
	if err != nil {
		t.Fatalf("a lease created while a device's range was being wiped: %v", err)
	}
	if l.State != api.LeaseActive || l.DeviceID != b.DeviceID {
		t.Fatalf("a lease created while %s was being wiped: %s on %s", a.DeviceID, l.State, l.DeviceID)
	}
}

// TestPlacementAroundAnUnknownWipe: a control plane that does not know a
// range is being wiped (it restarted after the release, and the lender's
// heartbeats, which would tell it, are paused) places a lease on it; the
// lender refuses the range as still being wiped. The lease is placed
// again around the range, on the same lender's other device, rather than
// failed with the lender skipped.
func TestPlacementAroundAnUnknownWipe(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20},
		{Name: "disk1", Kind: api.KindBlock, Path: "disk1.img", Size: 16 << 20},
	}})
	cl := c.Client()
	ctx := ctxT(t)
	lender := c.Nodes[0]
	a := createBlock(t, cl, 16<<20, api.ModeDedicated)
	b, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, Mode: api.ModeShared})
	if err != nil || b.DeviceID == a.DeviceID {
		t.Fatalf("second lease: %+v %v", b, err)
	}
	lender.Faults().CrashMidWipe.Store(true)
	t.Cleanup(func() { lender.Faults().CrashMidWipe.Store(false) })
	lender.PauseHeartbeats(true)
	t.Cleanup(func() { lender.PauseHeartbeats(false) })
	if _, err := cl.ReleaseLease(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	c.RestartControlPlane() // forgets the range being wiped
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, Mode: api.ModeShared, Strategy: "spread"})
	if err != nil {
		t.Fatalf("a lease placed on a range its lender was still wiping: %v", err)
	}
	if l.State != api.LeaseActive || l.DeviceID != b.DeviceID {
		t.Fatalf("a lease placed on a range its lender was still wiping: %s on %s, want active on %s", l.State, l.DeviceID, b.DeviceID)
	}
}

// TestPlacementWaitsForAnUnknownWipe: as TestPlacementAroundAnUnknownWipe,
// with no other room: the lease refused the range waits for the lender's
// wipe (its heartbeats, resumed, show it done) and is placed there.
func TestPlacementWaitsForAnUnknownWipe(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20},
	}})
	cl := c.Client()
	ctx := ctxT(t)
	lender := c.Nodes[0]
	first := createBlock(t, cl, 16<<20, api.ModeDedicated)
	lender.Faults().CrashMidWipe.Store(true)
	lender.PauseHeartbeats(true)
	if _, err := cl.ReleaseLease(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	c.RestartControlPlane()
	type result struct {
		l   api.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 16 << 20, Mode: api.ModeDedicated})
		done <- result{l, err}
	}()
	var early *result
	c.Eventually("the refused lease to wait for the wipe", func() bool {
		select {
		case r := <-done:
			early = &r
			return true
		default:
		}
		return cpMetric(t, c, "rialto_placement_wipe_waits") == "1"
	})
	if early != nil {
		t.Fatalf("the lease refused a range being wiped ended before the wipe: %v", early.err)
	}
	lender.Faults().CrashMidWipe.Store(false)
	lender.PauseHeartbeats(false)
	r := <-done
	if r.err != nil {
		t.Fatalf("the lease refused a range being wiped: %v", r.err)
	}
	if r.l.State != api.LeaseActive || r.l.DeviceID != first.DeviceID {
		t.Fatalf("the lease refused a range being wiped: %s on %s", r.l.State, r.l.DeviceID)
	}
}
