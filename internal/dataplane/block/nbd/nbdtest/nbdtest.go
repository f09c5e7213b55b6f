package nbdtest

import (
	"context"
	"net"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// Serve runs srv on ln until the test ends; a Serve error is reported
// then.
func Serve(t testing.TB, srv *nbd.Server, ln net.Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("nbd serve: %v", err)
		}
	})
}

// Listen returns a listener on a free loopback TCP port.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// Lender serves be as export name on a loopback port until the test ends
// and returns its nbd:// URI.
func Lender(t testing.TB, name string, be nbd.Backend) string {
	t.Helper()
	srv := &nbd.Server{}
	if err := srv.AddExport(nbd.Export{Name: name, Backend: be}); err != nil {
		t.Fatal(err)
	}
	ln := Listen(t)
	Serve(t, srv, ln)
	return nbd.URI{Network: "tcp", Address: ln.Addr().String(), Export: name}.String()
}
