package agent

import (
	"context"
	"sync"
)

// background runs the agent's work that outlives the call that started
// it (the wipe of a moved part's old range, which the source's commit
// does not wait for): each task on a goroutine of its own, which the
// table owns, with a context of its own that stop cancels. Run stops it
// once the agent's other goroutines have ended, and returns after the
// tasks have.
type background struct {
	mu      sync.Mutex
	closed  bool
	next    int
	cancels map[int]context.CancelFunc // the tasks under way
	idle    chan struct{}              // closed once no task is under way (nil: none ran yet)
}

// run starts task on a goroutine the table owns, with a context that stop
// cancels. It reports false, starting nothing, once the table is stopped.
func (b *background) run(task func(ctx context.Context)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	if b.cancels == nil {
		b.cancels = map[int]context.CancelFunc{}
	}
	if len(b.cancels) == 0 {
		b.idle = make(chan struct{})
	}
	ctx, cancel := context.WithCancel(context.Background())
	id := b.next
	b.next++
	b.cancels[id] = cancel
	go func() {
		defer func() {
			cancel()
			b.mu.Lock()
			delete(b.cancels, id)
			if len(b.cancels) == 0 {
				close(b.idle)
			}
			b.mu.Unlock()
		}()
		task(ctx)
	}()
	return true
}

// underWay is the number of tasks under way.
func (b *background) underWay() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.cancels)
}

// done is closed once no task is under way (at once if none is).
func (b *background) done() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.cancels) == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return b.idle
}

// stop cancels the tasks under way, refuses new ones and returns once
// every task has returned.
func (b *background) stop() {
	b.mu.Lock()
	b.closed = true
	for _, cancel := range b.cancels {
		cancel()
	}
	b.mu.Unlock()
	<-b.done()
}
