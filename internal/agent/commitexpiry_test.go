package agent

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
)

// TestCommitBringsTheLeaseExpiry: a part moved here knows its lease's
// expiry as the commit brings it (counted from timeout_seconds before the
// commit arrived, as a prepare's), not as the TransferIn did: the lease
// was renewed while the part moved, and this lender, which only received
// it, heard no renewal. The part kept the TransferIn's expiry, past by
// the commit, and was stopped at once (until an answer came).
func TestCommitBringsTheLeaseExpiry(t *testing.T) {
	_, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
	cpNow := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // the control plane's clock
	src := start(t, moveConfig(srv.URL, t.TempDir(), "src")).a
	cfg := moveConfig(srv.URL, t.TempDir(), "dst")
	cfg.Clock = clk
	dst := start(t, cfg).a
	ctx := ctxFor(t)
	uri := prepareBlock(t, src, "lease-m", 0, movePart)
	nbdWrite(t, uri, []byte("hello"), 4096)

	const id, moved = "c2", "x_lease-m.moved"
	in, err := dst.ReceiveTransfer(ctx, api.TransferInRequest{ID: id, Token: "tok_" + id,
		Part: api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindBlock, DeviceName: "disk0", Length: movePart, Export: moved,
			ExpiresAt: cpNow.Add(time.Minute), Now: cpNow, TimeoutSeconds: 30},
		ExpiresAt: cpNow.Add(6 * time.Hour), Now: cpNow})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.SendTransfer(ctx, api.TransferOutRequest{ID: id, LeaseID: "lease-m", Export: "x_lease-m", DestURI: in.URI}); err != nil {
		t.Fatal(err)
	}
	waitTransfer(t, src, id, api.TransferReady)
	if _, err := src.SealTransfer(ctx, id); err != nil {
		t.Fatal(err)
	}

	// Two minutes on: the TransferIn's expiry has passed; the lease,
	// renewed meanwhile, has an hour left.
	clk.Advance(2 * time.Minute)
	cpNow = cpNow.Add(2 * time.Minute)
	resp, body := call(t, dst, "key-1", "/agent/v1/transfers/"+id+"/commit",
		api.TransferCommitRequest{ExpiresAt: cpNow.Add(time.Hour), Now: cpNow, TimeoutSeconds: 30})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("commit: %d %s", resp.StatusCode, body)
	}
	var cr api.TransferCommitResponse
	if err := json.Unmarshal(body, &cr); err != nil {
		t.Fatal(err)
	}
	dst.mu.Lock()
	e := dst.exports[moved]
	dst.mu.Unlock()
	if want := clk.Now().Add(time.Hour - 30*time.Second); !e.Request.ExpiresAt.Equal(want) {
		t.Errorf("the moved part's known expiry is %v, want %v (the commit's, counted from its bound before it arrived)",
			e.Request.ExpiresAt, want)
	}
	if n := dst.enforceExpiry(ctx, true); n != 0 {
		t.Fatalf("the freshly moved part was stopped (%d exports) at its expiry as the TransferIn knew it", n)
	}
	if got := nbdRead(t, cr.URI, 5, 4096); string(got) != "hello" {
		t.Errorf("the moved part reads %q", got)
	}
	if _, err := src.CommitTransfer(ctx, id, api.TransferCommitRequest{}); err != nil {
		t.Fatal(err)
	}
}
