package testcluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// commitHold is the control plane's lender, whose first transfer commit
// (a move's destination) waits until release is closed: entered is closed
// when it arrives.
type commitHold struct {
	*controlplane.HTTPLender
	once             sync.Once
	entered, release chan struct{}
}

func (h *commitHold) TransferCommit(ctx context.Context, node api.Node, agentKey, id string, req api.TransferCommitRequest) (api.TransferCommitResponse, error) {
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.entered)
		select {
		case <-h.release:
		case <-ctx.Done():
			return api.TransferCommitResponse{}, ctx.Err()
		}
	}
	return h.HTTPLender.TransferCommit(ctx, node, agentKey, id, req)
}

// TestMovedPartKnowsTheRenewedExpiry: a lease renewed while its part
// moves is served at the destination from the commit on until its
// renewed expiry, without a heartbeat answer (the destination's
// heartbeats are paused from the commit on): the commit brings the
// lease's expiry. The destination, which only received the part and
// did not report the lease, kept the expiry the TransferIn brought, past
// by then, and stopped serving the part at once.
func TestMovedPartKnowsTheRenewedExpiry(t *testing.T) {
	t.Parallel()
	h := &commitHold{entered: make(chan struct{}), release: make(chan struct{})}
	c := Start(t, Options{Nodes: 2, Devices: moveDevices(), Lender: func(l controlplane.Lender) controlplane.Lender {
		h.HTTPLender = l.(*controlplane.HTTPLender)
		return h
	}})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, TTLSeconds: 600})
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
	// While the move waits to commit: the lease is renewed, and time
	// passes beyond the expiry the TransferIn brought (10 minutes in).
	c.Advance(8 * time.Minute)
	if _, err := cl.RenewLease(ctx, l.ID, 600); err != nil {
		t.Fatal(err)
	}
	c.Heartbeat() // the source hears the renewal
	c.Advance(4 * time.Minute)
	dst := c.NodeByID(ms[0].To.NodeID)
	dst.PauseHeartbeats(true) // no answer renews the moved part
	close(h.release)
	if ms := waitMoves(t, c, l.ID, 1); ms[0].State != api.MoveDone {
		t.Fatalf("move %+v", ms[0])
	}
	// A round of the destination's heartbeat loop, cut off from the
	// control plane: it stops the exports whose known expiry passed.
	if err := dst.Agent().Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	moved, err := cl.Lease(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	vol, err = nbd.DialURI(ctx, moved.URI)
	if err != nil {
		t.Fatalf("the moved part, its lease renewed: %v", err)
	}
	defer vol.Close()
	got := make([]byte, 5)
	if _, err := vol.ReadAt(got, 4096); err != nil || string(got) != "hello" {
		t.Fatalf("the moved part reads %q (%v)", got, err)
	}
}
