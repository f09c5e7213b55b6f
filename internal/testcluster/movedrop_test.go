package testcluster

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// TestRemovedMoveDestinationDropsThePart: a move's destination that took
// the part over (its commit answered) although its node was removed
// meanwhile (--force: its agent still running, cut off from the control
// plane, as when the operator also rotated the bootstrap token) tears the
// lease down and wipes the range it received: no lease names that export
// (the lease stays at its source), the destination refuses the move's
// abort once committed, and its heartbeats, which would be answered to
// tear it down, are refused. It served the part, the lease's bytes in
// its range, until the lease's expiry or until its agent joined again.
func TestRemovedMoveDestinationDropsThePart(t *testing.T) {
	t.Parallel()
	h := newCommitHold()
	ctx := ctxT(t)
	c, l := startHeld(ctx, t, h, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	writeHello(ctx, t, l.URI)
	ms := moveHeld(ctx, t, c, l.ID, h)
	dst := c.NodeByID(ms[0].To.NodeID)
	dst.PauseHeartbeats(true) // it does not join again
	if _, err := c.Client().RemoveNode(ctx, dst.ID(), true); err != nil {
		t.Fatal(err)
	}
	close(h.release) // the destination commits
	if ms := waitMoves(t, c, l.ID, 1); ms[0].State != api.MoveFailed {
		t.Fatalf("the move onto the removed node: %+v", ms[0])
	}
	// (The move ends before its lenders are told: abortMove.)
	c.Eventually("the removed destination to drop the part it took over, which no lease names, and wipe its range", func() bool {
		return !dst.Serves(l.ID) && rangeZero(t, dst, ms[0].To.Offset+4096)
	})
	checkHello(ctx, t, c.Lease(l.ID).URI, "the part at its source")
}

// rangeZero reports whether node n's one block device (moveDevices) reads
// 5 zero bytes at off, where writeHello's bytes would be in a part there.
func rangeZero(t *testing.T, n *Node, off int64) bool {
	t.Helper()
	f, err := os.Open(filepath.Join(n.StateDir, "disk0.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 5)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(b, make([]byte, 5))
}

// TestRemovedNodeDropsMovedPart: a node removed (--force) whose agent
// still runs, cut off from the control plane, just after a lease's part
// moved to it is told by the removal to tear down the lease lost with it:
// its heartbeats, whose answers would tell it, are refused from then on.
// It served the lost lease's part, and kept its bytes on its device,
// until the lease's expiry or until its agent joined again.
func TestRemovedNodeDropsMovedPart(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: moveDevices()})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	writeHello(ctx, t, l.URI)
	if _, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{}); err != nil {
		t.Fatal(err)
	}
	ms := waitMoves(t, c, l.ID, 1)
	if ms[0].State != api.MoveDone {
		t.Fatalf("the move: %+v", ms[0])
	}
	dst := c.NodeByID(ms[0].To.NodeID)
	checkHello(ctx, t, c.Lease(l.ID).URI, "the part at its destination")
	dst.PauseHeartbeats(true) // it does not join again
	r, err := cl.RemoveNode(ctx, dst.ID(), true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(r.Lost, l.ID) {
		t.Fatalf("the removal does not list the moved lease lost: %+v", r.Lost)
	}
	if dst.Serves(l.ID) {
		t.Error("the removed node still serves the lease lost with it")
	}
	if !rangeZero(t, dst, ms[0].To.Offset+4096) {
		t.Error("the removed node's range of the lost lease is not wiped")
	}
}

// TestRemovedNodeDropsLostLeaseTLS: TestRemovedNodeDropsMovedPart's
// removal in a cluster with a CA, as `rialto server --tls-dir` runs. The
// removal revokes the node's certificate, which its agent presents when
// the control plane calls it: the teardowns the removal sends it accept
// that certificate (the one the removal revoked, no other), so the agent
// tears down the lease lost with the node and wipes its range. They were
// refused (certificate revoked) unless a connection made before the
// removal was still open: the control plane restarts first, so that
// none is.
func TestRemovedNodeDropsLostLeaseTLS(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, TLS: true, Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 64 << 20}}})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	u, err := nbd.ParseURI(l.URI)
	if err != nil {
		t.Fatal(err)
	}
	vol, err := u.Dial(ctx, dataTLS(t, c))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vol.WriteAt([]byte("hello"), 4096); err != nil {
		t.Fatal(err)
	}
	if err := vol.Flush(); err != nil {
		t.Fatal(err)
	}
	vol.Close()
	n := c.NodeByID(l.Parts[0].NodeID)
	if rangeZero(t, n, l.Parts[0].Offset+4096) {
		t.Fatal("the lease's bytes are not on its lender's device")
	}
	c.RestartControlPlane()
	n.PauseHeartbeats(true) // it does not join again
	r, err := cl.RemoveNode(ctx, n.ID(), true)
	if err != nil {
		t.Fatal(err)
	}
	if r.Revoked == 0 || !slices.Contains(r.Lost, l.ID) {
		t.Fatalf("the removal: %+v", r)
	}
	if n.Serves(l.ID) {
		t.Error("the removed node still serves the lease lost with it")
	}
	if !rangeZero(t, n, l.Parts[0].Offset+4096) {
		t.Error("the removed node's range of the lost lease is not wiped")
	}
}
