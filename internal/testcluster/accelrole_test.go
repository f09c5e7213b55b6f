package testcluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

// fewRoles is a node's own accel driver whose devices offer only roles
// (attributes.roles), fewer than its appliance could load, as a device
// with fewer bitstreams would: a placement that ignored the list would
// still get the slot prepared, which a test can see.
type fewRoles struct {
	*agent.AccelDriver
	roles string
}

func (d fewRoles) Open(ctx context.Context, dev agent.DeviceConfig) (agent.DeviceConfig, error) {
	dev, err := d.AccelDriver.Open(ctx, dev)
	if err == nil {
		dev.Attributes["roles"] = d.roles
	}
	return dev, err
}

// TestDrainDedicatedAccelKeepsRole: a drain places a dedicated accel
// lease's slot again only on a device that offers its role. While the
// only other lender's device does not offer it (its agent lists echo
// only), the lease stays where it is and the drain says why; once a node
// whose device offers it may lend (uncordoned), the slot goes there and
// answers. The slot used to be placed again on any accel device (only
// shared slots carried their role to placement): node2's.
func TestDrainDedicatedAccelKeepsRole(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 3, Devices: []agent.DeviceConfig{
		{Name: "accel0", Kind: api.KindAccel, Size: 1, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}, Configure: func(i int, cfg *agent.Config) {
		if i == 1 {
			cfg.Drivers = map[api.Kind]agent.Driver{api.KindAccel: fewRoles{agent.NewAccelDriver(cfg.Logger, cfg.Listen), "echo"}}
		}
	}})
	ctx := ctxT(t)
	cl := c.Client()
	target, echoOnly, later := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	devs, err := cl.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if want := d.NodeID == echoOnly.ID(); want != (d.Attributes["roles"] == "echo") {
			t.Fatalf("device %s of node %s offers roles %q", d.ID, d.NodeID, d.Attributes["roles"])
		}
	}
	if _, err := cl.CordonNode(ctx, later.Name); err != nil {
		t.Fatal(err)
	}
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256", Affinity: []string{target.Name}})
	if err != nil || l.Mode != api.ModeDedicated || l.NodeID != target.ID() {
		t.Fatalf("lease %+v: %v", l, err)
	}
	if _, err := cl.DrainNode(ctx, target.Name, api.DrainRequest{DeadlineSeconds: 600}); err != nil {
		t.Fatal(err)
	}
	var d api.Drain
	Eventually(t, 60*time.Second, "the lease found unmovable for its role, or the drain's end", func() bool {
		d, err = cl.NodeDrain(ctx, target.ID())
		return err == nil && (d.State != api.DrainRunning ||
			len(d.Leases) == 1 && strings.Contains(d.Leases[0].Reason, "does not offer role sha256"))
	})
	if got, err := cl.Lease(ctx, l.ID); err != nil || got.NodeID != target.ID() {
		t.Fatalf("the lease during the drain is on %s, not %s (%s is %s, whose device offers echo only): %+v %v", got.NodeID, target.ID(), echoOnly.Name, echoOnly.ID(), got, err)
	}
	if e := d.Leases[0]; d.State != api.DrainRunning || e.State != api.DrainLeasePending || !strings.Contains(e.Reason, "cannot place its slot again yet") {
		t.Fatalf("drain: %+v", d)
	}
	t.Logf("drain lease: %s", d.Leases[0].Reason)

	// A node whose device offers sha256 may lend again: the next try
	// (drainRetry later) places the slot there.
	if _, err := cl.UncordonNode(ctx, later.Name); err != nil {
		t.Fatal(err)
	}
	c.Advance(5 * time.Second)
	Eventually(t, 60*time.Second, "the drain's end", func() bool {
		d, err = cl.NodeDrain(ctx, target.ID())
		return err == nil && d.State != api.DrainRunning
	})
	if d.State != api.DrainDone {
		t.Fatalf("drain: %+v", d)
	}
	got, err := cl.Lease(ctx, l.ID)
	if err != nil || got.NodeID != later.ID() || got.State != api.LeaseActive {
		t.Fatalf("the lease after the drain: %+v %v (want it on %s)", got, err, later.ID())
	}
	u, err := accel.ParseURI(got.URI)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := accel.Dial(ctx, u.Slots[0], []byte(u.Credential))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want := sha256.Sum256([]byte("abc"))
	if out, err := conn.Call(ctx, "sum", []byte("abc")); err != nil || !bytes.Equal(out, want[:]) {
		t.Fatalf("the re-placed slot: %x %v", out, err)
	}
}
