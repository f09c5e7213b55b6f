package gateway

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

// TestDeadlineRefusesLateRequests: a shared lease's deadline (its known
// expiry) refuses, with accel.ErrLeaseExpired (wire code Unavailable) and
// without reaching a slot, every call of the lease that arrives once it
// has passed, on a connection opened before it, though the credential
// has not been revoked (the agent's stop at the expiry has not come); a
// call queued before it and taken up by a worker after it is refused
// too; the other leases are served on; a moved deadline (a renewal)
// serves the lease again.
func TestDeadlineRefusesLateRequests(t *testing.T) {
	rec := &gatedRecorder{open: make(chan struct{}), started: make(chan struct{})}
	g := run(t, Config{Name: "deadline", MaxBatch: 4, Workers: 1, QueueLimit: 64}, rec)
	var cs Credentials
	for _, c := range []string{"alice", "bob"} {
		if err := cs.AddWeighted([]byte("cred-"+c), c, 1); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Date(2026, 1, 1, 13, 40, 0, 0, time.UTC)
	clk := clock.NewFake(t0.Add(-time.Second))
	dl := clock.NewDeadline(clk)
	dl.Set(t0)
	if err := cs.SetDeadline([]byte("cred-alice"), dl); err != nil {
		t.Fatal(err)
	}
	addr := serveShared(t, g, &cs)
	ctx := context.Background()
	alice, bob := dialLease(t, addr, "cred-alice"), dialLease(t, addr, "cred-bob")

	// bob's call holds the only worker; alice's is queued behind it
	// before her deadline, and taken up after it.
	plug := make(chan error, 1)
	go func() { _, err := bob.Call(ctx, "e", []byte("plug")); plug <- err }()
	<-rec.started
	queued := make(chan error, 1)
	go func() { _, err := alice.Call(ctx, "e", []byte("queued")); queued <- err }()
	waitFor(t, func() bool { s, _ := leaseStats(g, "alice"); return s.Queued == 1 })
	clk.Advance(time.Second) // the deadline, to the nanosecond
	close(rec.open)
	if err := <-plug; err != nil {
		t.Fatal(err)
	}
	if err := <-queued; !errors.Is(err, accel.ErrUnavailable) {
		t.Errorf("a call queued before the deadline, taken up after it: %v, want %v", err, accel.ErrLeaseExpired)
	}
	if _, err := alice.Call(ctx, "e", []byte("late")); !errors.Is(err, accel.ErrUnavailable) {
		t.Errorf("a call at the deadline: %v, want %v", err, accel.ErrLeaseExpired)
	}
	if out, err := bob.Call(ctx, "e", []byte("other")); err != nil || string(out) != "other" {
		t.Fatalf("the other lease: %q %v", out, err)
	}

	// Renewed: served again, on the same connection.
	dl.Set(t0.Add(time.Minute))
	if out, err := alice.Call(ctx, "e", []byte("renewed")); err != nil || string(out) != "renewed" {
		t.Fatalf("a call after the renewal: %q %v", out, err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, b := range rec.batches {
		if slices.Contains(b, "queued") || slices.Contains(b, "late") {
			t.Errorf("a refused call reached the slot: batch %v", b)
		}
	}
}
