package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// gatedWipeDriver is the block driver whose wipes wait until gate is
// closed (a large range zeroed on a device that cannot punch holes: the
// real driver punches holes in a file, at once whatever its size, so the
// tests hold it here instead). started gets a value as each wipe begins;
// ended one as each returns.
type gatedWipeDriver struct {
	*BlockDriver
	gate           chan struct{}
	started, ended chan struct{}
}

func newGatedWipeDriver() gatedWipeDriver {
	return gatedWipeDriver{BlockDriver: NewBlockDriver(slog.New(slog.DiscardHandler)), gate: make(chan struct{}),
		started: make(chan struct{}, 8), ended: make(chan struct{}, 8)}
}

func (d gatedWipeDriver) Wipe(ctx context.Context, e Export) error {
	d.started <- struct{}{}
	defer func() { d.ended <- struct{}{} }()
	select {
	case <-d.gate:
	case <-ctx.Done():
		return fmt.Errorf("wipe held: %w", ctx.Err())
	}
	return d.BlockDriver.Wipe(ctx, e)
}

// sealedBlockMove moves lease-m's part (holding secret at 0) from src to
// dst up to the destination's commit: the source's commit is left.
func sealedBlockMove(t *testing.T, src, dst *Agent, id string, uri string, secret []byte) {
	t.Helper()
	nbdWrite(t, uri, secret, 0)
	startBlockMove(t, src, dst, id, 0, api.TransferOutRequest{})
	waitTransfer(t, src, id, api.TransferReady)
	if _, err := src.SealTransfer(ctxFor(t), id); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.CommitTransfer(ctxFor(t), id, api.TransferCommitRequest{}); err != nil {
		t.Fatal(err)
	}
}

// commitSource commits the source of transfer id, failing the test if
// the commit does not answer while the wipe is held.
func commitSource(t *testing.T, src *Agent, id string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := src.CommitTransfer(ctxFor(t), id, api.TransferCommitRequest{})
		done <- err
	}()
	if err := within(t, done, "the source's commit waited for the old range's wipe"); err != nil {
		t.Fatal(err)
	}
}

// TestCommitOutAnswersBeforeTheWipe: the source's commit answers once the
// old export is retired and torn down and its range durably in the wipe
// journal, without waiting for the wipe, which runs in the background:
// a slow one no longer outlasts the control plane's bound on the call.
// Until the wipe ends the range, which still holds the tenant's bytes,
// is lent to no one (a prepare and a transfer into it are refused); once
// it ends the range reads as zeroes, leaves the journal and is lent again.
func TestCommitOutAnswersBeforeTheWipe(t *testing.T) {
	drv := newGatedWipeDriver()
	defer close(drv.gate)
	src, dst, uri := blockMovers(t, drv)
	srcDir := src.cfg.StateDir
	secret := bytes.Repeat([]byte("tenant "), movePart/7+1)[:movePart]
	const id = "w1"
	sealedBlockMove(t, src, dst, id, uri, secret)

	commitSource(t, src, id)
	within(t, drv.started, "the old range's wipe did not start")
	if st, _ := src.Transfer(id); st.State != api.TransferCommitted {
		t.Errorf("the source's transfer is %s, want committed", st.State)
	}
	if served(t, uri) {
		t.Error("the old export is still served")
	}
	if got := journal(t, srcDir); len(got) != 1 || got[0].LeaseID != "lease-m" || got[0].Offset != 0 || got[0].Length != movePart {
		t.Fatalf("the wipe journal while the wipe runs: %+v, want lease-m's range", got)
	}
	if !bytes.Equal(diskBytes(t, srcDir, 0, movePart), secret) {
		t.Fatal("the range no longer holds the tenant's bytes: the wipe is not held")
	}
	next := api.PrepareRequest{LeaseID: "lease-next", Kind: api.KindBlock, DeviceName: "disk0", Offset: 4096, Length: 4096, Export: "x_lease-next"}
	if _, err := src.Prepare(ctxFor(t), next); !errors.Is(err, ErrOverlap) {
		t.Fatalf("a prepare on the range being wiped: %v, want ErrOverlap", err)
	}
	if _, err := src.ReceiveTransfer(ctxFor(t), api.TransferInRequest{ID: "w2", Token: "tok_w2", Part: next}); !errors.Is(err, ErrOverlap) {
		t.Fatalf("a transfer into the range being wiped: %v, want ErrOverlap", err)
	}
	// A heartbeat round meanwhile leaves the wipe under way to its
	// goroutine (it does not wait for it, nor wipe twice).
	if err := src.Heartbeat(ctxFor(t)); err != nil {
		t.Fatal(err)
	}

	drv.gate <- struct{}{} // one wipe goes on (the deferred close lets any other)
	within(t, src.bg.done(), "the wipe did not end")
	if !bytes.Equal(diskBytes(t, srcDir, 0, movePart), make([]byte, movePart)) {
		t.Fatal("the old range was not wiped")
	}
	if got := journal(t, srcDir); len(got) != 0 {
		t.Fatalf("the wipe journal after the wipe: %+v", got)
	}
	resp, err := src.Prepare(ctxFor(t), next)
	if err != nil {
		t.Fatalf("a prepare on the wiped range: %v", err)
	}
	if got := nbdRead(t, resp.URI, 4096, 0); !bytes.Equal(got, make([]byte, 4096)) {
		t.Error("the next lease reads the moved tenant's bytes")
	}
}

// TestStopInterruptsTheBackgroundWipe: an agent stopped while a moved
// part's old range is wiped in the background interrupts the wipe and
// returns from Run only once the wipe has returned; the range stays in
// the journal, and the next run wipes it before it serves anything.
func TestStopInterruptsTheBackgroundWipe(t *testing.T) {
	_, srv := newFakeCP(t)
	drv := newGatedWipeDriver()
	defer close(drv.gate)
	srcDir := t.TempDir()
	cfg := moveConfig(srv.URL, srcDir, "src")
	cfg.Drivers = map[api.Kind]Driver{api.KindBlock: drv}
	run := start(t, cfg)
	src := run.a
	dst := start(t, moveConfig(srv.URL, t.TempDir(), "dst")).a
	uri := prepareBlock(t, src, "lease-m", 0, movePart)
	secret := bytes.Repeat([]byte("tenant "), movePart/7+1)[:movePart]
	const id = "w3"
	sealedBlockMove(t, src, dst, id, uri, secret)
	commitSource(t, src, id)
	within(t, drv.started, "the old range's wipe did not start")

	run.halt(t)
	select {
	case <-drv.ended:
	default:
		t.Fatal("Run returned with the background wipe still under way")
	}
	if got := journal(t, srcDir); len(got) != 1 || got[0].LeaseID != "lease-m" {
		t.Fatalf("the wipe journal after the stop: %+v, want lease-m's range", got)
	}
	if !bytes.Equal(diskBytes(t, srcDir, 0, movePart), secret) {
		t.Fatal("the interrupted wipe zeroed the range")
	}

	// The next run (wipes no longer held) wipes it before it serves.
	cfg.Drivers = nil
	src = start(t, cfg).a
	if got := journal(t, srcDir); len(got) != 0 {
		t.Fatalf("the wipe journal once the next run is ready: %+v", got)
	}
	if !bytes.Equal(diskBytes(t, srcDir, 0, movePart), make([]byte, movePart)) {
		t.Fatal("the next run did not wipe the range")
	}
	if got := nbdRead(t, prepareBlock(t, src, "lease-next", 0, movePart), movePart, 0); !bytes.Equal(got, make([]byte, movePart)) {
		t.Error("the next lease reads the moved tenant's bytes")
	}
}
