package client

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
)

// TestQueueRequestAfterSyncWakeUp: a queue request right after a sync
// request that woke the donor's parked sync connection is answered at
// once. The donor's thread that woke that connection was the one waiting
// on its netpoller, and it went on to wait in poll(2) for the
// connection's next request (Donor.IdleWait), keeping its P: no thread
// waited on the netpoller, and the queue request waited until the Go
// runtime's monitor polled it itself, some 10 ms later (rawconn's
// kickNetpoller). So did every round of the adaptive chooser on 8
// threads, whose first request takes the sync channel.
func TestQueueRequestAfterSyncWakeUp(t *testing.T) {
	cmd, addr := memorytest.StartChild(t, 1<<20)
	c := dial(t, addr, Options{})
	ctx := context.Background()
	buf := make([]byte, 64)
	var lat []time.Duration
	for range 7 {
		memorytest.AwaitChildParked(t, cmd.Process.Pid, c.sync.pg.Load().Fd())
		if err := c.Read(ctx, ChannelSync, buf, 0); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := c.Read(ctx, ChannelQueue, buf, 0); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	if med := lat[len(lat)/2]; med > 5*time.Millisecond {
		t.Fatalf("a queue request right after a sync request that woke the parked sync connection took %v (median; all: %v), want far less than the 10 ms the Go runtime takes to poll its netpoller by itself", med, lat)
	}
}
