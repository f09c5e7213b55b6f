package nbd

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/accept/accepttest"
)

// TestServeOutOfDescriptors: an accept that failed for want of a
// descriptor (EMFILE) made Serve return, and the agent's block data plane
// stopped for good with every tenant's connection. The server now waits
// and accepts again; the connection that waited in the backlog gets its
// greeting once descriptors are free. Not parallel: it lowers the
// process's descriptor limit.
func TestServeOutOfDescriptors(t *testing.T) {
	log, seen := accepttest.Failures()
	s := &Server{Logger: log}
	if err := s.AddExport(Export{Name: testName, Backend: NewMemBackend(1 << 20)}); err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	restore := accepttest.ExhaustFds(t, 1) // the client's socket
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		restore()
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	select {
	case err := <-done:
		restore()
		done <- nil
		t.Fatalf("Serve returned, out of descriptors: %v", err)
	case <-seen: // the accept failed, and the server goes on
	case <-time.After(10 * time.Second):
		restore()
		t.Fatal("the server did not try to accept the connection")
	}
	restore()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	greeting := make([]byte, 16)
	if _, err := io.ReadFull(nc, greeting); err != nil || !bytes.Equal(greeting, []byte("NBDMAGICIHAVEOPT")) {
		t.Fatalf("the greeting after the shortage: %q, %v", greeting, err)
	}
}
