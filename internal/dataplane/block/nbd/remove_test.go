package nbd

import (
	"sync/atomic"
	"testing"
	"time"
)

// watchBackend counts the writes that reach it once gone is set.
type watchBackend struct {
	*MemBackend
	gone atomic.Bool
	late atomic.Int64
}

func (w *watchBackend) WriteAt(p []byte, off int64) (int, error) {
	if w.gone.Load() {
		w.late.Add(1)
	}
	return w.MemBackend.WriteAt(p, off)
}

// Once RemoveExport returns, the export's backend must not see another
// byte from its connections: the agent frees the range for the next lease
// as soon as the teardown returns. Requests read before the removal, and
// waiting on the export's rate limit or queued for a worker, must not be
// executed afterwards.
func TestRemoveExportStopsQueuedRequests(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit *RateLimit
	}{
		{"rate limited", &RateLimit{BytesPerSec: 256 << 10}},
		{"unlimited", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := &watchBackend{MemBackend: NewMemBackend(8 << 20)}
			s, addr := startServer(t, Export{Name: testName, Backend: be, Limit: tc.limit})
			rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
			rc.goTransmission(testName, false, false)
			const n, size = 8, 64 << 10
			payload := make([]byte, size)
			var reqs []byte
			for i := 0; i < n; i++ {
				b := make([]byte, requestHeaderLen)
				putRequest(b, Request{Type: CmdWrite, Handle: uint64(i), Offset: uint64(i * size), Length: size})
				reqs = append(append(reqs, b...), payload...)
			}
			rc.write(reqs)
			if r, err := rc.reply(0); err != nil || r.errno != 0 {
				t.Fatalf("first write: %+v %v", r, err)
			}
			if err := s.RemoveExport(testName); err != nil {
				t.Fatal(err)
			}
			be.gone.Store(true)
			// At 256 KiB/s the queued writes would all have gone through
			// within 2 s.
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				if k := be.late.Load(); k > 0 {
					t.Fatalf("%d write(s) reached the backend after RemoveExport returned", k)
				}
				if tc.limit == nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
