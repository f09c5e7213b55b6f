package gateway

import (
	"context"
	"errors"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

// A lease's part of the queue counts what its callers still wait for:
// the items of a request whose caller gave up stop counting at once, even
// while the execution they were part of still runs on a slot that has no
// cancellation point (issue 24); the lease is still charged for that
// execution, and callers that do wait are still held to the limit.
func TestAbandonedItemsLeaveTheLeaseQueue(t *testing.T) {
	const n = 16
	b := stubborn{started: make(chan struct{}, 1), release: make(chan struct{})}
	g := run(t, Config{Name: "abandon", MaxBatch: n, Workers: 1}, b)
	cs := &Credentials{Limit: n}
	if err := cs.AddWeighted([]byte("cred-a"), "a", 1); err != nil {
		t.Fatal(err)
	}
	addr := serveShared(t, g, cs)
	c := dialLease(t, addr, "cred-a")
	items := make([][]byte, n)
	for i := range items {
		items[i] = []byte{byte(i)}
	}
	released := false
	defer func() {
		if !released {
			close(b.release)
		}
	}()

	// A call that runs (the backend ignores its cancellation), abandoned.
	ctx1, cancel1 := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := c.CallBatch(ctx1, "echo", items); errc <- err }()
	<-b.started
	cancel1()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned call: %v", err)
	}
	waitFor(t, func() bool { s, _ := leaseStats(g, "a"); return s.Queued == 0 })

	// Abandon and resubmit, queued behind the running execution: each
	// resubmission is admitted at once although the abandoned calls'
	// goroutines may not have returned yet.
	for i := 0; i < 50; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		k := g.received.Load()
		go func() { _, err := c.CallBatch(ctx, "echo", items); errc <- err }()
		waitFor(t, func() bool { return g.received.Load() > k })
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	// One that waits, and one more item than the limit allows.
	waitFor(t, func() bool { s, _ := leaseStats(g, "a"); return s.Queued == 0 })
	done := make(chan error, 1)
	k := g.received.Load()
	go func() { _, err := c.CallBatch(context.Background(), "echo", items); done <- err }()
	waitFor(t, func() bool { return g.received.Load() > k })
	if _, err := c.CallBatch(context.Background(), "echo", items[:1]); !errors.Is(err, accel.ErrBusy) {
		t.Fatalf("a call over the lease's limit: %v, want Busy", err)
	}
	close(b.release)
	released = true
	<-b.started
	if err := <-done; err != nil {
		t.Fatalf("waiting call: %v", err)
	}
	s, _ := leaseStats(g, "a")
	// The abandoned execution ran on the backend: it is charged.
	if s.Service != 2*n || s.Served != n || s.Cancelled != 51 {
		t.Errorf("lease stats %+v: want service %d (the abandoned execution included), served %d, cancelled 51", s, 2*n, n)
	}
}
