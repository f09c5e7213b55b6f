package nbd

import (
	"sync"
	"testing"
	"time"
)

// gatedBackend holds every write until want writes are in progress at once
// (or a bound passes), and records the most it saw together.
type gatedBackend struct {
	mem  *MemBackend
	want int
	mu   sync.Mutex
	cond *sync.Cond
	now  int
	most int
}

func (g *gatedBackend) WriteAt(p []byte, off int64) (int, error) {
	g.mu.Lock()
	g.now++
	g.most = max(g.most, g.now)
	g.cond.Broadcast()
	deadline := time.Now().Add(time.Second)
	for g.now < g.want && time.Now().Before(deadline) {
		t := time.AfterFunc(50*time.Millisecond, func() { g.mu.Lock(); g.cond.Broadcast(); g.mu.Unlock() })
		g.cond.Wait()
		t.Stop()
	}
	g.now--
	g.mu.Unlock()
	return g.mem.WriteAt(p, off)
}

func (g *gatedBackend) ReadAt(p []byte, off int64) (int, error) { return g.mem.ReadAt(p, off) }
func (g *gatedBackend) Size() int64                             { return g.mem.Size() }
func (g *gatedBackend) Flush() error                            { return nil }

// Writes larger than the reader's buffer, pipelined, reach the backend
// together: the reader must not serve the first inline (its buffer is
// empty after a payload read past it) while the socket holds the rest.
func TestLargeWritesAtDepthReachBackendTogether(t *testing.T) {
	const n, size = 8, 256 << 10
	g := &gatedBackend{mem: NewMemBackend(n * size), want: 2}
	g.cond = sync.NewCond(&g.mu)
	_, addr := startServer(t, Export{Name: "e", Backend: g})
	c := dial(t, addr, "e")
	var wg sync.WaitGroup
	buf := make([]byte, size)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.WriteAt(buf, int64(i)*size); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.most < 2 {
		t.Fatalf("at most %d write(s) reached the backend at once, want >= 2", g.most)
	}
}
