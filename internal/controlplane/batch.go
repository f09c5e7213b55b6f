package controlplane

import (
	"context"
	"github.com/rialto-project/rialto/internal/clock"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// groupCommit batches writes: a caller that finds fewer than writers
// batches in flight becomes a leader and writes everything queued (up to a
// limit at a time) with one call of write, repeating while more arrive;
// the others wait for their answer. With a thousand agents this turns a
// thousand small write transactions a second into a few dozen. No
// goroutine is started. The zero value is ready to use, with one batch in
// flight at a time.
//
// With writers > 1, batches are written concurrently (each by its own
// leader, in its own transaction): while one batch's transaction waits for
// the database (round trips, the commit's flush), the next is already
// being prepared and sent, so that this process and the database work at
// the same time instead of in turn. write must then be safe for
// concurrent use, and batches written together must not depend on one
// another: a caller's op is in exactly one batch and the caller waits for
// it, so the ops of one caller are never reordered, but the ops of two
// callers in two concurrent batches commit in either order (as two
// callers' calls would without batching).
type groupCommit[In, Out any] struct {
	mu      sync.Mutex
	running int // leaders writing
	pending []*groupReq[In, Out]
	// writers is how many batches may be in flight at once (set once,
	// before use); 0 means 1.
	writers int
	// linger, when set, is how long the leader waits for more writes to
	// join a batch of fewer than lingerBelow (set once, before use): with
	// a store over the network a transaction's round trips cost more than
	// a millisecond's wait. clock times it (set with linger).
	linger time.Duration
	clock  clock.Clock
}

// lingerBelow is the batch size under which a leader lingers.
const lingerBelow = 8

type groupReq[In, Out any] struct {
	in   In
	out  Out
	err  error
	done chan struct{}
}

// do queues in and returns its outcome. write gets batches of at most limit
// items and returns one result and error per item, or an error for the
// whole batch. abandon lets a waiting caller return when its ctx ends;
// otherwise it waits for the outcome, which the leader writes regardless.
func (g *groupCommit[In, Out]) do(ctx context.Context, in In, limit int, abandon bool, write func(context.Context, []In) ([]Out, []error, error)) (Out, error) {
	r := &groupReq[In, Out]{in: in, done: make(chan struct{})}
	g.mu.Lock()
	g.pending = append(g.pending, r)
	// A further leader starts only for a full batch: a small one would
	// cost a transaction for little.
	if g.running >= max(g.writers, 1) || g.running > 0 && len(g.pending) < lingerBelow {
		g.mu.Unlock()
		return r.wait(ctx, abandon)
	}
	g.running++
	// The leader writes on behalf of everyone: its own cancellation must
	// not fail the others' writes.
	wctx := context.WithoutCancel(ctx)
	for {
		// Let the goroutines that are ready to run join the batch first:
		// a transaction's fixed cost (begin, commit, WAL frames) is most
		// of a small one's.
		g.mu.Unlock()
		runtime.Gosched()
		g.mu.Lock()
		if g.linger > 0 && len(g.pending) < lingerBelow {
			g.mu.Unlock()
			t := g.clock.NewTimer(g.linger)
			<-t.C()
			g.mu.Lock()
		}
		if len(g.pending) == 0 {
			// Another leader took everything (its own request too).
			g.running--
			g.mu.Unlock()
			break
		}
		batch := g.pending
		if len(batch) > limit {
			batch = batch[:limit]
		}
		g.pending = g.pending[len(batch):]
		g.mu.Unlock()
		ins := make([]In, len(batch))
		for i, q := range batch {
			ins[i] = q.in
		}
		outs, errs, err := write(wctx, ins)
		for i, q := range batch {
			if err != nil {
				q.err = err
			} else {
				q.out, q.err = outs[i], errs[i]
			}
			close(q.done)
		}
		g.mu.Lock()
		if len(g.pending) == 0 {
			g.running--
			g.mu.Unlock()
			break
		}
	}
	// With several leaders, another one may still be writing this
	// caller's request.
	return r.wait(ctx, abandon)
}

// wait returns r's outcome once written, or ctx's error when ctx ends
// first and abandon is set.
func (r *groupReq[In, Out]) wait(ctx context.Context, abandon bool) (Out, error) {
	if !abandon {
		<-r.done
		return r.out, r.err
	}
	select {
	case <-r.done:
		return r.out, r.err
	case <-ctx.Done():
		var zero Out
		return zero, ctx.Err()
	}
}

// beatBatcher group-commits heartbeats. A heartbeat whose caller gave up
// need not be waited for.
type beatBatcher struct {
	g    groupCommit[store.Beat, api.NodeState]
	size prometheus.Observer // heartbeats per write
}

const maxBeatBatch = 256

func (b *beatBatcher) do(ctx context.Context, st store.Store, beat store.Beat) (api.NodeState, error) {
	return b.g.do(ctx, beat, maxBeatBatch, true, func(ctx context.Context, beats []store.Beat) ([]api.NodeState, []error, error) {
		if b.size != nil {
			b.size.Observe(float64(len(beats)))
		}
		return st.Heartbeats(ctx, beats)
	})
}

// leaseBatcher group-commits lease creations and transitions when the
// store can (store.LeaseBatcher): with many borrowers, their reservations,
// activations and releases share write transactions. Each caller returns
// only after the transaction holding its write committed, so an
// acknowledged write is as durable as one written alone; no caller leaves
// early, since the outcome must be learnt (a refused reservation must be
// forgotten by the placement cache, a terminal transition frees the
// lease's devices in it).
type leaseBatcher struct {
	g    groupCommit[store.LeaseOp, api.Lease]
	size prometheus.Observer // lease writes per transaction
}

const maxLeaseBatch = 128

// sharedLeaseWriters is how many lease batches are in flight at once on a
// store over the network (PostgreSQL): one transaction's round trips and
// commit overlap the next one's preparation. Two concurrent batches
// serialize only where they lock the same rows (the devices of their
// creations, doc.go of store/postgres); a store with one writer (SQLite)
// keeps one.
const sharedLeaseWriters = 2

func (b *leaseBatcher) do(ctx context.Context, st store.Store, op store.LeaseOp) (api.Lease, error) {
	lb, ok := st.(store.LeaseBatcher)
	if !ok {
		if c := op.Create; c != nil {
			return st.CreateLease(ctx, c.Lease, c.Demand, c.Idem, c.Event)
		}
		t := op.Transition
		return st.TransitionLease(ctx, t.ID, t.Change, t.Event)
	}
	return b.g.do(ctx, op, maxLeaseBatch, false, func(ctx context.Context, ops []store.LeaseOp) ([]api.Lease, []error, error) {
		if b.size != nil {
			b.size.Observe(float64(len(ops)))
		}
		return lb.LeaseOps(ctx, ops)
	})
}
