package donor

import (
	"io"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// BenchmarkSyncRead4K is a 4 KiB READ round trip on a sync connection,
// of a region with no deadline and of one with a deadline (a lease's
// expiry, on the real clock), which every request checks: compare the
// two for its cost.
func BenchmarkSyncRead4K(b *testing.B) {
	for _, withDeadline := range []bool{false, true} {
		name := "none"
		if withDeadline {
			name = "deadline"
		}
		b.Run(name, func(b *testing.B) {
			d, addr := startDonor(b, 1<<20, 0)
			if withDeadline {
				dl := clock.NewDeadline(nil)
				dl.Set(time.Now().Add(time.Hour))
				if err := d.SetRegionDeadline(testCred, dl); err != nil {
					b.Fatal(err)
				}
			}
			ctrl, sess := dialHello(b, addr, protocol.KindControl, 0, testCred)
			defer ctrl.Close()
			c, _ := dialHello(b, addr, protocol.KindSync, sess, testCred)
			defer c.Close()
			var req [protocol.HeaderSize]byte
			resp := make([]byte, protocol.HeaderSize+4096)
			b.SetBytes(4096)
			seq := uint32(0)
			for b.Loop() {
				seq++
				(&protocol.Header{Op: protocol.OpRead, Seq: seq, Offset: 8192, Length: 4096}).Encode(req[:])
				if _, err := c.Write(req[:]); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, resp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
