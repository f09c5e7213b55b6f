package donor

import (
	"bytes"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// TestDeadlineRefusesLateRequests: a region's deadline (its lease's known
// expiry) refuses, StatusGone and without touching the region, every READ
// and WRITE that arrives once it has passed, on a connection opened
// before it, though nobody has suspended or removed the region (the
// agent's stop at the expiry has not come); the WRITE's payload is taken
// in and the connection serves on: a moved deadline (a renewal) serves
// the region again. Both request loops: a sync connection's (raw
// syscalls) and a queue's.
func TestDeadlineRefusesLateRequests(t *testing.T) {
	const size = 1 << 20
	for _, k := range dataKinds {
		t.Run(k.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 1, 13, 40, 0, 0, time.UTC)
			clk := clock.NewFake(t0.Add(-time.Second))
			dl := clock.NewDeadline(clk)
			dl.Set(t0)
			d, addr := startDonor(t, size, 0)
			if err := d.SetRegionDeadline(testCred, dl); err != nil {
				t.Fatal(err)
			}
			ctrl, sess := dialHello(t, addr, protocol.KindControl, 0, testCred)
			defer ctrl.Close()
			c, _ := dialHello(t, addr, k.kind, sess, testCred)
			defer c.Close()
			ones, twos := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
			seq := uint32(0)
			do := func(op uint8, payload []byte) (uint16, []byte) {
				t.Helper()
				seq++
				return request(t, c, protocol.Header{Op: op, Seq: seq, Offset: 8192, Length: 4096}, payload)
			}
			if st, _ := do(protocol.OpWrite, ones); st != protocol.StatusOK {
				t.Fatalf("a write before the deadline: status %d", st)
			}

			clk.Advance(time.Second) // the deadline, to the nanosecond
			if st, _ := do(protocol.OpWrite, twos); st != protocol.StatusGone {
				t.Errorf("a write at the deadline: status %d, want GONE", st)
			}
			if st, data := do(protocol.OpRead, nil); st != protocol.StatusGone || bytes.Equal(data, ones) {
				t.Errorf("a read at the deadline: status %d, want GONE", st)
			}
			got := make([]byte, 4096)
			if _, err := d.ReadRegion(testCred, got, 8192); err != nil || !bytes.Equal(got, ones) {
				t.Fatalf("after the deadline the region holds %x... (%v), want the write before it", got[:4], err)
			}

			// Renewed: served again, on the same connection.
			dl.Set(t0.Add(time.Minute))
			if st, data := do(protocol.OpRead, nil); st != protocol.StatusOK || !bytes.Equal(data, ones) {
				t.Fatalf("a read after the renewal: status %d", st)
			}
			if st, _ := do(protocol.OpWrite, twos); st != protocol.StatusOK {
				t.Fatalf("a write after the renewal: status %d", st)
			}
		})
	}
}
