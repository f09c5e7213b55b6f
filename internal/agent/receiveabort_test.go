package agent

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
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

// sendingDriver is the block driver that runs sending (if set) as it
// starts marking a moving part's writes (SendMove, which may wait for a
// write whose payload arrives slowly): meanwhile the move is aborted.
// A non-nil error from sending fails SendMove.
type sendingDriver struct {
	*BlockDriver
	sending func(ctx context.Context) error
}

func (d sendingDriver) SendMove(ctx context.Context, e Export) (MoveSource, error) {
	if d.sending != nil {
		if err := d.sending(ctx); err != nil {
			return nil, err
		}
	}
	return d.BlockDriver.SendMove(ctx, e)
}

// TestAbortWhileSending: an abort of a move whose source is still
// starting it (the control plane's, or the lease's teardown or expiry
// in a heartbeat round) returns once the start is over: if the start
// fails, at once; if it succeeds, without a copy, the part served here as
// before and its writes not held. The abort waited for a copier that the
// failed start never ran, for good (a heartbeat round stuck there stops
// no export at its expiry again), or, after a successful start, for a
// whole copy of the part.
func TestAbortWhileSending(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start error // SendMove's outcome once the abort came
	}{
		{"start fails", errors.New("the control plane gave the call up")},
		{"start succeeds", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const id = "s1"
			var src *Agent // the hook's, once started
			aborted := make(chan error, 1)
			drv := sendingDriver{BlockDriver: NewBlockDriver(slog.New(slog.DiscardHandler)),
				sending: func(ctx context.Context) error {
					go func() {
						_, err := src.AbortTransfer(ctx, id)
						aborted <- err
					}()
					x, err := src.xfers.get(id)
					if err != nil {
						return err
					}
					if st := x.waitChange(ctx, api.TransferCopying); st.State != api.TransferAborted {
						t.Errorf("the transfer is %s, want aborted", st.State)
					}
					return tc.start
				}}
			src, dst, uri := blockMovers(t, drv)
			// The source answers before the start (which runs in the
			// transfer's goroutine).
			startBlockMove(t, src, dst, id, 0, api.TransferOutRequest{})
			if err := within(t, aborted, "the abort did not return once the start was over"); err != nil {
				t.Errorf("abort: %v", err)
			}
			if st, err := src.Transfer(id); err == nil && st.State != api.TransferAborted {
				t.Errorf("the source's transfer is %s, want aborted (or gone)", st.State)
			}
			writesServed(t, uri, "the abort") // served here as before
		})
	}
}

// flushingDriver is the block driver whose moves' destinations run
// flushed once the copy's last flush has succeeded, before the copier
// goes on: meanwhile the move is aborted.
type flushingDriver struct {
	*BlockDriver
	flushed func(ctx context.Context)
}

func (d flushingDriver) DialMove(ctx context.Context, e Export, uri string) (MoveDest, error) {
	dst, err := d.BlockDriver.DialMove(ctx, e, uri)
	if err != nil {
		return nil, err
	}
	return flushedDest{MoveDest: dst, flushed: d.flushed}, nil
}

type flushedDest struct {
	MoveDest
	flushed func(ctx context.Context)
}

func (d flushedDest) Flush(ctx context.Context) error {
	if err := d.MoveDest.Flush(ctx); err != nil {
		return err
	}
	d.flushed(ctx)
	return nil
}

// TestAbortAsTheCopyEnds: a move aborted as its copy ends stays aborted,
// and the part is served here as before. The copier then set it ready,
// and a later abort of the "ready" transfer (the agent stopping, the
// lease's teardown) closed its finish again: a panic.
func TestAbortAsTheCopyEnds(t *testing.T) {
	const id = "e1"
	var src *Agent // the hook's, once started
	aborted := make(chan api.Transfer, 1)
	drv := flushingDriver{BlockDriver: NewBlockDriver(slog.New(slog.DiscardHandler)),
		flushed: func(ctx context.Context) {
			go func() {
				st, err := src.AbortTransfer(context.WithoutCancel(ctx), id)
				if err != nil {
					t.Errorf("abort: %v", err)
				}
				aborted <- st
			}()
			x, err := src.xfers.get(id)
			if err != nil {
				t.Error(err)
				return
			}
			x.waitChange(ctx, api.TransferCopying)
		}}
	src, dst, uri := blockMovers(t, drv)
	startBlockMove(t, src, dst, id, 0, api.TransferOutRequest{})
	if st := within(t, aborted, "the abort did not return"); st.State != api.TransferAborted {
		t.Fatalf("after the abort the transfer is %s, want aborted", st.State)
	}
	if st, _ := src.Transfer(id); st.State != api.TransferAborted {
		t.Fatalf("the transfer is %s, want aborted", st.State)
	}
	writesServed(t, uri, "the abort") // served here as before
}

// TestReceiveCallerGaveUp: a TransferIn whose caller gave up (the control
// plane, past its call's bound, counts the move failed and aborts it,
// best effort: its abort may reach the agent before the TransferIn does)
// is refused if the caller is gone before the agent gets to it, and
// undone if it goes while the range is set up: nothing of it is left. It
// was received and kept until the transfer's expiry (hours), its range
// refused to every other lease meanwhile.
func TestReceiveCallerGaveUp(t *testing.T) {
	var giveUp atomic.Pointer[context.CancelFunc]
	a := startReceiving(t, func(context.Context, *Agent) {
		if c := giveUp.Load(); c != nil {
			(*c)()
		}
	})
	req := api.TransferInRequest{ID: "g1", Token: "tok_g1",
		Part: api.PrepareRequest{LeaseID: "lease-m", DeviceName: "disk0", Length: movePart, Export: "x_new"}}

	if _, err := a.ReceiveTransfer(goneCtx(t), req); !errors.Is(err, ErrGaveUp) {
		t.Fatalf("a TransferIn whose caller is gone: %v, want ErrGaveUp", err)
	}
	if _, err := a.Transfer(req.ID); !errors.Is(err, ErrNoTransfer) {
		t.Errorf("the refused transfer is known: %v", err)
	}

	_, err := givingUp(t, &giveUp, func(ctx context.Context) (api.TransferInResponse, error) { return a.ReceiveTransfer(ctx, req) })
	if !errors.Is(err, ErrGaveUp) {
		t.Fatalf("a TransferIn whose caller gave up meanwhile: %v, want ErrGaveUp", err)
	}
	if _, err := a.Transfer(req.ID); !errors.Is(err, ErrNoTransfer) {
		t.Errorf("the undone transfer is known: %v", err)
	}
	rangeFree(t, a)
}
