package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// TestSendTransferAnswersWhileAWriteArrives: a borrower's WRITE is under
// way as a move starts, its payload still arriving (here: its first bytes
// in, the rest withheld while the donor's clock, which times the wait,
// stands still). Starting to mark the writes waits for it, up to the
// donor's RefusalWaitLimit (a minute), longer than the control plane's
// call (30 s). The source answers the call at once all the same and
// waits in the transfer's own goroutine: the transfer is copying, its copy
// not begun; once the payload is in, the move goes on to its end, the
// write in the copy. SendTransfer waited for the write within the call:
// a write trickling in at the move's start failed the move.
func TestSendTransferAnswersWhileAWriteArrives(t *testing.T) {
	const size = 1 << 20
	const off, n, sent = 5 * 4096, 4096, 100
	src, dst := memoryLenders(t, "src", "dst")
	ctx := ctxFor(t)
	srcDonor := src.drivers[api.KindMemory].(*MemoryDriver).donor
	srcDonor.Clock = clock.NewFake(time.Unix(1e9, 0)) // the wait's bounds never pass
	const export = "x_lease-s"
	part := api.PrepareRequest{LeaseID: "lease-s", Kind: api.KindMemory, DeviceName: "mem0", Length: size, Export: export}
	mc, _, cred := dialMemory(t, src, part)
	conn := joinSync(t, mc)
	payload := bytes.Repeat([]byte{0xAB}, n)
	frame := make([]byte, protocol.HeaderSize, protocol.HeaderSize+sent)
	(&protocol.Header{Op: protocol.OpWrite, Seq: 1, Offset: off, Length: n, Payload: n}).Encode(frame)
	if _, err := conn.Write(append(frame, payload[:sent]...)); err != nil {
		t.Fatal(err)
	}
	// The first bytes are in the region: the write is under way.
	got := make([]byte, n)
	for {
		if _, err := srcDonor.ReadRegion(cred, got, off); err == nil && got[sent-1] == 0xAB {
			break
		}
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the write's first bytes never reached the region")
		}
	}

	in, err := dst.ReceiveTransfer(ctx, api.TransferInRequest{ID: "s1", Token: "tok_s1", Part: part})
	if err != nil {
		t.Fatal(err)
	}
	// Far shorter than the wait for the write; more than a start needs.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	st, err := src.SendTransfer(cctx, api.TransferOutRequest{ID: "s1", LeaseID: "lease-s", Export: export, DestURI: in.URI})
	cancel()
	if err != nil {
		t.Fatalf("SendTransfer with a write's payload arriving: %v", err)
	}
	if st.State != api.TransferCopying {
		t.Fatalf("the transfer is %s, want copying", st.State)
	}
	if st, _ := src.Transfer("s1"); st.State != api.TransferCopying || st.Pass != 0 {
		t.Fatalf("with the write's payload still arriving the transfer is %s at pass %d, want copying, not begun", st.State, st.Pass)
	}

	// The rest of the payload: the write completes, the move goes on.
	if _, err := conn.Write(payload[sent:]); err != nil {
		t.Fatal(err)
	}
	var hdr [protocol.HeaderSize]byte
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		t.Fatalf("the write was not answered: %v", err)
	}
	if st := binary.BigEndian.Uint16(hdr[6:]); st != protocol.StatusOK {
		t.Fatalf("the write: status %d", st)
	}
	waitTransfer(t, src, "s1", api.TransferReady)
	if _, err := src.SealTransfer(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.CommitTransfer(ctx, "s1", api.TransferCommitRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := src.CommitTransfer(ctx, "s1", api.TransferCommitRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.drivers[api.KindMemory].(*MemoryDriver).donor.ReadRegion(export, got, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Error("the write is not in the moved part")
	}
}

// TestSendTransferStartFails: a move whose start fails after the source
// answered (here: marking the writes cannot start) shows it in the
// transfer's state, which the control plane follows: failed, with the
// error; the part is served here as before, its writes not held.
func TestSendTransferStartFails(t *testing.T) {
	const id = "f1"
	src, dst, uri := blockMovers(t, sendingDriver{BlockDriver: NewBlockDriver(slog.New(slog.DiscardHandler)),
		sending: func(context.Context) error { return errors.New("the writes cannot be marked") }})
	startBlockMove(t, src, dst, id, 0, api.TransferOutRequest{})
	st := waitTransfer(t, src, id, api.TransferFailed)
	// In words for the tenant; the agent's log has the error.
	if want := "this lender could not start marking the borrower's writes to the part (its agent's log says why)"; st.Error != want {
		t.Errorf("the failed transfer says %q, want %q", st.Error, want)
	}
	writesServed(t, uri, "the failed start") // served here as before
}
