package agent

import (
	"bytes"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// TestExpiredBlockLeaseRefusedBeforeItsStop: with the control plane
// unreachable, a block lease's requests are refused from its known expiry
// on, on a connection opened before it and on a new one, even while the
// agent's stop of the export has not happened yet (held up here as it can
// be on a loaded machine: enforceExpiry waits for the agent's other
// work); a renewal an answer brought before then moves the data plane's
// deadline with the known expiry.
func TestExpiredBlockLeaseRefusedBeforeItsStop(t *testing.T) {
	cp, srv := newFakeCP(t)
	dir := t.TempDir()
	clk := clock.NewFake(time.Date(2026, 1, 1, 13, 40, 0, 0, time.UTC))
	cfg := testConfig(srv.URL, dir)
	cfg.Clock = clk
	cfg.HeartbeatInterval = time.Hour
	a := start(t, cfg).a
	ctx := ctxFor(t)
	resp, err := a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-a", ExpiresAt: clk.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	ua := resp.URI
	data := bytes.Repeat([]byte("until expiry "), leaseSize/13+1)[:leaseSize]
	nbdWrite(t, ua, data, 0)
	open, err := nbd.DialURI(ctx, ua)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()

	// Renewed while served: the data plane serves past the old expiry.
	exp := clk.Now().Add(2 * time.Minute)
	cp.set(func(f *fakeCP) { f.expires = map[string]time.Time{"lease-a": exp} })
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Advance(61 * time.Second)
	if _, err := open.ReadAtContext(ctx, make([]byte, 4096), 0); err != nil {
		t.Fatalf("a renewed lease refused a read past its old expiry: %v", err)
	}

	// The control plane goes away; the stop at the expiry is held up.
	cp.set(func(f *fakeCP) { f.down = true })
	a.enforceMu.Lock()
	held := true
	defer func() {
		if held {
			a.enforceMu.Unlock()
		}
	}()
	clk.Advance(exp.Sub(clk.Now()))
	if _, err := open.ReadAtContext(ctx, make([]byte, 4096), 0); err == nil {
		t.Fatal("a connection opened before the expiry still reads after it")
	}
	late, err := nbd.DialURI(ctx, ua)
	if err != nil {
		t.Fatal(err) // not stopped yet: the handshake is answered
	}
	defer late.Close()
	if _, err := late.WriteAtContext(ctx, make([]byte, 4096), 0, true); err == nil {
		t.Fatal("a write after the expiry was served")
	}
	if n := testutil.ToFloat64(a.mSuspends.WithLabelValues("block")); n != 0 {
		t.Fatalf("%v suspensions counted: the stop was not held up", n)
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), data) {
		t.Fatal("a write after the expiry reached the disk")
	}
	a.enforceMu.Unlock()
	held = false
}
