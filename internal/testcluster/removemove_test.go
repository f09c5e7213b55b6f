package testcluster

import (
	"slices"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// TestRemovedMoveDestinationTakesNoPart: a node removed (--force) while
// it is the destination of a move — its agent still running, cut off from
// the control plane (as when the operator also rotated the bootstrap
// token) — does not become the lease's part: the move fails, the part
// stays at its source, served with its bytes, and the removal does not
// report the lease lost (it was not). The control plane pointed the lease
// at the removed node, and since a sweep looks no further at a removed
// node, the lease stayed active on it for good, its removal's report
// listing it lost all the same.
func TestRemovedMoveDestinationTakesNoPart(t *testing.T) {
	t.Parallel()
	h := &commitHold{entered: make(chan struct{}), release: make(chan struct{})}
	c := Start(t, Options{Nodes: 2, Devices: moveDevices(), Lender: func(l controlplane.Lender) controlplane.Lender {
		h.HTTPLender = l.(*controlplane.HTTPLender)
		return h
	}})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	vol, err := nbd.DialURI(ctx, l.URI)
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
	ms, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.entered:
	case <-ctx.Done():
		t.Fatal("the move did not reach its commit")
	}
	dst := c.NodeByID(ms[0].To.NodeID)
	dst.PauseHeartbeats(true) // it does not join again
	r, err := cl.RemoveNode(ctx, dst.ID(), true)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(r.Lost, l.ID) {
		t.Errorf("the removal reports lease %s lost; only a move's destination was on the node", l.ID)
	}
	close(h.release)
	if ms := waitMoves(t, c, l.ID, 1); ms[0].State != api.MoveFailed {
		t.Errorf("the move onto the removed node: %+v", ms[0])
	}
	c.Sweep() // it loses what is on a removed node
	got := c.Lease(l.ID)
	if got.State != api.LeaseActive || got.NodeID != l.NodeID {
		t.Fatalf("after the removal of the move's destination the lease is %s on %s (its source is %s)", got.State, got.NodeID, l.NodeID)
	}
	vol, err = nbd.DialURI(ctx, got.URI)
	if err != nil {
		t.Fatalf("the part at its source: %v", err)
	}
	defer vol.Close()
	b := make([]byte, 5)
	if _, err := vol.ReadAt(b, 4096); err != nil || string(b) != "hello" {
		t.Fatalf("the part at its source reads %q (%v)", b, err)
	}
}
