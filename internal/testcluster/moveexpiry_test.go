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

// lenderHold is the control plane's lender, whose first call of one
// step of a move (commitHold's, sealHold's) waits until release is
// closed: entered is closed when it arrives.
type lenderHold struct {
	*controlplane.HTTPLender
	step             string // the step held, for messages
	once             sync.Once
	entered, release chan struct{}
}

func (h *lenderHold) held() *lenderHold { return h }

// hold holds the first call until release is closed (nil) or ctx ends
// (its error); the others go on at once.
func (h *lenderHold) hold(ctx context.Context) error {
	first := false
	h.once.Do(func() { first = true })
	if !first {
		return nil
	}
	close(h.entered)
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// heldLender is a lenderHold holding one of its calls.
type heldLender interface {
	controlplane.Lender
	held() *lenderHold
}

// commitHold is a lenderHold of the first transfer commit (a move's
// destination).
type commitHold struct{ lenderHold }

func newCommitHold() *commitHold {
	return &commitHold{lenderHold{step: "commit", entered: make(chan struct{}), release: make(chan struct{})}}
}

func (h *commitHold) TransferCommit(ctx context.Context, node api.Node, agentKey, id string, req api.TransferCommitRequest) (api.TransferCommitResponse, error) {
	if err := h.hold(ctx); err != nil {
		return api.TransferCommitResponse{}, err
	}
	return h.HTTPLender.TransferCommit(ctx, node, agentKey, id, req)
}

// startHeld starts a cluster of two nodes with moveDevices whose control
// plane's lender is h, wrapping its HTTPLender, and creates the lease of
// req there.
func startHeld(ctx context.Context, t *testing.T, h heldLender, req api.LeaseRequest) (*Cluster, api.Lease) {
	t.Helper()
	c := Start(t, Options{Nodes: 2, Devices: moveDevices(), Lender: func(l controlplane.Lender) controlplane.Lender {
		h.held().HTTPLender = l.(*controlplane.HTTPLender)
		return h
	}})
	l, err := c.Client().CreateLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return c, l
}

// moveHeld starts lease id's move on c and waits until it reached the
// step h holds; it returns the move's parts.
func moveHeld(ctx context.Context, t *testing.T, c *Cluster, id string, h heldLender) []api.Move {
	t.Helper()
	ms, err := c.Client().MoveLease(ctx, id, api.MoveRequest{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.held().entered:
	case <-ctx.Done():
		t.Fatalf("the move did not reach its %s", h.held().step)
	}
	return ms
}

// writeHello writes "hello" at 4096 through a block lease's URI and
// flushes it.
func writeHello(ctx context.Context, t *testing.T, uri string) {
	t.Helper()
	vol, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	if _, err := vol.WriteAt([]byte("hello"), 4096); err != nil {
		t.Fatal(err)
	}
	if err := vol.Flush(); err != nil {
		t.Fatal(err)
	}
}

// checkHello checks that a block lease's part (what, for messages) serves
// writeHello's bytes through uri.
func checkHello(ctx context.Context, t *testing.T, uri, what string) {
	t.Helper()
	vol, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer vol.Close()
	b := make([]byte, 5)
	if _, err := vol.ReadAt(b, 4096); err != nil || string(b) != "hello" {
		t.Fatalf("%s reads %q (%v)", what, b, err)
	}
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
	h := newCommitHold()
	ctx := ctxT(t)
	c, l := startHeld(ctx, t, h, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, TTLSeconds: 600})
	cl := c.Client()
	writeHello(ctx, t, l.URI)
	ms := moveHeld(ctx, t, c, l.ID, h)
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
	checkHello(ctx, t, moved.URI, "the moved part")
}
