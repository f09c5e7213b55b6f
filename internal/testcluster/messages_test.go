package testcluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
)

// internalWords are what a message a user reads must not carry: Go
// packages' prefixes, the agent API's paths, HTTP statuses and codes of
// the calls behind it.
var internalWords = []string{"agent: ", "nbd: ", "controlplane: ", ": placement: ", "store: ", "lifecycle: ",
	"/agent/v1", "Internal Server Error", "internal: "}

// plainly fails the test if msg carries one of internalWords, or lacks
// one of want.
func plainly(t *testing.T, what, msg string, want ...string) {
	t.Helper()
	for _, w := range internalWords {
		if strings.Contains(msg, w) {
			t.Errorf("%s carries %q: %s", what, w, msg)
		}
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("%s lacks %q: %s", what, w, msg)
		}
	}
}

// oneDisk is a node's one 16 MiB block device.
var oneDisk = []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20}}

// TestLenderRefusalReadsPlainly: a lease whose lenders refuse its part
// (their device's backing file is gone) fails, and what the tenant reads —
// the creation's error, the lease's reason, its lease.failed event — names
// each lender once and says what is wrong with its device, not the
// control plane's and agent's packages, the agent API's path, HTTP's
// status, the agent's steps, the lease's ID again or the lender's host
// paths. They read "controlplane: agent node-… /agent/v1/prepare: 500
// Internal Server Error: internal: agent: prepare lease-… on disk0: nbd:
// open backend: open /…/disk0.img: …", then "lender node1 refused the
// part: prepare lease-… on disk0: open backend: open /…/disk0.img: …",
// each lender's words again in the placement's ("node node-… is skipped:
// lender node1 refused …"), and the creation's error "no other
// infeasible".
func TestLenderRefusalReadsPlainly(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: oneDisk})
	ctx := ctxT(t)
	for _, n := range c.Nodes {
		if err := os.Remove(filepath.Join(n.StateDir, "disk0.img")); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20})
	var ae *api.Error
	if !errors.As(err, &ae) {
		t.Fatalf("create on lenders that refuse: %v", err)
	}
	ls, err := c.Client().AllLeases(ctx)
	if err != nil || len(ls) != 1 || ls[0].State != api.LeaseFailed {
		t.Fatalf("leases: %v, %v", leaseStates(ls), err)
	}
	var failed []string
	for _, e := range allEvents(ctx, t, c.Client()) {
		if e.Type == "lease.failed" {
			failed = append(failed, e.Message)
		}
	}
	if len(failed) != 1 {
		t.Fatalf("lease.failed events: %q", failed)
	}
	for _, m := range []struct{ what, msg string }{
		{"the creation's error", ae.Message}, {"the lease's reason", ls[0].Reason}, {"the lease.failed event", failed[0]},
	} {
		plainly(t, m.what, m.msg, "lenders did not confirm (", "and no other placement: ")
		for _, n := range c.Nodes {
			want := "lender " + n.Name + " refused the part: device disk0 cannot be opened (no such file or directory)"
			if k := strings.Count(m.msg, want); k != 1 {
				t.Errorf("%s says %d times %q: %s", m.what, k, want, m.msg)
			}
			if strings.Contains(m.msg, n.StateDir) {
				t.Errorf("%s names lender %s's path %s: %s", m.what, n.Name, n.StateDir, m.msg)
			}
		}
		for _, w := range []string{"prepare " + ls[0].ID, "open backend"} {
			if strings.Contains(m.msg, w) {
				t.Errorf("%s carries %q: %s", m.what, w, m.msg)
			}
		}
	}
}

