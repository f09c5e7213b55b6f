package gateway

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
)

// Requests that each fit a slot's reply but together do not (a batch's
// outputs above the slot's frame limit, on a slot whose memory is larger)
// are run again one by one: the batch, not any request, was too large.
func TestBatchRepliesAboveFrameLimitRunOneByOne(t *testing.T) {
	ctx := context.Background()
	app := startAppliance(t, appliance.Config{Slots: 1, SlotMemory: 1 << 20, MaxPayload: 1 << 16})
	if err := app.Load(ctx, 0, roles.Spec{Name: "matmul"}); err != nil {
		t.Fatal(err)
	}
	_ = app.SetCredential(0, []byte("k"))
	addr, _ := app.Addr(0)
	c, err := accel.Dial(ctx, addr, []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// m=10, k=0, n=1024: 12 bytes in, 40 KiB of zeros out.
	item := binary.LittleEndian.AppendUint32(nil, 10)
	item = binary.LittleEndian.AppendUint32(item, 0)
	item = binary.LittleEndian.AppendUint32(item, 1024)
	g := run(t, Config{MaxBatch: 2, MaxQueueDelay: time.Hour, Clock: newFakeClock()}, c)
	type res struct {
		out []byte
		err error
	}
	call := func() chan res {
		ch := make(chan res, 1)
		go func() {
			out, err := g.Call(ctx, "mul", item)
			ch <- res{out, err}
		}()
		return ch
	}
	a := call()
	waitFor(t, func() bool { return g.received.Load() == 1 })
	b := call()
	for i, ch := range []chan res{a, b} {
		if got := <-ch; got.err != nil || len(got.out) != 40<<10 {
			t.Errorf("request %d: %d bytes, %v", i, len(got.out), got.err)
		}
	}
}
