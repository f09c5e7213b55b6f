package agent

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

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
	src, dst := memoryLenders(t, "src", "dst")
	ctx := ctxFor(t)
	mc, addr, cred := dialMemory(t, src, api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindMemory, DeviceName: "mem0",
		Length: size, Export: "x_lease-m"})
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
	// The writer's next write is held (the last pass paused the writes):
	// the commit refuses it GONE. (A write the borrower sent only after
	// the session ended would find its connection closed: ErrDonorLost.)
	srcDonor := src.drivers[api.KindMemory].(*MemoryDriver).donor
	for deadline := time.Now().Add(30 * time.Second); srcDonor.Waiting(cred) != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the borrower's write is not held (%d held)", srcDonor.Waiting(cred))
		}
	}
	cr, err := dst.CommitTransfer(ctx, "m1", api.TransferCommitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.CommitTransfer(ctx, "m1", api.TransferCommitRequest{}); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	if !errors.Is(werr, protocol.ErrGone) {
		t.Errorf("the borrower's write held at the switch: %v, want ErrGone", werr)
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
	if n := srcDonor.Regions(); n != 0 {
		t.Errorf("the source keeps %d regions", n)
	}
}

// TestMoveMemoryKeepsGeneration: a memory part moved between two agents
// keeps its region's generation: a following session sees at the
// destination the generation it saw at the source, and when the part
// moves back and forth under the same export name while the session is
// idle, the session opens again where it was and reads its bytes, where
// a region with another generation at the same place and credential is
// refused as recreated (protocol.ErrRecreated).
func TestMoveMemoryKeepsGeneration(t *testing.T) {
	const size = 1 << 20
	a, b := memoryLenders(t, "a", "b")
	ctx := ctxFor(t)
	part := api.PrepareRequest{LeaseID: "lease-g", Kind: api.KindMemory, DeviceName: "mem0", Length: size, Export: "x_lease-g"}
	resp, err := a.Prepare(ctx, part)
	if err != nil {
		t.Fatal(err)
	}
	// The lease's record of where the part is, as the control plane
	// keeps it.
	var mu sync.Mutex
	uri := resp.URI
	relocate := func(context.Context) (string, string, error) {
		mu.Lock()
		defer mu.Unlock()
		u, err := protocol.ParseURI(uri)
		return u.Address, u.Credential, err
	}
	addr, cred := memoryTarget(t, uri)
	f, err := memclient.DialFollowing(ctx, addr, cred, memclient.Options{Timeout: 5 * time.Second}, memclient.FollowConfig{Relocate: relocate})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first := f.Client().Generation()
	want := bytes.Repeat([]byte("moved between agents "), 1000)
	if err := f.Write(ctx, memclient.ChannelSync, want, 0); err != nil {
		t.Fatal(err)
	}
	move := func(id string, from, to *Agent) {
		t.Helper()
		in, err := to.ReceiveTransfer(ctx, api.TransferInRequest{ID: id, Token: "tok_" + id, Part: part})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := from.SendTransfer(ctx, api.TransferOutRequest{ID: id, LeaseID: part.LeaseID, Export: part.Export, DestURI: in.URI}); err != nil {
			t.Fatal(err)
		}
		waitTransfer(t, from, id, api.TransferReady)
		if _, err := from.SealTransfer(ctx, id); err != nil {
			t.Fatal(err)
		}
		cr, err := to.CommitTransfer(ctx, id, api.TransferCommitRequest{})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		uri = cr.URI
		mu.Unlock()
		if _, err := from.CommitTransfer(ctx, id, api.TransferCommitRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		t.Helper()
		got := make([]byte, len(want))
		if err := f.Read(ctx, memclient.ChannelSync, got, 0); err != nil {
			t.Fatalf("read %s: %v", when, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read %s: other bytes", when)
		}
		if g := f.Client().Generation(); g != first {
			t.Fatalf("%s the session sees generation %#x, it saw %#x at first", when, g, first)
		}
	}
	move("g1", a, b)
	check("after the move to b")
	if f.Moves() != 1 {
		t.Fatalf("moves = %d after the move to b", f.Moves())
	}
	move("g2", b, a)
	move("g3", a, b)
	check("after the moves to a and back to b")
	if f.Moves() != 1 {
		t.Fatalf("moves = %d: the session saw the part elsewhere", f.Moves())
	}
}

// memoryLenders starts two agents named a and b, each lending an 8 MiB
// memory device mem0, against one fake control plane.
func memoryLenders(t *testing.T, a, b string) (*Agent, *Agent) {
	t.Helper()
	_, srv := newFakeCP(t)
	cfg := func(name string) Config {
		return Config{ControlPlane: srv.URL, BootstrapToken: "boot", Name: name, StateDir: t.TempDir(),
			Devices: []DeviceConfig{{Name: "mem0", Kind: api.KindMemory, Size: 8 << 20}}}
	}
	return start(t, cfg(a)).a, start(t, cfg(b)).a
}

// dialMemory prepares part, a memory lease's, on a and dials it as its
// borrower: it returns the client (closed when the test ends, if not
// before) and the part's address and credential.
func dialMemory(t *testing.T, a *Agent, part api.PrepareRequest) (mc *memclient.Client, addr, cred string) {
	t.Helper()
	resp, err := a.Prepare(ctxFor(t), part)
	if err != nil {
		t.Fatalf("prepare %s: %v", part.Export, err)
	}
	addr, cred = memoryTarget(t, resp.URI)
	if mc, err = memclient.Dial(ctxFor(t), addr, cred, memclient.Options{}); err != nil {
		t.Fatalf("dialling %s: %v", part.Export, err)
	}
	t.Cleanup(func() { mc.Close() })
	return mc, addr, cred
}

// joinSync joins a data connection of mc's session for raw frames
// (protocol.KindSync), closed when the test ends.
func joinSync(t *testing.T, mc *memclient.Client) net.Conn {
	t.Helper()
	conn, err := mc.Join(ctxFor(t), protocol.KindSync)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
