package agent

import (
	"bytes"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// heldOrAnswered waits until export name of a's block driver holds a
// write, or the write whose answer comes on done has been answered
// (answered true, with its error).
func heldOrAnswered(t *testing.T, a *Agent, name string, done <-chan error) (err error, answered bool) {
	t.Helper()
	srv := &a.drivers[api.KindBlock].(*BlockDriver).srv
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			return err, true
		default:
		}
		if srv.HeldWrites(name) > 0 {
			return nil, false
		}
		if time.Now().After(deadline) {
			t.Fatal("the write was neither held nor answered")
		}
		runtime.Gosched()
	}
}

// TestSuspendKeepsBlockMove: a block export suspended while its sealed
// move holds the borrower's writes (the lease's known expiry passed at
// the source with the control plane away) and served again on the
// renewal before the move's commit still holds them. A write the source
// took then would be missing at the destination, whose copy the commit
// makes the lease's: acknowledged, and lost. Held, it is refused at the
// commit (ESHUTDOWN: the borrower writes it again where the lease now
// is).
func TestSuspendKeepsBlockMove(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	scfg := moveConfig(srv.URL, t.TempDir(), "src")
	scfg.Clock = clk
	src := start(t, scfg).a
	dst := start(t, moveConfig(srv.URL, t.TempDir(), "dst")).a
	ctx := ctxFor(t)
	resp, err := src.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindBlock, DeviceName: "disk0",
		Length: movePart, Export: "x_lease-m", ExpiresAt: clk.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	uri := resp.URI
	before, late := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
	nbdWrite(t, uri, before, 0)

	in, err := dst.ReceiveTransfer(ctx, api.TransferInRequest{ID: "s1", Token: "tok_s1",
		Part: api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindBlock, DeviceName: "disk0", Offset: movePart, Length: movePart,
			Export: "x_lease-m"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.SendTransfer(ctx, api.TransferOutRequest{ID: "s1", LeaseID: "lease-m", Export: "x_lease-m", DestURI: in.URI,
		HoldSeconds: 20}); err != nil {
		t.Fatal(err)
	}
	waitTransfer(t, src, "s1", api.TransferReady)
	if _, err := src.SealTransfer(ctx, "s1"); err != nil {
		t.Fatal(err)
	}

	// The expiry passes without the control plane: the export stops, the
	// sealed move is left to the control plane.
	cp.set(func(f *fakeCP) { f.down = true })
	clk.Advance(time.Minute)
	if err := src.Heartbeat(ctx); err == nil {
		t.Fatal("heartbeat to a control plane that is down succeeded")
	}
	if served(t, uri) {
		t.Fatal("the export is served past its lease's expiry")
	}
	if st, _ := src.Transfer("s1"); st.State != api.TransferSealed {
		t.Fatalf("the sealed move after the suspension: %+v", st)
	}
	// Renewed before the commit: served again.
	cp.set(func(f *fakeCP) { f.down, f.expires = false, map[string]time.Time{"lease-m": clk.Now().Add(time.Hour)} })
	if err := src.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatalf("the renewed export is not served: %v", err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.WriteAtContext(ctx, late, 0, true)
		done <- err
	}()
	werr, answered := heldOrAnswered(t, src, "x_lease-m", done)
	if answered && werr == nil {
		t.Error("after the renewal the source took a write while its sealed move holds them")
	}

	cr, err := dst.CommitTransfer(ctx, "s1", api.TransferCommitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.CommitTransfer(ctx, "s1", api.TransferCommitRequest{}); err != nil {
		t.Fatal(err)
	}
	if !answered {
		if werr = <-done; !errors.Is(werr, nbd.ErrShutdown) {
			t.Errorf("the write held at the commit: %v, want ESHUTDOWN", werr)
		}
	}
	got := nbdRead(t, cr.URI, 4096, 0)
	switch {
	case werr == nil && !bytes.Equal(got, late):
		t.Errorf("a write the source acknowledged is not in the lease's data after the commit (it reads %d...)", got[0])
	case werr != nil && !bytes.Equal(got, before):
		t.Errorf("the moved part reads %d..., want the bytes from before the move held the writes", got[0])
	}
}

// TestMovedPartCounted: a block part moved here is counted in its
// device's traffic (the heartbeats' usage) as a part prepared here is,
// and the copy to it is not the borrower's traffic.
func TestMovedPartCounted(t *testing.T) {
	_, srv := newFakeCP(t)
	src := start(t, moveConfig(srv.URL, t.TempDir(), "src")).a
	dst := start(t, moveConfig(srv.URL, t.TempDir(), "dst")).a
	ctx := ctxFor(t)
	nbdWrite(t, prepareBlock(t, src, "lease-m", 0, movePart), bytes.Repeat([]byte{1}, 64<<10), 0)
	in, err := dst.ReceiveTransfer(ctx, api.TransferInRequest{ID: "c1", Token: "tok_c1",
		Part: api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindBlock, DeviceName: "disk0", Offset: movePart, Length: movePart,
			Export: "x_lease-m"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.SendTransfer(ctx, api.TransferOutRequest{ID: "c1", LeaseID: "lease-m", Export: "x_lease-m", DestURI: in.URI}); err != nil {
		t.Fatal(err)
	}
	waitTransfer(t, src, "c1", api.TransferReady)
	if _, err := src.SealTransfer(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	cr, err := dst.CommitTransfer(ctx, "c1", api.TransferCommitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.CommitTransfer(ctx, "c1", api.TransferCommitRequest{}); err != nil {
		t.Fatal(err)
	}
	traffic := func() (read, written int64) {
		t.Helper()
		for _, u := range dst.usage() {
			if u.Name == "disk0" {
				return u.ReadBytes, u.WrittenBytes
			}
		}
		t.Fatal("no usage of disk0")
		return 0, 0
	}
	r0, w0 := traffic()
	if w0 != 0 {
		t.Errorf("the copy counted %d bytes written by the borrower", w0)
	}
	nbdWrite(t, cr.URI, bytes.Repeat([]byte{2}, 8192), 4096)
	if got := nbdRead(t, cr.URI, 4096, 0); !bytes.Equal(got, bytes.Repeat([]byte{1}, 4096)) {
		t.Fatalf("the moved part reads %d...", got[0])
	}
	if r, w := traffic(); r-r0 != 4096 || w-w0 != 8192 {
		t.Errorf("the moved part's traffic counted %d bytes read and %d written, want 4096 and 8192", r-r0, w-w0)
	}
}
