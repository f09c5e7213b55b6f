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

// groupCommit batches writes: the first caller to find no batch in flight
// becomes the leader and writes everything queued (up to a limit at a time)
// with one call of write, repeating while more arrive; the others wait for
// their answer. With a thousand agents this turns a thousand small write
// transactions a second into a few dozen. No goroutine is started. The
// zero value is ready to use.
type groupCommit[In, Out any] struct {
	mu      sync.Mutex
	busy    bool
	pending []*groupReq[In, Out]
	// linger, when set, is how long the leader waits for more writes to
	// join a batch of fewer than lingerBelow (set once, before use): with
	// a store over the network a transaction's round trips cost more than
	// a millisecond's wait. clock times it (set with linger).
	linger time.Duration
	clock  clock.Clock
	// rejoin (set with linger) makes the leader wait, up to linger, only
	// until as many writes are queued as the last batch held (its
	// writers, back with their next write), not the whole linger.
	rejoin bool
	last   int           // the size of the last batch written
	want   int           // ... the queue length that closes wake
	wake   chan struct{} // closed when want writes are queued (nil: none waits)
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
	if g.wake != nil && len(g.pending) >= g.want { // the lingering leader's batch is complete
		close(g.wake)
		g.wake = nil
	}
	if g.busy {
		g.mu.Unlock()
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
	g.busy = true
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
		if g.linger > 0 && g.rejoin {
			if want := min(g.last, limit); len(g.pending) < want {
				w := make(chan struct{})
				g.wake, g.want = w, want
				g.mu.Unlock()
				t := g.clock.NewTimer(g.linger)
				select {
				case <-t.C():
				case <-w:
					t.Stop()
				}
				g.mu.Lock()
				g.wake = nil
			}
		} else if g.linger > 0 && len(g.pending) < lingerBelow {
			g.mu.Unlock()
			t := g.clock.NewTimer(g.linger)
			<-t.C()
			g.mu.Lock()
		}
		batch := g.pending
		if len(batch) > limit {
			batch = batch[:limit]
		}
		g.pending = g.pending[len(batch):]
		g.last = len(batch)
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
			g.busy = false
			g.mu.Unlock()
			break
		}
	}
	return r.out, r.err
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
//
// With a store over the network (split, set before use), creations and
// transitions are group-committed apart (creates, g), each in
// transactions of their own, one of each in flight at a time: a batch of
// transitions locks nothing a creation's batch locks (a creation locks its
// devices first; a transition writes its own lease's rows only), so the
// two overlap instead of queueing behind each other; a batch of either
// takes one round trip (store/postgres, pipeline.go).
// Each lingers only until the writers of its last batch are back
// (groupCommit.rejoin), not a fixed millisecond, during which the store
// sat idle: with sixteen borrowers, gathering took 1.3 ms of each batch's
// 4 ms (docs/BENCHMARKS.md, control-plane follow-ups).
type leaseBatcher struct {
	g       groupCommit[store.LeaseOp, api.Lease] // every op; transitions alone when split
	creates groupCommit[store.LeaseOp, api.Lease] // creations, when split
	split   bool
	size    prometheus.Observer // lease writes per transaction
}

const maxLeaseBatch = 128

func (b *leaseBatcher) do(ctx context.Context, st store.Store, op store.LeaseOp) (api.Lease, error) {
	lb, ok := st.(store.LeaseBatcher)
	if !ok {
		if c := op.Create; c != nil {
			return st.CreateLease(ctx, c.Lease, c.Demand, c.Idem, c.Event)
		}
		t := op.Transition
		return st.TransitionLease(ctx, t.ID, t.Change, t.Event)
	}
	g := &b.g
	if b.split && op.Create != nil {
		g = &b.creates
	}
	return g.do(ctx, op, maxLeaseBatch, false, func(ctx context.Context, ops []store.LeaseOp) ([]api.Lease, []error, error) {
		if b.size != nil {
			b.size.Observe(float64(len(ops)))
		}
		return lb.LeaseOps(ctx, ops)
	})
}
