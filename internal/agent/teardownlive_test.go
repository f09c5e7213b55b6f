package agent

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// slowTeardownDriver is the block driver whose Teardown waits until gate
// is closed before it stops serving the export; entered gets a value as
// it begins.
type slowTeardownDriver struct {
	*BlockDriver
	gate, entered chan struct{}
}

func (d slowTeardownDriver) Teardown(ctx context.Context, e Export) error {
	d.entered <- struct{}{}
	<-d.gate
	return d.BlockDriver.Teardown(ctx, e)
}

// TestNoWipeUnderAServedExport: a range entered in the wipe journal for a
// teardown is not wiped by a heartbeat round's retry of the journal while
// its export is still served (its driver's teardown under way): that wipe
// could end before the tenant's last write, and it dropped the range from
// the journal, lendable while it held that write until the teardown's own
// wipe came. The teardown's wipe, once the export stopped, zeroes it.
func TestNoWipeUnderAServedExport(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	cfg := testConfig(srv.URL, dir)
	drv := slowTeardownDriver{BlockDriver: NewBlockDriver(slog.New(slog.DiscardHandler)), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	cfg.Drivers = map[api.Kind]Driver{api.KindBlock: drv}
	a := start(t, cfg).a
	released := false
	defer func() {
		if !released {
			close(drv.gate) // the test failed: let the teardown end
		}
	}()
	uri := prepareBlock(t, a, "lease-a", 0, leaseSize)
	secret := bytes.Repeat([]byte("tenant "), leaseSize/7+1)[:leaseSize]
	nbdWrite(t, uri, secret, 0)

	done := make(chan error, 1)
	go func() { done <- a.Teardown(ctxFor(t), "lease-a") }()
	within(t, drv.entered, "the teardown did not reach the driver")
	// A heartbeat round's retry of the journal, while the export serves.
	if err := a.retryWipes(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if got := journal(t, dir); len(got) != 1 || got[0].LeaseID != "lease-a" {
		t.Fatalf("the journal while the export is torn down: %+v, want lease-a's range", got)
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), secret) {
		t.Fatal("the range was wiped while its export was served")
	}
	close(drv.gate)
	released = true
	if err := within(t, done, "the teardown did not end"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), make([]byte, leaseSize)) {
		t.Fatal("the torn-down range was not wiped")
	}
	if got := journal(t, dir); len(got) != 0 {
		t.Fatalf("the journal after the teardown: %+v", got)
	}
}
