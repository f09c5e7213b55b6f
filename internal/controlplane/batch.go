package controlplane

import (
	"context"
	"sync"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// beatBatcher group-commits heartbeats: the first caller to find no batch
// in flight becomes the leader and writes everything queued in one store
// transaction, repeating while more arrive; the others wait for their
// answer. With a thousand agents this turns a thousand small write
// transactions a second into a few dozen. No goroutine is started.
type beatBatcher struct {
	mu      sync.Mutex
	busy    bool
	pending []*beatReq
}

type beatReq struct {
	beat store.Beat
	prev api.NodeState
	err  error
	done chan struct{}
}

const maxBeatBatch = 256

func (b *beatBatcher) do(ctx context.Context, st store.Store, beat store.Beat) (api.NodeState, error) {
	r := &beatReq{beat: beat, done: make(chan struct{})}
	b.mu.Lock()
	b.pending = append(b.pending, r)
	if b.busy {
		b.mu.Unlock()
		select {
		case <-r.done:
			return r.prev, r.err
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	b.busy = true
	// The leader writes on behalf of everyone: its own cancellation must
	// not fail the others' heartbeats.
	wctx := context.WithoutCancel(ctx)
	for {
		batch := b.pending
		if len(batch) > maxBeatBatch {
			batch = batch[:maxBeatBatch]
		}
		b.pending = b.pending[len(batch):]
		b.mu.Unlock()
		beats := make([]store.Beat, len(batch))
		for i, q := range batch {
			beats[i] = q.beat
		}
		prev, errs, err := st.Heartbeats(wctx, beats)
		for i, q := range batch {
			if err != nil {
				q.err = err
			} else {
				q.prev, q.err = prev[i], errs[i]
			}
			close(q.done)
		}
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.busy = false
			b.mu.Unlock()
			break
		}
	}
	return r.prev, r.err
}

// leaseBatcher group-commits lease transitions the same way when the
// store can (store.LeaseBatcher): with many borrowers, their activations
// and releases share write transactions. Each caller returns only after
// the transaction holding its transition committed, so an acknowledged
// transition is as durable as one written alone.
type leaseBatcher struct {
	mu      sync.Mutex
	busy    bool
	pending []*leaseReq
}

type leaseReq struct {
	t    store.Transition
	out  api.Lease
	err  error
	done chan struct{}
}

const maxLeaseBatch = 64

func (b *leaseBatcher) do(ctx context.Context, st store.Store, t store.Transition) (api.Lease, error) {
	lb, ok := st.(store.LeaseBatcher)
	if !ok {
		return st.TransitionLease(ctx, t.ID, t.Change, t.Event)
	}
	r := &leaseReq{t: t, done: make(chan struct{})}
	b.mu.Lock()
	b.pending = append(b.pending, r)
	if b.busy {
		b.mu.Unlock()
		// No early return on cancellation: the leader writes the
		// transition regardless, and the caller must learn its outcome
		// (a terminal one frees the lease's devices in the cache).
		<-r.done
		return r.out, r.err
	}
	b.busy = true
	wctx := context.WithoutCancel(ctx)
	for {
		batch := b.pending
		if len(batch) > maxLeaseBatch {
			batch = batch[:maxLeaseBatch]
		}
		b.pending = b.pending[len(batch):]
		b.mu.Unlock()
		if len(batch) == 1 {
			q := batch[0]
			q.out, q.err = st.TransitionLease(wctx, q.t.ID, q.t.Change, q.t.Event)
			close(q.done)
		} else {
			ts := make([]store.Transition, len(batch))
			for i, q := range batch {
				ts[i] = q.t
			}
			outs, errs, err := lb.TransitionLeases(wctx, ts)
			for i, q := range batch {
				if err != nil {
					q.err = err
				} else {
					q.out, q.err = outs[i], errs[i]
				}
				close(q.done)
			}
		}
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.busy = false
			b.mu.Unlock()
			break
		}
	}
	return r.out, r.err
}
