package agent

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// receivingDriver is the block driver that runs receiving (if set) as it
// starts to serve a range a transfer brings (ReceiveMove, under the
// agent's opMu): meanwhile the control plane gives the move up.
type receivingDriver struct {
	*BlockDriver
	receiving func(ctx context.Context)
}

func (d receivingDriver) ReceiveMove(ctx context.Context, e Export, token string) (string, error) {
	if d.receiving != nil {
		d.receiving(ctx)
	}
	return d.BlockDriver.ReceiveMove(ctx, e, token)
}

// startReceiving starts an agent whose block driver runs receiving in
// ReceiveMove (receiving gets the agent).
func startReceiving(t *testing.T, receiving func(ctx context.Context, a *Agent)) *Agent {
	t.Helper()
	_, srv := newFakeCP(t)
	cfg := moveConfig(srv.URL, t.TempDir(), "dst")
	var a *Agent
	cfg.Drivers = map[api.Kind]Driver{api.KindBlock: receivingDriver{BlockDriver: NewBlockDriver(slog.New(slog.DiscardHandler)),
		receiving: func(ctx context.Context) { receiving(ctx, a) }}}
	a = start(t, cfg).a
	return a
}

// rangeFree checks that a lease can be prepared on the range a transfer
// took: nothing of the transfer is left on it (an export, a wipe owed).
func rangeFree(t *testing.T, a *Agent) {
	t.Helper()
	a.mu.Lock()
	_, kept := a.exports["x_new"]
	a.mu.Unlock()
	if kept {
		t.Error("the transfer's part is kept")
	}
	if _, err := a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "lease-next", Kind: api.KindBlock, DeviceName: "disk0",
		Length: movePart, Export: "x_next"}); err != nil {
		t.Errorf("the transfer's range is not free: %v", err)
	}
}

// TestAbortWhileReceiving: the control plane's abort of a transfer that
// the destination is still setting up (it had waited for the agent's
// other work, or its range's export is being made: the control plane gave
// the TransferIn up, or a new leader aborts the moves it finds open) ends
// at once, and the receive, finding its transfer aborted, undoes its
// work: nothing of it is left, the range is free. The abort took the
// transfer's part to tear down before it existed (a driver of no kind:
// a panic with the agent's opMu held, which wedged every later prepare,
// teardown and heartbeat), after waiting for the receive.
func TestAbortWhileReceiving(t *testing.T) {
	const id = "r1"
	aborted := make(chan error, 1)
	a := startReceiving(t, func(ctx context.Context, a *Agent) {
		go func() {
			_, err := a.AbortTransfer(ctx, id)
			aborted <- err
		}()
		select {
		case err := <-aborted:
			if err != nil {
				t.Errorf("abort: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the abort waited for the receive under way")
		}
	})
	_, err := a.ReceiveTransfer(ctxFor(t), api.TransferInRequest{ID: id, Token: "tok_r1",
		Part: api.PrepareRequest{LeaseID: "lease-m", DeviceName: "disk0", Length: movePart, Export: "x_new"}})
	if !errors.Is(err, ErrTransferState) {
		t.Fatalf("a receive aborted meanwhile: %v, want ErrTransferState", err)
	}
	if st, err := a.Transfer(id); err != nil || st.State != api.TransferAborted {
		t.Fatalf("the transfer is %+v (%v), want aborted", st, err)
	}
	rangeFree(t, a)
}
