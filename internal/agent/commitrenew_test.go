package agent

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
)

// TestMovedPartRenewedInItsLastSeconds: a part moved here whose commit
// comes while a heartbeat round is under way, in the last expiryAskAhead
// of its lease's expiry, is not stopped at that expiry when the lease is
// renewed: the answer to that round judges only what was served before
// its heartbeat left, so the agent asks again once it has ended, and
// learns the renewal before the expiry. It waited for the expiry instead,
// stopped serving the part and served it again only after the next round.
func TestMovedPartRenewedInItsLastSeconds(t *testing.T) {
	_, srcCP := newFakeCP(t)
	cp, dstCP := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg := moveConfig(dstCP.URL, t.TempDir(), "dst")
	drv := newNoticingDriver(clk)
	cfg.Clock, cfg.Drivers = clk, map[api.Kind]Driver{api.KindBlock: drv}
	dst := start(t, cfg).a
	if err := clk.BlockUntil(ctxFor(t), 1); err != nil {
		t.Fatal(err)
	}
	src := start(t, moveConfig(srcCP.URL, t.TempDir(), "src")).a
	ctx := ctxFor(t)
	prepareBlock(t, src, "lease-m", 0, movePart)

	exp := clk.Now().Add(time.Minute)
	renewed := exp.Add(time.Hour)
	// Another lease here whose ask comes 1.5 s before the moved part's
	// expiry: the heartbeat loop's round then is under way at the commit.
	if _, err := dst.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-b", Kind: api.KindBlock, DeviceName: "disk0",
		Offset: movePart, Length: movePart, Export: "x_lease-b", ExpiresAt: exp.Add(500 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	in, err := dst.ReceiveTransfer(ctx, api.TransferInRequest{ID: "r1", Token: "tok_r1",
		Part: api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindBlock, DeviceName: "disk0", Length: movePart,
			Export: "x_lease-m.moved"}, ExpiresAt: clk.Now().Add(6 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.SendTransfer(ctx, api.TransferOutRequest{ID: "r1", LeaseID: "lease-m", Export: "x_lease-m", DestURI: in.URI,
		HoldSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	waitState(t, src, "r1", api.TransferReady)
	if _, err := src.SealTransfer(ctx, "r1"); err != nil {
		t.Fatal(err)
	}

	// The control plane renews both leases; the round that asks about
	// lease-b is under way when the part's commit comes.
	cp.set(func(f *fakeCP) { f.expires = map[string]time.Time{"lease-m": renewed, "lease-b": renewed} })
	beat, answer := holdNextBeat(cp)
	clk.Advance(exp.Add(-1500 * time.Millisecond).Sub(clk.Now()))
	within(t, beat, "the agent did not ask about lease-b ahead of its expiry")
	clk.Advance(500 * time.Millisecond)
	cr, err := dst.CommitTransfer(ctx, "r1", api.TransferCommitRequest{ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.CommitTransfer(ctx, "r1", api.TransferCommitRequest{}); err != nil {
		t.Fatal(err)
	}
	again, next := holdNextBeat(cp)
	close(answer) // lease-b renewed; the moved part is newer than that heartbeat
	within(t, again, "the agent did not ask again about the part moved here while a round was under way, before its expiry")
	close(next)
	roundsDone(dst)

	clk.Advance(exp.Sub(clk.Now()))
	// The loop plans its next wait after the advance: once it waits for
	// a timer again, whatever the expiry made it do is done.
	if err := clk.BlockUntil(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(dst.mSuspends.WithLabelValues("block")); n != 0 {
		t.Fatalf("stopped serving %v times at the old expiry, though the lease was renewed before it", n)
	}
	if !served(t, cr.URI) {
		t.Fatal("the moved part is not served after its old expiry, though renewed before it")
	}
}
