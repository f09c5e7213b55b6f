package borrower

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// leaseBook is a LeaseSource whose lease record the test changes.
type leaseBook struct {
	mu sync.Mutex
	l  api.Lease
}

func (b *leaseBook) Lease(context.Context, string) (api.Lease, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.l, nil
}

func (b *leaseBook) set(uri string) {
	b.mu.Lock()
	b.l.URI, b.l.Parts[0].URI = uri, uri
	b.mu.Unlock()
}

// TestAttachMemoryFollowsMove: a memory lease attached as an NBD export
// follows the lease when it moves (the old donor retires the region, the
// control plane has the new URI): requests go on without an error, and
// read what was written before the move.
func TestAttachMemoryFollowsMove(t *testing.T) {
	const size = 4 << 20
	ctx := ctxT(t)
	from := memorytest.Start(t, size, 0)
	to := memorytest.Start(t, 4096, 0) // its own region is not used
	uri := protocol.URI{Address: from.Addr, Credential: memorytest.Credential}.String()
	book := &leaseBook{l: api.Lease{ID: "lease-mem", Kind: api.KindMemory, State: api.LeaseActive, URI: uri, Parts: []api.Part{{URI: uri}}}}
	att, err := Attach(ctx, book, book.l, AttachConfig{RequestTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	vol, err := nbd.DialURI(ctx, att.URI())
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	want := randomBytes(size, 5)
	if _, err := vol.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}

	// The move: the region copied to the other donor, the lease's URI
	// changed, the old region retired.
	if err := to.D.AddRegion("moved-cred", size); err != nil {
		t.Fatal(err)
	}
	mc, err := client.Dial(ctx, to.Addr, "moved-cred", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if _, err := from.D.ReadRegion(memorytest.Credential, got, 0); err != nil {
		t.Fatal(err)
	}
	if err := mc.Write(ctx, client.ChannelBulk, got, 0); err != nil {
		t.Fatal(err)
	}
	mc.Close()
	book.set(protocol.URI{Address: to.Addr, Credential: "moved-cred"}.String())
	if err := from.D.RetireRegion(ctx, memorytest.Credential); err != nil {
		t.Fatal(err)
	}

	clear(got)
	if _, err := vol.ReadAt(got, 0); err != nil {
		t.Fatalf("read after the move: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the moved lease reads other bytes")
	}
	if _, err := vol.WriteAt(want[:4096], 8192); err != nil {
		t.Fatalf("write after the move: %v", err)
	}
	if err := vol.Flush(); err != nil {
		t.Fatalf("flush after the move: %v", err)
	}
}
