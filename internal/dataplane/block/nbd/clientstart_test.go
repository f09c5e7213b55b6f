package nbd

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// meetingFlush holds every FLUSH until n have arrived, over all the
// backends sharing it, and fails one that waits longer than a deadline.
type meetingFlush struct {
	*MemBackend
	m       *meeting
	flushes atomic.Int64
}

type meeting struct {
	mu  sync.Mutex
	n   int
	all chan struct{}
}

func (b *meetingFlush) Flush() error {
	b.flushes.Add(1)
	b.m.mu.Lock()
	if b.m.n--; b.m.n == 0 {
		close(b.m.all)
	}
	all := b.m.all
	b.m.mu.Unlock()
	select {
	case <-all:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("test: the other FLUSH never came")
	}
}

// TestStartFlush: StartFlush sends the FLUSH and returns before its reply,
// so one goroutine can have flushes to several servers in flight at once
// (here each server answers only once both have arrived) and then await
// them in turn; beside other calls on the same connection too; on a
// closed client Wait reports ErrClosed.
func TestStartFlush(t *testing.T) {
	m := &meeting{n: 2, all: make(chan struct{})}
	var cs []*Client
	var bes []*meetingFlush
	for range 2 {
		be := &meetingFlush{MemBackend: NewMemBackend(1 << 20), m: m}
		_, addr := startServer(t, Export{Name: testName, Backend: be})
		bes = append(bes, be)
		cs = append(cs, dial(t, addr, testName))
	}
	s0 := cs[0].StartFlush()
	s1 := cs[1].StartFlush()
	if err := s0.Wait(); err != nil {
		t.Fatalf("first flush: %v", err)
	}
	if err := s1.Wait(); err != nil {
		t.Fatalf("second flush: %v", err)
	}

	// Reads and writes on the same connection while flushes are started
	// and awaited: every call gets its own reply.
	m.mu.Lock()
	m.n, m.all = 0, make(chan struct{})
	close(m.all)
	m.mu.Unlock()
	want := []byte("pipelined")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			buf := make([]byte, len(want))
			for i := range 50 {
				off := int64(g*4096 + i%8*512)
				if _, err := cs[0].WriteAt(want, off); err != nil {
					t.Errorf("write: %v", err)
					return
				}
				s := cs[0].StartFlush()
				if _, err := cs[0].ReadAt(buf, off); err != nil || string(buf) != string(want) {
					t.Errorf("read: %q, %v", buf, err)
					return
				}
				if err := s.Wait(); err != nil {
					t.Errorf("flush: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := bes[0].flushes.Load(); got != 1+4*50 {
		t.Errorf("server served %d FLUSHes, want %d", got, 1+4*50)
	}

	// A closed client: StartFlush's Wait reports it.
	cs[1].Close()
	if err := cs[1].StartFlush().Wait(); !errors.Is(err, ErrClosed) {
		t.Errorf("flush on a closed client: %v, want ErrClosed", err)
	}
}
