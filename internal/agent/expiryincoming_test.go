package agent

import (
	"context"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
)

// slowWipeDriver is a noticingDriver whose wipes wait until wiping is
// closed (a large range zeroed on a device that cannot punch holes).
type slowWipeDriver struct {
	noticingDriver
	wiping chan struct{}
}

func (d slowWipeDriver) Wipe(ctx context.Context, e Export) error {
	select {
	case <-d.wiping:
	case <-ctx.Done():
		return ctx.Err()
	}
	return d.noticingDriver.Wipe(ctx, e)
}

// TestExpiryStopLeavesIncomingMoves: when the known expiry of a lease's
// part served here passes, the agent stops serving it then, whatever
// another part of the lease moving here is doing; that incoming move,
// which serves the borrower nothing and has its own expiry, goes on. The
// stop first aborted the incoming move and wiped its range: the expired
// part was served until that wipe ended.
func TestExpiryStopLeavesIncomingMoves(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	drv := slowWipeDriver{noticingDriver: newNoticingDriver(clk), wiping: make(chan struct{})}
	defer close(drv.wiping)
	cfg := moveConfig(srv.URL, t.TempDir(), "n1")
	cfg.Clock = clk
	cfg.Drivers = map[api.Kind]Driver{api.KindBlock: drv}
	a := start(t, cfg).a
	ctx := ctxFor(t)
	cp.set(func(f *fakeCP) { f.down = true })
	exp := clk.Now().Add(time.Minute)
	resp, err := a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindBlock, DeviceName: "disk0",
		Length: movePart, Export: "x_lease-m.0", ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	const id = "i1"
	if _, err := a.ReceiveTransfer(ctx, api.TransferInRequest{ID: id, Token: "tok_" + id,
		Part: api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindBlock, DeviceName: "disk0", Offset: movePart, Length: movePart,
			Export: "x_lease-m.1"},
		ExpiresAt: clk.Now().Add(6 * time.Hour)}); err != nil {
		t.Fatal(err)
	}

	clk.Advance(exp.Sub(clk.Now()))
	if at := within(t, drv.stopped, "the expired part was not stopped while the lease's incoming move was given up"); !at.Equal(exp) {
		t.Fatalf("stopped at %v, its known expiry is %v", at, exp)
	}
	if served(t, resp.URI) {
		t.Fatal("served past its known expiry")
	}
	if st, err := a.Transfer(id); err != nil || st.State != api.TransferReceiving {
		t.Errorf("the incoming move after the expiry stop: %+v (%v), want receiving", st, err)
	}
}
