package agent

import (
	"bytes"
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// statusHookDriver is a noticingDriver whose moving parts run the hook
// armed (once) the next time a transfer's state is read (transfer.status
// asks the source how much is dirty, with the transfer's mu held).
type statusHookDriver struct {
	noticingDriver
	hook *atomic.Pointer[func()]
}

func (d statusHookDriver) SendMove(ctx context.Context, e Export) (MoveSource, error) {
	src, err := d.noticingDriver.SendMove(ctx, e)
	if err != nil {
		return nil, err
	}
	return hookedSource{MoveSource: src, hook: d.hook}, nil
}

type hookedSource struct {
	MoveSource
	hook *atomic.Pointer[func()]
}

func (s hookedSource) Dirty() int64 {
	if f := s.hook.Swap(nil); f != nil {
		(*f)()
	}
	return s.MoveSource.Dirty()
}

// TestExpiryStopSparesAMoveSealedMeanwhile: the control plane seals a
// move just as the lease's known expiry passes at the source, after the
// expiry stop read the transfer's state (ready) and before it aborted it.
// The stop leaves the sealed move as it is (the control plane goes on to
// commit the destination and point the lease at it), and the write the
// move holds is not taken by the source. The stop aborted the sealed
// move: the held write ran on the source, acknowledged, and was missing
// at the destination the lease then pointed at; the source's commit
// failed.
func TestExpiryStopSparesAMoveSealedMeanwhile(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	hook := new(atomic.Pointer[func()])
	drv := statusHookDriver{noticingDriver: newNoticingDriver(clk), hook: hook}
	scfg := moveConfig(srv.URL, t.TempDir(), "src")
	scfg.Clock = clk
	scfg.Drivers = map[api.Kind]Driver{api.KindBlock: drv}
	src := start(t, scfg).a
	dst := start(t, moveConfig(srv.URL, t.TempDir(), "dst")).a
	ctx := ctxFor(t)
	exp := clk.Now().Add(time.Minute)
	resp, err := src.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindBlock, DeviceName: "disk0",
		Length: movePart, Export: "x_lease-m", ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	before, late := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
	nbdWrite(t, resp.URI, before, 0)

	const id = "s1"
	in, err := dst.ReceiveTransfer(ctx, api.TransferInRequest{ID: id, Token: "tok_" + id,
		Part: api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindBlock, DeviceName: "disk0", Offset: movePart, Length: movePart,
			Export: "x_lease-m.moved"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.SendTransfer(ctx, api.TransferOutRequest{ID: id, LeaseID: "lease-m", Export: "x_lease-m", DestURI: in.URI,
		HoldSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	waitTransfer(t, src, id, api.TransferReady)

	// A write of the borrower, held by the ready move.
	c, err := nbd.DialURI(ctx, resp.URI)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.WriteAtContext(ctx, late, 0, true)
		done <- err
	}()
	for nbdSrv := &drv.BlockDriver.srv; nbdSrv.HeldWrites("x_lease-m") == 0; runtime.Gosched() {
		select {
		case err := <-done:
			t.Fatalf("the ready move did not hold the write: %v", err)
		default:
		}
	}

	// The seal comes right after the next read of the transfer's state:
	// SealTransfer's work, done as the read lets the transfer's mu go.
	x, err := src.xfers.get(id)
	if err != nil {
		t.Fatal(err)
	}
	seal := func() {
		x.setLocked(api.TransferSealed)
		close(x.sealed)
	}
	hook.Store(&seal)
	cp.set(func(f *fakeCP) { f.down = true })
	clk.Advance(exp.Sub(clk.Now()))
	within(t, drv.stopped, "the export was not stopped at its known expiry")
	if hook.Load() != nil {
		t.Fatal("the expiry stop did not read the transfer's state")
	}
	if st, _ := src.Transfer(id); st.State != api.TransferSealed {
		t.Errorf("the move sealed as the expiry stop came is %s (%s), want sealed", st.State, st.Error)
	}

	// The control plane commits the destination (the lease points at
	// it), then the source.
	cr, err := dst.CommitTransfer(ctx, id, api.TransferCommitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.CommitTransfer(ctx, id, api.TransferCommitRequest{}); err != nil {
		t.Errorf("the source's commit: %v", err)
	}
	werr := <-done
	got := nbdRead(t, cr.URI, 4096, 0)
	switch {
	case werr == nil && !bytes.Equal(got, late):
		t.Fatal("a write the source acknowledged is missing where the lease now points")
	case werr == nil:
		t.Error("the source took a write its sealed move held")
	case !bytes.Equal(got, before):
		t.Error("the moved part does not hold what the source had")
	}
}
