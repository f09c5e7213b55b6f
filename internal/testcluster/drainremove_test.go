package testcluster

import (
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
)

// TestDrainReportsLeasesLostNotMoved: a node removed while it is being
// drained (its agent stopped, `node remove --force`) ends its drain, and
// the drain's record and events say what became of the lease that could
// not move yet: lost with its lender, not moved. The drain reported the
// node drained, "1 lease(s) moved off it", the lease done with no reason.
// A drain of the removed node is refused, naming its state.
func TestDrainReportsLeasesLostNotMoved(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20}}})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	target := c.Nodes[0]
	id := target.ID()
	if _, err := cl.DrainNode(ctx, id, api.DrainRequest{DeadlineSeconds: 600}); err != nil {
		t.Fatal(err)
	}
	var d api.Drain
	Eventually(t, 30*time.Second, "the lease to be found unmovable for now", func() bool {
		d, err = cl.NodeDrain(ctx, id)
		return err == nil && len(d.Leases) == 1 && strings.Contains(d.Leases[0].Reason, "cannot move yet")
	})
	target.Kill()
	if _, err := cl.RemoveNode(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, "the drain's end", func() bool {
		d, err = cl.NodeDrain(ctx, id)
		return err == nil && d.State != api.DrainRunning
	})
	if len(d.Leases) != 1 || d.Leases[0].LeaseID != l.ID || !strings.Contains(d.Leases[0].Reason, "lost") {
		t.Errorf("the drain's record of a lease lost with its node: %+v", d.Leases)
	}
	var drained api.Event
	Eventually(t, 30*time.Second, "the drain's event", func() bool {
		for _, e := range allEvents(ctx, t, cl) {
			if e.Subject == id && (e.Type == "node.drained" || e.Type == "node.drain.incomplete") {
				drained = e
				return true
			}
		}
		return false
	})
	if strings.Contains(drained.Message, "moved off") || !strings.Contains(drained.Message, "1 lease(s) ended on it without moving") {
		t.Errorf("the drain's event of a lease lost with its node: %s %q", drained.Type, drained.Message)
	}
	if _, err := cl.DrainNode(ctx, id, api.DrainRequest{}); !api.IsCode(err, api.CodeConflict) || !strings.Contains(err.Error(), "removed") {
		t.Errorf("a drain of a removed node: %v", err)
	}
}
