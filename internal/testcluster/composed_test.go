package testcluster

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

func TestComposedLeasePartsServedByTheirLenders(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{})
	ctx := ctxT(t)
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 3, Size: 48 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if l.State != api.LeaseActive || len(l.Parts) != 3 {
		t.Fatalf("composed lease %+v", l)
	}
	var total int64
	for i, p := range l.Parts {
		n := c.NodeByID(p.NodeID)
		if n == nil || !n.Serves(l.ID) {
			t.Fatalf("part %d not served by %s", i, p.NodeID)
		}
		for j, q := range l.Parts {
			if j != i && mustURL(t, q.URI).Path == mustURL(t, p.URI).Path {
				t.Errorf("parts %d and %d share an export name", i, j)
			}
		}
		nc, err := nbd.DialURI(ctx, p.URI)
		if err != nil {
			t.Fatalf("part %d: %v", i, err)
		}
		total += nc.Size()
		nc.Close()
	}
	if total < l.Size {
		t.Errorf("parts hold %d bytes, lease is %d", total, l.Size)
	}
	if _, err := c.Client().ReleaseLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Parts {
		n := c.NodeByID(p.NodeID)
		c.Eventually("part torn down", func() bool { return !n.Serves(l.ID) })
	}
}

// TestNBDInfoReadsALease checks a third-party client against a lease.
func TestNBDInfoReadsALease(t *testing.T) {
	t.Parallel()
	nbdinfo, err := exec.LookPath("nbdinfo")
	if err != nil {
		t.Skip("nbdinfo not installed")
	}
	c := Start(t, Options{Nodes: 1})
	l := createBlock(t, c.Client(), 12<<20, api.ModeShared)
	out, err := exec.CommandContext(ctxT(t), nbdinfo, "--size", l.URI).CombinedOutput()
	if err != nil {
		t.Fatalf("nbdinfo: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != strconv.Itoa(12<<20) {
		t.Fatalf("nbdinfo --size = %q", got)
	}
	bad := l.URI[:strings.LastIndex(l.URI, "/")+1] + "not-the-credential"
	if out, err := exec.CommandContext(ctxT(t), nbdinfo, "--size", bad).CombinedOutput(); err == nil {
		t.Fatalf("nbdinfo read a wrong export: %s", out)
	}
}

func TestHeterogeneousNodes(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Configure: func(i int, cfg *agent.Config) {
		cfg.Labels = map[string]string{"rack": strconv.Itoa(i)}
		if i == 1 {
			cfg.Devices = nil
		}
	}})
	devs, err := c.Client().Devices(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].NodeID != c.Nodes[0].ID() {
		t.Fatalf("devices %+v", devs)
	}
	n, err := c.Client().Node(ctxT(t), c.Nodes[1].ID())
	if err != nil || n.Labels["rack"] != "1" {
		t.Fatalf("node %+v %v", n, err)
	}
}

func TestControlPlaneRestartKeepsLeases(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{})
	ctx := ctxT(t)
	l := createBlock(t, c.Client(), 8<<20, api.ModeShared)
	c.RestartControlPlane()
	if got := c.Lease(l.ID); got.State != api.LeaseActive {
		t.Fatalf("lease after control-plane restart: %s (%s)", got.State, got.Reason)
	}
	c.Heartbeat() // agents reach the new control plane with their credentials
	c.Sweep()
	for _, n := range c.Nodes {
		if s := c.NodeState(n.ID()); s != api.NodeReady {
			t.Fatalf("%s is %s after the restart", n.Name, s)
		}
	}
	nc, err := nbd.DialURI(ctx, l.URI)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if _, err := c.Client().ReleaseLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	lender := c.NodeByID(l.NodeID)
	c.Eventually("export torn down", func() bool { return !lender.Serves(l.ID) })
	createBlock(t, c.Client(), 8<<20, "")
}
