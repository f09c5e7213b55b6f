package client

import (
	"context"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
)

// TestReopenRightAfterClose: Close returns once the donor has ended the
// session, so that a borrower opening the region again straight after
// (a restart, a mapping closed and the lease dialled anew) is not refused
// as a second subscriber (protocol.ErrBusy) while the donor has yet to
// read the end of the old control connection. Plaintext and TLS.
func TestReopenRightAfterClose(t *testing.T) {
	ca := memorytest.NewCA(t)
	for _, tc := range []struct {
		name string
		td   func(t *testing.T) (*memorytest.Donor, Options)
	}{
		{"plain", func(t *testing.T) (*memorytest.Donor, Options) { return memorytest.Start(t, 1<<20, 0), Options{} }},
		{"tls", func(t *testing.T) (*memorytest.Donor, Options) {
			return memorytest.StartTLS(t, memorytest.ServerTLS(t, ca), 1<<20, 0), Options{TLS: memorytest.ClientTLS(t, ca)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			td, opts := tc.td(t)
			ctx := context.Background()
			b := []byte{0}
			for i := range 100 {
				c, err := Dial(ctx, td.Addr, testCred, opts)
				if err != nil {
					t.Fatalf("open %d, right after the previous session's Close: %v", i, err)
				}
				b[0] = byte(i)
				if err := c.Write(ctx, ChannelSync, b, 0); err != nil {
					t.Fatal(err)
				}
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
