package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	memclient "github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// rawMemWriter writes whole payloads of protocol.MaxPayload bytes, one at
// a time, to its slot of a memory region over a data connection of the
// borrower's session, with raw frames (its buffers are its own: the
// writer allocates nothing per write). It stops at its first write that
// fails, and remembers the last generation acknowledged.
type rawMemWriter struct {
	conn  net.Conn
	slot  int64
	frame []byte        // a WRITE's header and payload
	acked atomic.Uint64 // the last generation acknowledged (0: none)
	err   error         // why it stopped (after wg)
}

func memSlotStamp(p []byte, slot int64, gen uint64) {
	for i := 0; i < len(p); i += 16 {
		binary.LittleEndian.PutUint64(p[i:], uint64(slot))
		binary.LittleEndian.PutUint64(p[i+8:], gen)
	}
}

func (w *rawMemWriter) run(ctx context.Context, acks chan<- struct{}) {
	frame := w.frame
	var rep [protocol.HeaderSize + protocol.MaxMessage]byte
	for gen := uint64(1); ctx.Err() == nil; gen++ {
		(&protocol.Header{Op: protocol.OpWrite, Seq: uint32(gen), Offset: uint64(w.slot) * protocol.MaxPayload,
			Length: protocol.MaxPayload, Payload: protocol.MaxPayload}).Encode(frame)
		memSlotStamp(frame[protocol.HeaderSize:], w.slot, gen)
		if _, err := w.conn.Write(frame); err != nil {
			w.err = err
			return
		}
		if _, err := io.ReadFull(w.conn, rep[:protocol.HeaderSize]); err != nil {
			w.err = err
			return
		}
		h, err := protocol.DecodeHeader(rep[:protocol.HeaderSize])
		if err == nil && h.Status != protocol.StatusOK {
			_, _ = io.ReadFull(w.conn, rep[protocol.HeaderSize:protocol.HeaderSize+h.Payload])
			err = fmt.Errorf("status %d: %s", h.Status, rep[protocol.HeaderSize:protocol.HeaderSize+h.Payload])
		}
		if err != nil {
			w.err = err
			return
		}
		w.acked.Store(gen)
		select {
		case acks <- struct{}{}:
		default:
		}
	}
}

// TestMemoryMoveHoldsNoPayload: a borrower writing through several data
// connections of its session (sync and queue pairs) while its memory
// part moves costs the source none of its writes' payloads, though the
// move's switch holds every connection's write: the donor holds a WRITE
// after its header and takes its payload in only once the write is
// admitted, straight into the region (so there is nothing for
// --move-pending to bound, unlike a block part's NBD server). At the
// switch the held writes are refused, and their payloads (1 MiB each)
// are read through a small buffer, not one of a payload's size per
// connection. Every write acknowledged reads back from the destination.
func TestMemoryMoveHoldsNoPayload(t *testing.T) {
	const (
		size  = 8 << 20
		conns = size / protocol.MaxPayload // a 1 MiB slot each
	)
	src, dst := memoryLenders(t, "src", "dst")
	ctx := ctxFor(t)
	const export = "x_lease-p"
	part := api.PrepareRequest{LeaseID: "lease-p", Kind: api.KindMemory, DeviceName: "mem0", Length: size, Export: export}
	mc, _, cred := dialMemory(t, src, part)
	d := src.drivers[api.KindMemory].(*MemoryDriver).donor

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	acks := make(chan struct{}, 1)
	var wg sync.WaitGroup
	ws := make([]*rawMemWriter, conns)
	for i := range ws {
		kind := protocol.KindSync
		if i%2 == 1 {
			kind = protocol.KindQueue
		}
		c, err := mc.Join(ctx, kind)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ws[i] = &rawMemWriter{conn: c, slot: int64(i), frame: make([]byte, protocol.HeaderSize+protocol.MaxPayload)}
	}
	// The live heap before the writes (the connections are open), to
	// compare with the heap while the move holds a write on each.
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	live := ms.HeapAlloc
	for _, w := range ws {
		wg.Go(func() { w.run(wctx, acks) })
	}
	for range 2 * conns {
		within(t, acks, "the borrower's writes are not acknowledged")
	}

	in, err := dst.ReceiveTransfer(ctx, api.TransferInRequest{ID: "p1", Token: "tok_p1", Part: part})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.SendTransfer(ctx, api.TransferOutRequest{ID: "p1", LeaseID: part.LeaseID, Export: export, DestURI: in.URI,
		ConvergeBytes: 64 << 10, HoldSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	waitState(t, src, "p1", api.TransferReady)
	if _, err := src.SealTransfer(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	// Every connection's next write is held.
	if err := d.WaitMove(ctx, cred, func(st dirty.Stats) bool { return st.Held == conns }); err != nil {
		t.Fatalf("waiting for every connection's write to be held: %v", err)
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	held := int64(ms.HeapAlloc) - int64(live)
	t.Logf("live heap while %d writes of %d bytes are held: %+d bytes", conns, protocol.MaxPayload, held)
	if held >= protocol.MaxPayload {
		t.Errorf("the source's heap grew by %d bytes while %d writes of %d bytes are held", held, conns, protocol.MaxPayload)
	}
	for i, w := range ws {
		if w.acked.Load() == 0 {
			t.Fatalf("writer %d had no write acknowledged", i)
		}
	}

	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	cr, err := dst.CommitTransfer(ctx, "p1", api.TransferCommitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.CommitTransfer(ctx, "p1", api.TransferCommitRequest{}); err != nil {
		t.Fatal(err)
	}
	wg.Wait() // every writer's held write refused (or its connection closed)
	runtime.ReadMemStats(&ms)
	switched := ms.TotalAlloc - before
	t.Logf("allocated by the switch, %d held writes refused: %d bytes", conns, switched)
	if switched >= protocol.MaxPayload {
		t.Errorf("the switch allocated %d bytes to refuse %d held writes of %d bytes", switched, conns, protocol.MaxPayload)
	}
	for i, w := range ws {
		t.Logf("writer %d (slot %d): %d acknowledged, then %v", i, w.slot, w.acked.Load(), w.err)
	}

	naddr, ncred := memoryTarget(t, cr.URI)
	nc, err := memclient.Dial(ctx, naddr, ncred, memclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := make([]byte, size)
	if err := nc.Read(ctx, memclient.ChannelBulk, got, 0); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, protocol.MaxPayload)
	for _, w := range ws {
		gen := w.acked.Load()
		memSlotStamp(want, w.slot, gen)
		if p := got[w.slot*protocol.MaxPayload:][:protocol.MaxPayload]; !bytes.Equal(p, want) {
			t.Errorf("slot %d at the destination holds gen %d, want the last acknowledged, %d", w.slot, binary.LittleEndian.Uint64(p[8:]), gen)
		}
	}
}
