package agent

import (
	"bytes"
	"errors"
	"sync"
	"testing"

	"github.com/rialto-project/rialto/api"
	memclient "github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// TestMoveMemoryUnderWrites moves a memory part page by page while a
// borrower writes it: the copy skips the pages of zeroes, the last pass
// runs with the writes held, the commit ends the borrower's session at
// the source (its held write is refused: the region moved) and the
// region at the destination, under the lease's credential, holds every
// write the borrower saw complete.
func TestMoveMemoryUnderWrites(t *testing.T) {
	const size = 4 << 20
	_, srv := newFakeCP(t)
	cfg := func(name string) Config {
		return Config{ControlPlane: srv.URL, BootstrapToken: "boot", Name: name, StateDir: t.TempDir(),
			Devices: []DeviceConfig{{Name: "mem0", Kind: api.KindMemory, Size: 8 << 20}}}
	}
	src := start(t, cfg("src")).a
	dst := start(t, cfg("dst")).a
	ctx := ctxFor(t)
	resp, err := src.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindMemory, DeviceName: "mem0",
		Length: size, Export: "x_lease-m"})
	if err != nil {
		t.Fatal(err)
	}
	addr, cred := memoryTarget(t, resp.URI)
	mc, err := memclient.Dial(ctx, addr, cred, memclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	// The first quarter holds data, the rest zeroes; the borrower writes
	// the first half.
	const pages = size / 4096
	for p := int64(0); p < pages/4; p++ {
		if err := mc.Write(ctx, memclient.ChannelBulk, stamp(p, 0), p*4096); err != nil {
			t.Fatal(err)
		}
	}
	model := map[int64]uint64{}
	for p := int64(0); p < pages/4; p++ {
		model[p] = 0
	}
	var mu sync.Mutex
	var werr error
	writes := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for gen := uint64(1); ; gen++ {
			select {
			case <-stop:
				return
			default:
			}
			p := int64(gen*7919) % (pages / 2) // the second half stays zero
			if err := mc.Write(ctx, memclient.ChannelSync, stamp(p, gen), p*4096); err != nil {
				mu.Lock()
				werr = err
				mu.Unlock()
				return
			}
			mu.Lock()
			model[p] = gen
			writes++
			mu.Unlock()
		}
	})

	in, err := dst.ReceiveTransfer(ctx, api.TransferInRequest{ID: "m1", Token: "tok_m1",
		Part: api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindMemory, DeviceName: "mem0", Length: size, Export: "x_lease-m"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.SendTransfer(ctx, api.TransferOutRequest{ID: "m1", LeaseID: "lease-m", Export: "x_lease-m", DestURI: in.URI,
		ConvergeBytes: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	waitTransfer(t, src, "m1", api.TransferReady)
	if _, err := src.SealTransfer(ctx, "m1"); err != nil {
		t.Fatal(err)
	}
	cr, err := dst.CommitTransfer(ctx, "m1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.CommitTransfer(ctx, "m1"); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	if werr != nil && !errors.Is(werr, protocol.ErrGone) && !errors.Is(werr, protocol.ErrDonorLost) {
		t.Errorf("the borrower's write at the switch: %v", werr)
	}
	t.Logf("%d writes, the last one: %v", writes, werr)
	st, _ := src.Transfer("m1")
	if st.State != api.TransferCommitted || st.Skipped < size/2 || st.Copied < size/4 {
		t.Errorf("source's transfer: %+v", st)
	}

	naddr, ncred := memoryTarget(t, cr.URI)
	if ncred != cred || naddr == addr {
		t.Errorf("the moved part is served at %s with another credential (or at the same address)", naddr)
	}
	nc, err := memclient.Dial(ctx, naddr, ncred, memclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := make([]byte, size)
	if err := nc.Read(ctx, memclient.ChannelBulk, got, 0); err != nil {
		t.Fatal(err)
	}
	for p := int64(0); p < pages; p++ {
		want := make([]byte, 4096)
		if gen, ok := model[p]; ok {
			want = stamp(p, gen)
		}
		if !bytes.Equal(got[p*4096:(p+1)*4096], want) {
			t.Fatalf("page %d differs at the destination (want gen %d)", p, model[p])
		}
	}
	if got := src.Leases(); len(got) != 0 {
		t.Errorf("the source keeps %v", got)
	}
	if n := src.drivers[api.KindMemory].(*MemoryDriver).donor.Regions(); n != 0 {
		t.Errorf("the source keeps %d regions", n)
	}
}
