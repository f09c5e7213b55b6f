package appliance

import (
	"bytes"
	"context"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

// A mailbox task's output goes to the slot's memory, not into a reply: it
// is bounded by the buffer the caller gives (within the slot's memory),
// not by the frame limit. A slot with more memory than MaxPayload runs a
// task whose output fills it.
func TestMailboxOutputAboveMaxPayload(t *testing.T) {
	const maxPayload, n = 1 << 16, 1 << 18 // output 4× the frame limit
	a := start(t, Config{Slots: 1, SlotMemory: 1 << 20, MaxPayload: maxPayload})
	ctx := context.Background()
	c := leaseSlot(t, a, 0, "echo")
	in := bytes.Repeat([]byte("rialto!"), n/7+1)[:n]
	for off := 0; off < n; off += maxPayload / 2 {
		if err := c.WriteMem(ctx, uint64(off), in[off:off+maxPayload/2]); err != nil {
			t.Fatal(err)
		}
	}
	task, err := c.Start(ctx, accel.TaskSpec{Entry: "echo", In: 0, InLen: n, Out: 1 << 19, OutCap: n})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := task.Wait(ctx); err != nil || got != n {
		t.Fatalf("echo of %d bytes through the mailbox: %d, %v", n, got, err)
	}
	for off := 0; off < n; off += maxPayload / 2 {
		got, err := c.ReadMem(ctx, uint64(1<<19+off), maxPayload/2)
		if err != nil || !bytes.Equal(got, in[off:off+maxPayload/2]) {
			t.Fatalf("output at %d: %v", off, err)
		}
	}
}
