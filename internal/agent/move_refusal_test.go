package agent

import (
	"context"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// TestTeardownOfSealedMemoryMoveWithWithheldPayload: a borrower whose
// memory lease is moving sends a WRITE header while its writes are held
// and never the payload. The lease is torn down with the move sealed, as
// a heartbeat's answer does (whose round has no deadline): the teardown
// commits the move, whose retirement refuses the held write. It waited
// for that write's payload for good, and the heartbeat round with it;
// the retirement now stops waiting after the donor's RefusalWait.
func TestTeardownOfSealedMemoryMoveWithWithheldPayload(t *testing.T) {
	const size = 1 << 20
	src, dst := memoryLenders(t, "src", "dst")
	ctx := ctxFor(t)
	const export = "x_lease-w"
	mc, _, _ := dialMemory(t, src, api.PrepareRequest{LeaseID: "lease-w", Kind: api.KindMemory, DeviceName: "mem0",
		Length: size, Export: export})
	conn := joinSync(t, mc)

	in, err := dst.ReceiveTransfer(ctx, api.TransferInRequest{ID: "w1", Token: "tok_w1",
		Part: api.PrepareRequest{LeaseID: "lease-w", Kind: api.KindMemory, DeviceName: "mem0", Length: size, Export: export}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.SendTransfer(ctx, api.TransferOutRequest{ID: "w1", LeaseID: "lease-w", Export: export, DestURI: in.URI}); err != nil {
		t.Fatal(err)
	}
	waitTransfer(t, src, "w1", api.TransferReady)
	if _, err := src.SealTransfer(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	var hdr [protocol.HeaderSize]byte
	(&protocol.Header{Op: protocol.OpWrite, Seq: 1, Length: 4096, Payload: 4096}).Encode(hdr[:])
	if _, err := conn.Write(hdr[:]); err != nil { // and never the payload
		t.Fatal(err)
	}
	d := src.drivers[api.KindMemory].(*MemoryDriver).donor
	for d.Waiting(export) != 1 {
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the write was not held")
		}
	}
	d.RefusalWait = 100 * time.Millisecond

	done := make(chan error, 1)
	go func() { done <- src.teardownLease(context.Background(), "lease-w") }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the teardown of the lease waits for the withheld payload of a held write")
	}
	if st, _ := src.Transfer("w1"); st.State != api.TransferCommitted {
		t.Errorf("the transfer is %s, not committed", st.State)
	}
	if got := src.Leases(); len(got) != 0 {
		t.Errorf("the source keeps %v", got)
	}
}
