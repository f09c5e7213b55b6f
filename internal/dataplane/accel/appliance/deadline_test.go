package appliance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

// TestDeadlineRefusesLateRequests: a slot's deadline (its lease's known
// expiry) refuses, with ErrLeaseExpired (wire code Unavailable) and
// without touching the slot's memory or role, every WRITE, READ, call and
// mailbox task that reaches it once the deadline has passed, on a
// connection opened before it, though the lease has not ended (the
// agent's stop at the expiry has not come); a moved deadline (a renewal)
// serves the slot again, on the same connection. A new credential clears
// the deadline.
func TestDeadlineRefusesLateRequests(t *testing.T) {
	a := start(t, Config{Slots: 1, SlotMemory: 1 << 20})
	ctx := context.Background()
	c := leaseSlot(t, a, 0, "sha256")
	t0 := time.Date(2026, 1, 1, 13, 40, 0, 0, time.UTC)
	clk := clock.NewFake(t0.Add(-time.Second))
	dl := clock.NewDeadline(clk)
	dl.Set(t0)
	if err := a.SetDeadline(0, dl); err != nil {
		t.Fatal(err)
	}
	ones, twos := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
	if err := c.WriteMem(ctx, 0, ones); err != nil {
		t.Fatalf("a write before the deadline: %v", err)
	}

	clk.Advance(time.Second) // the deadline, to the nanosecond
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, accel.ErrUnavailable) {
			t.Errorf("%s at the deadline: %v, want %v", what, err, accel.ErrLeaseExpired)
		}
	}
	refused("a write", c.WriteMem(ctx, 0, twos))
	_, err := c.ReadMem(ctx, 0, 4096)
	refused("a read", err)
	_, err = c.Call(ctx, "sum", []byte("hello"))
	refused("a call", err)
	if task, err := c.Start(ctx, accel.TaskSpec{Entry: "sum", In: 0, InLen: 4096, Out: 1 << 19, OutCap: 32}); err != nil {
		refused("a mailbox task", err)
	} else {
		_, err = task.Wait(ctx)
		refused("a mailbox task", err)
	}
	if st, _ := a.Slot(0); st.Tasks != 0 {
		t.Errorf("%d tasks ran after the deadline", st.Tasks)
	}

	// Renewed: served again, on the same connection.
	dl.Set(t0.Add(time.Minute))
	got, err := c.ReadMem(ctx, 0, 4096)
	if err != nil || !bytes.Equal(got, ones) {
		t.Fatalf("after the renewal the slot holds %x... (%v), want the write before the deadline", got[:min(len(got), 4)], err)
	}
	sum, err := c.Call(ctx, "sum", []byte("hello"))
	if want := sha256.Sum256([]byte("hello")); err != nil || !bytes.Equal(sum, want[:]) {
		t.Fatalf("a call after the renewal: %x, %v", sum, err)
	}

	// The next lease of the slot does not inherit it.
	dl.Set(t0)
	if err := a.SetCredential(0, []byte("next")); err != nil {
		t.Fatal(err)
	}
	addr, _ := a.Addr(0)
	next, err := accel.Dial(ctx, addr, []byte("next"))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if err := next.WriteMem(ctx, 0, twos); err != nil {
		t.Fatalf("the next lease's write: %v", err)
	}
}
