package donor

import (
	"context"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// TestRetireDoesNotWaitForAWithheldPayload: a borrower whose WRITE is
// held by a move's pause sends its header and never its payload. The
// retirement refuses it, and its GONE answer waits for the payload; the
// retirement waits for that answer only for a while (RefusalWait), then
// ends the session as it does once the answers are sent. It waited for
// it until its context ended — the agent's heartbeat round, which
// commits a sealed move of a lease torn down, has none: the agent
// stopped heartbeating for good.
func TestRetireDoesNotWaitForAWithheldPayload(t *testing.T) {
	for _, k := range dataKinds {
		kind := k.kind
		t.Run(k.name, func(t *testing.T) {
			d, addr := startDonor(t, 1<<20, 0)
			d.RefusalWait = 50 * time.Millisecond
			ctx := context.Background()
			ctrl, sess := dialHello(t, addr, protocol.KindControl, 0, testCred)
			defer ctrl.Close()
			c, _ := dialHello(t, addr, kind, sess, testCred)
			defer c.Close()
			if err := d.PauseWrites(ctx, testCred); err != nil {
				t.Fatal(err)
			}
			var hdr [protocol.HeaderSize]byte
			(&protocol.Header{Op: protocol.OpWrite, Seq: 1, Length: 4096, Payload: 4096}).Encode(hdr[:])
			if _, err := c.Write(hdr[:]); err != nil { // and never the payload
				t.Fatal(err)
			}
			for d.Waiting(testCred) != 1 {
				select {
				case <-time.After(time.Millisecond):
				case <-t.Context().Done():
					t.Fatal("the write was not held")
				}
			}
			// Long enough to tell the bound from the context's end.
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if err := d.RetireRegion(rctx, testCred); err != nil {
				t.Fatalf("RetireRegion waited for the withheld payload until its context ended: %v", err)
			}
			// The session is over: its connection was closed.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(hdr[:]); err == nil {
				t.Error("the connection of the refused write still answers")
			}
		})
	}
}
