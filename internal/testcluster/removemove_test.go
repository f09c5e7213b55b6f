package testcluster

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
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
	h := newCommitHold()
	ctx := ctxT(t)
	c, l := startHeld(ctx, t, h, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	cl := c.Client()
	writeHello(ctx, t, l.URI)
	ms := moveHeld(ctx, t, c, l.ID, h)
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
	checkHello(ctx, t, got.URI, "the part at its source")
}

// sealHold is a lenderHold of the first transfer seal (a move's source,
// ready).
type sealHold struct{ lenderHold }

func newSealHold() *sealHold {
	return &sealHold{lenderHold{step: "seal", entered: make(chan struct{}), release: make(chan struct{})}}
}

func (h *sealHold) TransferSeal(ctx context.Context, node api.Node, agentKey, id string) (api.Transfer, error) {
	if err := h.hold(ctx); err != nil {
		return api.Transfer{}, err
	}
	return h.HTTPLender.TransferSeal(ctx, node, agentKey, id)
}

// TestRemovedMoveSourceCommitsNothing: a node removed (--force) while it
// is the source of a move whose copy is ready loses the lease (its part
// was there), and the move ends without the destination ever serving the
// lost lease's part: it is aborted there and its range wiped. The
// control plane committed the destination first (the lease, lost, could
// not point at it, and a committed destination refuses the abort), which
// served the lost lease's part until a heartbeat answer told it
// otherwise (here its heartbeats are paused), its range free in the
// store meanwhile.
func TestRemovedMoveSourceCommitsNothing(t *testing.T) {
	t.Parallel()
	h := newSealHold()
	ctx := ctxT(t)
	c, l := startHeld(ctx, t, h, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	cl := c.Client()
	ms := moveHeld(ctx, t, c, l.ID, h)
	src, dst := c.NodeByID(l.NodeID), c.NodeByID(ms[0].To.NodeID)
	src.PauseHeartbeats(true)
	dst.PauseHeartbeats(true) // no heartbeat answer tears anything down
	r, err := cl.RemoveNode(ctx, src.ID(), true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(r.Lost, l.ID) {
		t.Fatalf("the removal of the source does not list the lease lost: %+v", r.Lost)
	}
	close(h.release)
	if ms := waitMoves(t, c, l.ID, 1); ms[0].State != api.MoveFailed {
		t.Errorf("the move of the lost lease: %+v", ms[0])
	}
	if dst.Serves(l.ID) {
		t.Error("the destination serves the lost lease's part")
	}
	if got := c.Lease(l.ID); got.State != api.LeaseLost || !strings.Contains(got.Reason, "was removed") {
		t.Errorf("the lease: %s (%s)", got.State, got.Reason)
	}
}
