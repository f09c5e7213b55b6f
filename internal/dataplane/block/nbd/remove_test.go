package nbd

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// watchBackend reports on late the first write that reaches it once gone
// is set.
type watchBackend struct {
	*MemBackend
	gone atomic.Bool
	late chan struct{} // closed by the first late write
	once sync.Once
}

func (w *watchBackend) WriteAt(p []byte, off int64) (int, error) {
	if w.gone.Load() {
		w.once.Do(func() { close(w.late) })
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
		name   string
		limit  *RateLimit
		window time.Duration
	}{
		{"rate limited", &RateLimit{BytesPerSec: 256 << 10}, 3 * time.Second},
		{"unlimited", nil, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := &watchBackend{MemBackend: NewMemBackend(8 << 20), late: make(chan struct{})}
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
			// Queued writes that outlived the removal would reach the
			// backend within window: at 256 KiB/s all of them within 2 s,
			// unlimited at once.
			select {
			case <-be.late:
				t.Fatal("a write reached the backend after RemoveExport returned")
			case <-time.After(tc.window):
			}
		})
	}
}
