package nbd

import (
	"bytes"
	"io"
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
	nc := accepttest.DialThroughShortage(t, listen(t), seen, s.Serve)
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	greeting := make([]byte, 16)
	if _, err := io.ReadFull(nc, greeting); err != nil || !bytes.Equal(greeting, []byte("NBDMAGICIHAVEOPT")) {
		t.Fatalf("the greeting after the shortage: %q, %v", greeting, err)
	}
}
