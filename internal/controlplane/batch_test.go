package controlplane

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
)

// TestGroupCommitRejoin: a leader that lingers for the writers of its last
// batch writes as soon as they are all queued, without waiting for its
// linger (the fake clock never moves), in one batch.
func TestGroupCommitRejoin(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	g := &groupCommit[int, int]{linger: time.Hour, clock: clk, rejoin: true, last: 3}
	var mu sync.Mutex
	var batches [][]int
	write := func(_ context.Context, in []int) ([]int, []error, error) {
		mu.Lock()
		batches = append(batches, append([]int(nil), in...))
		mu.Unlock()
		out := make([]int, len(in))
		for i, v := range in {
			out[i] = v * 10
		}
		return out, make([]error, len(in)), nil
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	got := make([]int, 3)
	call := func(i int) {
		defer wg.Done()
		v, err := g.do(ctx, i, 128, false, write)
		if err != nil {
			t.Errorf("write %d: %v", i, err)
		}
		got[i] = v
	}
	wg.Add(1)
	go call(0)
	// The leader lingers (its timer is set): it waits for two more.
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := clk.BlockUntil(bctx, 1); err != nil {
		t.Fatalf("the leader did not linger for the last batch's writers: %v", err)
	}
	wg.Add(2)
	go call(1)
	go call(2)
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the leader still lingers with every writer of its last batch queued")
	}
	if len(batches) != 1 || len(batches[0]) != 3 {
		t.Fatalf("batches %v, want one of 3", batches)
	}
	for i, v := range got {
		if v != i*10 {
			t.Errorf("write %d answered %d, want %d", i, v, i*10)
		}
	}
}
