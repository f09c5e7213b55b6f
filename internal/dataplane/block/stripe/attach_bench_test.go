package stripe

import (
	"context"
	"net"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// BenchmarkAttachWrite8KFlush measures an 8 KiB write and a FLUSH from a
// Client at queue depth 1 through an Attachment of one part (a dedicated
// lease through `rialto attach`), with -benchmem the allocations of the
// whole chain.
func BenchmarkAttachWrite8KFlush(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &nbd.Server{}
	if err := srv.AddExport(nbd.Export{Name: "part", Backend: nbd.NewMemBackend(64 << 20)}); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	uri := nbd.URI{Network: "tcp", Address: ln.Addr().String(), Export: "part"}.String()
	a, err := Attach(ctx, AttachConfig{URIs: []string{uri}})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	c, err := nbd.DialURI(ctx, a.URI())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 8192)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.WriteAt(buf, 8192); err != nil {
			b.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			b.Fatal(err)
		}
	}
}
