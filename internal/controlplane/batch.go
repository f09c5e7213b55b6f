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