// TestDrainReasonsReadPlainly: what a drain says of a lease it cannot
// move — the drain's record (rialto node drain), the lease.drain.left
// event its tenant reads, the failed move's error and event — names
// lenders and their words, not packages, agent API paths or HTTP
// statuses. With no other lender the lease "cannot move yet: no
// destination …" (it read "cannot move yet: controlplane: infeasible:
// …"); with another lender that refuses to receive the part (its device's
// backing file is gone), "a move failed (the destination did not
// receive: lender node2 refused the part: …)".
func TestDrainReasonsReadPlainly(t *testing.T) {
	t.Parallel()
	t.Run("no destination", func(t *testing.T) {
		t.Parallel()
		c := Start(t, Options{Nodes: 1, Devices: oneDisk})
		ctx := ctxT(t)
		l := createBlock(t, c.Client(), 8<<20, "")
		n := c.Nodes[0]
		if _, err := c.Client().DrainNode(ctx, n.ID(), api.DrainRequest{DeadlineSeconds: 60}); err != nil {
			t.Fatal(err)
		}
		var d api.Drain
		var err error
		Eventually(t, 30*time.Second, "the lease to be found unmovable for now", func() bool {
			d, err = c.Client().NodeDrain(ctx, n.ID())
			return err == nil && len(d.Leases) == 1 && strings.Contains(d.Leases[0].Reason, "cannot move yet")
		})
		// The lender the part moves away from is skipped as such; it read
		// "skipped (it did not confirm the part)", which it had not been
		// asked to.
		plainly(t, "the drain's reason", d.Leases[0].Reason, "cannot move yet: no destination for part 0 of lease "+l.ID,
			"is skipped (it is the part's lender, which the part moves away from)")
		if strings.Contains(d.Leases[0].Reason, "did not confirm") {
			t.Errorf("the drain's reason says the part's lender did not confirm: %s", d.Leases[0].Reason)
		}
		// One line, not the explanation's indented lines joined.
		if strings.Contains(d.Leases[0].Reason, ";  ") {
			t.Errorf("the drain's reason keeps the explanation's indentation: %q", d.Leases[0].Reason)
		}
		endDrain(t, c, n, l)
	})
	t.Run("destination refuses", func(t *testing.T) {
		t.Parallel()
		c := Start(t, Options{Nodes: 2, Devices: oneDisk})
		ctx := ctxT(t)
		l := createBlock(t, c.Client(), 8<<20, "")
		src, dst := c.NodeByID(l.NodeID), c.Nodes[0]
		if dst == src {
			dst = c.Nodes[1]
		}
		if err := os.Remove(filepath.Join(dst.StateDir, "disk0.img")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Client().DrainNode(ctx, src.ID(), api.DrainRequest{DeadlineSeconds: 60}); err != nil {
			t.Fatal(err)
		}
		var d api.Drain
		var err error
		Eventually(t, 30*time.Second, "the drain to say the move failed", func() bool {
			d, err = c.Client().NodeDrain(ctx, src.ID())
			return err == nil && len(d.Leases) == 1 && strings.Contains(d.Leases[0].Reason, "a move failed")
		})
		want := "lender " + dst.Name + " refused the part: "
		plainly(t, "the drain's reason", d.Leases[0].Reason, "the destination did not receive: "+want)
		ms, err := c.Client().Moves(ctx, l.ID)
		if err != nil {
			t.Fatal(err)
		}
		var failedMove *api.Move
		for i := range ms {
			if ms[i].State == api.MoveFailed {
				failedMove = &ms[i]
			}
		}
		if failedMove == nil {
			t.Fatalf("no failed move: %+v", ms)
		}
		plainly(t, "the failed move's error", failedMove.Error, want)
		var failed string
		Eventually(t, 30*time.Second, "the lease.move.failed event", func() bool {
			for _, e := range allEvents(ctx, t, c.Client()) {
				if e.Type == "lease.move.failed" && e.Subject == l.ID {
					failed = e.Message
				}
			}
			return failed != ""
		})
		plainly(t, "the lease.move.failed event", failed, want)
		endDrain(t, c, src, l)
	})
}

// endDrain passes the drain's deadline and checks what the tenant is
// told of lease l, left on node n.
func endDrain(t *testing.T, c *Cluster, n *Node, l api.Lease) {
	t.Helper()
	ctx := ctxT(t)
	c.Advance(2 * time.Minute)
	var d api.Drain
	var err error
	Eventually(t, 30*time.Second, "the drain's end", func() bool {
		d, err = c.Client().NodeDrain(ctx, n.ID())
		return err == nil && d.State != api.DrainRunning
	})
	if d.State != api.DrainIncomplete || len(d.Leases) != 1 {
		t.Fatalf("drain: %+v", d)
	}
	plainly(t, "the drain's reason at its end", d.Leases[0].Reason, "the drain's deadline passed")
	var left string
	Eventually(t, 30*time.Second, "the tenant told that the lease stays", func() bool {
		for _, e := range allEvents(ctx, t, c.Client()) {
			if e.Type == "lease.drain.left" && e.Subject == l.ID {
				left = e.Message
				return true
			}
		}
		return false
	})
	plainly(t, "the lease.drain.left event", left, "stays on it")
}
