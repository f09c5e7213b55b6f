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

// wipeRig is a one-node cluster whose lender cannot finish wiping (its
// wipes stop half-way and stay in its journal), with a dedicated lease
// (first) on disk0 released; with two devices, a shared lease (other) on
// disk1 is live. unknown: the lender's heartbeats are paused before the
// release and the control plane restarted after it, so that it does not
// know the range is being wiped.
type wipeRig struct {
	c            *Cluster
	cl           *api.Client
	lender       *Node
	first, other api.Lease
}

func newWipeRig(t *testing.T, devices int, unknown bool) *wipeRig {
	t.Helper()
	devs := []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20}}
	if devices == 2 {
		devs = append(devs, agent.DeviceConfig{Name: "disk1", Kind: api.KindBlock, Path: "disk1.img", Size: 16 << 20})
	}
	c := Start(t, Options{Nodes: 1, Devices: devs})
	r := &wipeRig{c: c, cl: c.Client(), lender: c.Nodes[0]}
	ctx := ctxT(t)
	r.first = createBlock(t, r.cl, 16<<20, api.ModeDedicated)
	if devices == 2 {
		var err error
		r.other, err = r.cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, Mode: api.ModeShared})
		if err != nil || r.other.DeviceID == r.first.DeviceID {
			t.Fatalf("second lease: %+v %v", r.other, err)
		}
	}
	r.lender.Faults().CrashMidWipe.Store(true)
	t.Cleanup(func() { r.lender.Faults().CrashMidWipe.Store(false) })
	if unknown {
		r.lender.PauseHeartbeats(true)
		t.Cleanup(func() { r.lender.PauseHeartbeats(false) })
	}
	if _, err := r.cl.ReleaseLease(ctx, r.first.ID); err != nil {
		t.Fatal(err)
	}
	if unknown {
		r.c.RestartControlPlane() // forgets the range being wiped
	}
	return r
}

// createWaiting creates a lease of the whole of disk0 and returns once
// placement counts it waiting for a wipe (failing the test if it ended
// before); wait returns its outcome.
func (r *wipeRig) createWaiting(t *testing.T, what string) (wait func() (api.Lease, error)) {
	t.Helper()
	type result struct {
		l   api.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := r.cl.CreateLease(ctxT(t), api.LeaseRequest{Kind: api.KindBlock, Size: 16 << 20, Mode: api.ModeDedicated})
		done <- result{l, err}
	}()
	var early *result
	r.c.Eventually(what+" to wait for the wipe", func() bool {
		select {
		case res := <-done:
			early = &res
			return true
		default:
		}
		return cpMetric(t, r.c, "rialto_placement_wipe_waits") == "1"
	})
	if early != nil {
		t.Fatalf("%s ended before the wipe: %+v, %v", what, early.l, early.err)
	}
	return func() (api.Lease, error) {
		res := <-done
		return res.l, res.err
	}
}

// TestPlacementWaitsForWipe: a lease released while its lender cannot
// finish wiping its range (the wipe fails half-way and stays in the
// lender's journal) keeps the range out of placement: a lease created at
// once that needs it is neither placed on it (and refused by the lender)
// nor failed as infeasible; it waits until the lender's heartbeats show
// the wipe done, and is placed there.
func TestPlacementWaitsForWipe(t *testing.T) {
	t.Parallel()
	r := newWipeRig(t, 1, false)
	wait := r.createWaiting(t, "the lease created while the only range was being wiped")
	r.lender.Faults().CrashMidWipe.Store(false) // the next heartbeat round finishes the wipe
	l, err := wait()
	if err != nil {
		t.Fatalf("the lease created while the only range was being wiped: %v", err)
	}
	if l.State != api.LeaseActive || l.DeviceID != r.first.DeviceID {
		t.Fatalf("the lease created while the only range was being wiped: %s on %s", l.State, l.DeviceID)
	}
}

// TestPlacementAvoidsRangeBeingWiped: with a range being wiped and
// another device free on the same lender, a new lease lands on the free
// device at once (spread would choose the emptier device being wiped),
// rather than on the range the lender refuses.
func TestPlacementAvoidsRangeBeingWiped(t *testing.T) {
	t.Parallel()
	r := newWipeRig(t, 2, false)
	l, err := r.cl.CreateLease(ctxT(t), api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, Mode: api.ModeShared, Strategy: "spread"})
	if err != nil {
		t.Fatalf("a lease created while a device's range was being wiped: %v", err)
	}
	if l.State != api.LeaseActive || l.DeviceID != r.other.DeviceID {
		t.Fatalf("a lease created while %s was being wiped: %s on %s", r.first.DeviceID, l.State, l.DeviceID)
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
	r := newWipeRig(t, 2, true)
	l, err := r.cl.CreateLease(ctxT(t), api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, Mode: api.ModeShared, Strategy: "spread"})
	if err != nil {
		t.Fatalf("a lease placed on a range its lender was still wiping: %v", err)
	}
	if l.State != api.LeaseActive || l.DeviceID != r.other.DeviceID {
		t.Fatalf("a lease placed on a range its lender was still wiping: %s on %s, want active on %s", l.State, l.DeviceID, r.other.DeviceID)
	}
}

// TestPlacementWaitsForAnUnknownWipe: as TestPlacementAroundAnUnknownWipe,
// with no other room: the lease refused the range waits for the lender's
// wipe (its heartbeats, resumed, show it done) and is placed there.
func TestPlacementWaitsForAnUnknownWipe(t *testing.T) {
	t.Parallel()
	r := newWipeRig(t, 1, true)
	wait := r.createWaiting(t, "the lease refused a range being wiped")
	r.lender.Faults().CrashMidWipe.Store(false)
	r.lender.PauseHeartbeats(false)
	l, err := wait()
	if err != nil {
		t.Fatalf("the lease refused a range being wiped: %v", err)
	}
	if l.State != api.LeaseActive || l.DeviceID != r.first.DeviceID {
		t.Fatalf("the lease refused a range being wiped: %s on %s", l.State, l.DeviceID)
	}
}
