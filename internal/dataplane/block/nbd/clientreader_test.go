package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"
)

// TestClientReaderHandoff: callers that read their own replies (no
// cancellable context) and callers that leave the reading to the
// background goroutine (a context that can end), many at once on one
// connection, each get their own bytes, and the connection is idle (nobody
// reading) once they are done, ready for the next caller.
func TestClientReaderHandoff(t *testing.T) {
	const size = 1 << 20
	be := NewMemBackend(size)
	want := make([]byte, size)
	for i := 0; i < size; i += 8 {
		binary.BigEndian.PutUint64(want[i:], uint64(i))
	}
	if _, err := be.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	_, addr := startServer(t, Export{Name: testName, Backend: be})
	c := dial(t, addr, testName)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			buf := make([]byte, 4096)
			for i := range 200 {
				off := int64((g*200+i)*4096) % size
				var err error
				if g%2 == 0 {
					_, err = c.ReadAt(buf, off) // reads for itself when nobody else does
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err = c.ReadAtContext(ctx, buf, off) // leaves reading to others
					cancel()
				}
				if err != nil {
					t.Errorf("goroutine %d read %d: %v", g, i, err)
					return
				}
				if !bytes.Equal(buf, want[off:off+4096]) {
					t.Errorf("goroutine %d read %d at %d: wrong bytes", g, i, off)
					return
				}
			}
		})
	}
	wg.Wait()
	// The background reader lets go just after it completes the last call.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		reading, pending := c.reading, len(c.pending)
		c.mu.Unlock()
		if !reading && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the callers: reading %v, %d pending; want idle", reading, pending)
		}
		time.Sleep(time.Millisecond)
	}
	// Idle, a lone caller becomes the reader and is answered.
	buf := make([]byte, 4096)
	if _, err := c.ReadAt(buf, 8192); err != nil || !bytes.Equal(buf, want[8192:8192+4096]) {
		t.Fatalf("read on the idle connection: %v", err)
	}
	// A caller that gives up leaves the connection usable.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.ReadAtContext(ctx, buf, 0); err == nil {
		t.Log("cancelled read completed before it noticed (allowed)")
	}
	if _, err := c.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, want[:4096]) {
		t.Fatalf("read after a cancelled one: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadAt(buf, 0); err == nil {
		t.Fatal("read on a closed client succeeded")
	}
}
