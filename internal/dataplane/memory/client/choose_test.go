package client

import "testing"

// The chooser sends a lone caller's small requests to the sync channel,
// remembers overlapping requests for concurrencyMemory (queue for small
// requests, bulk for larger ones), forgets them afterwards, and sends
// requests of at least BulkThreshold to the bulk channel.
func TestChoose(t *testing.T) {
	c := &Client{}
	c.opts.fill()
	big := c.opts.QueueChunk + 1
	want := func(step string, n int, ch Channel) {
		t.Helper()
		if got := c.choose(n); got != ch {
			t.Errorf("%s: %d bytes go to %v, want %v", step, n, got, ch)
		}
	}
	c.inflight.Store(1) // choose runs inside an adaptive request
	want("alone", 4096, ChannelSync)
	want("alone", big, ChannelSync)
	want("alone", c.opts.BulkThreshold, ChannelBulk)
	if c.lastOverlap.Load() != 0 {
		t.Fatalf("overlap recorded for a lone caller")
	}

	c.inflight.Store(2)
	want("overlapping", 4096, ChannelQueue)
	want("overlapping", big, ChannelBulk)
	if c.lastOverlap.Load() == 0 {
		t.Fatalf("overlap not recorded")
	}
	c.inflight.Store(1)
	want("overlap remembered", 4096, ChannelQueue)
	want("overlap remembered", big, ChannelBulk)

	c.syncBusy.Store(1) // a caller of ChannelSync holds the connection
	want("sync channel busy", 64, ChannelQueue)
	c.syncBusy.Store(0)

	// Older than concurrencyMemory: forgotten, and cleared.
	c.lastOverlap.Store(monoNow() - int64(concurrencyMemory) - 1)
	want("overlap forgotten", 4096, ChannelSync)
	if v := c.lastOverlap.Load(); v != 0 {
		t.Errorf("lastOverlap = %d once forgotten, want 0", v)
	}
	want("overlap forgotten", 4096, ChannelSync)
}

// A lone caller's choice reads no clock: it costs a few atomic loads.
func BenchmarkChooseAlone(b *testing.B) {
	c := &Client{}
	c.opts.fill()
	c.inflight.Store(1)
	for b.Loop() {
		_ = c.choose(4096)
	}
}
