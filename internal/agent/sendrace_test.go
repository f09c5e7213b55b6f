package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestConcurrentSendsOfOneExport: requests to move one export that
// arrive together (the control plane retrying, two moves of a lease
// racing) start one transfer: one request is taken, every other is
// refused with ErrConflict, whichever runs first. The check that no
// transfer moves the export and the transfer's record were apart: two
// requests could both pass the check and both start a move of the
// part, two copiers holding and retiring one export.
func TestConcurrentSendsOfOneExport(t *testing.T) {
	const rounds, callers = 20, 16
	src, dst, _ := blockMovers(t, NewBlockDriver(slog.New(slog.DiscardHandler)))
	ctx := ctxFor(t)
	for r := range rounds {
		in, err := dst.ReceiveTransfer(ctx, api.TransferInRequest{ID: fmt.Sprintf("in%d", r), Token: fmt.Sprintf("tok_in%d", r),
			Part: api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindBlock, DeviceName: "disk0", Length: movePart,
				Export: fmt.Sprintf("x_lease-m.moved%d", r)}})
		if err != nil {
			t.Fatal(err)
		}
		begin := make(chan struct{})
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				<-begin
				_, errs[c] = src.SendTransfer(ctx, api.TransferOutRequest{ID: fmt.Sprintf("out%d-%d", r, c), LeaseID: "lease-m",
					Export: "x_lease-m", DestURI: in.URI})
			})
		}
		close(begin)
		wg.Wait()
		var started []string
		for c, err := range errs {
			switch {
			case err == nil:
				started = append(started, fmt.Sprintf("out%d-%d", r, c))
			case !errors.Is(err, ErrConflict):
				t.Fatalf("round %d: caller %d: %v, want ErrConflict", r, c, err)
			}
		}
		if len(started) != 1 {
			t.Fatalf("round %d: %d of %d concurrent moves of one export started (%v), want 1", r, len(started), callers, started)
		}
		if _, err := src.AbortTransfer(ctx, started[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := dst.AbortTransfer(ctx, fmt.Sprintf("in%d", r)); err != nil {
			t.Fatal(err)
		}
	}
}
