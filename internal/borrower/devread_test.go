package borrower

import (
	"bytes"
	"crypto/sha256"
	"reflect"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/testcluster"
)

func TestBlockRangeOfLease(t *testing.T) {
	const a, b = "nbd://10.0.0.1:10809/" + secret + ".0", "nbd://10.0.0.2:10809/" + secret + ".1"
	one := lease(api.KindBlock, api.LeaseActive, a)
	one.Size = 1 << 20
	two := lease(api.KindBlock, api.LeaseActive, "", a, b)
	two.Size = 2 << 20
	unit := two
	unit.StripeUnit = 64 << 10
	for _, tc := range []struct {
		name   string
		l      api.Lease
		off, n int64
		want   accel.BlockRange
		err    string
	}{
		{"one part", one, 4096, 1<<20 - 4096, accel.BlockRange{Parts: []string{a}, Offset: 4096}, ""},
		{"composed, default unit", two, 0, 1, accel.BlockRange{Parts: []string{a, b}, StripeUnit: 128 << 10}, ""},
		{"composed, the lease's unit", unit, 5, 0, accel.BlockRange{Parts: []string{a, b}, StripeUnit: 64 << 10, Offset: 5}, ""},
		{"past the end", one, 1, 1 << 20, accel.BlockRange{}, "range [1, +1048576) is outside lease lease-1 (1048576 bytes)"},
		{"negative", one, -1, 1, accel.BlockRange{}, "outside lease lease-1"},
		{"offset beyond", one, 2 << 20, 0, accel.BlockRange{}, "outside lease lease-1"},
		{"not block", lease(api.KindAccel, api.LeaseActive, a), 0, 1, accel.BlockRange{}, "is an accel lease"},
	} {
		got, err := BlockRange(tc.l, tc.off, tc.n)
		if checkErr(t, tc.name, err, tc.err) && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v %q, want %v %q", tc.name, got, got.Parts, tc.want, tc.want.Parts)
		}
	}
}

// An accelerator slot hashes a range of a composed block lease reading
// each stripe from its lender itself, and the borrower relaying the same
// range (chunked, or whole) into the slot gives the same digest; the
// output goes to another block lease, directly or relayed.
func TestAcceleratorReadsBlockLease(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{Nodes: 3, Devices: devices()})
	ctx := ctxT(t)
	blk, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 3, Size: 3 << 20, StripeUnit: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	acc, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	att, err := Attach(ctx, nil, blk, AttachConfig{})
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(3<<20, 5)
	writeNBD(ctx, t, att.URI(), data, 0)
	if err := att.Close(); err != nil {
		t.Fatal(err)
	}
	slots, err := AccelSlots(acc)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := DialAccel(ctx, slots[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	const off, n = 100<<10 + 3, 700 << 10
	want := sha256.Sum256(data[off : off+n])
	in, err := BlockRange(blk, off, n)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := BlockRange(out, 4096, 32)
	if err != nil {
		t.Fatal(err)
	}
	k, got, err := conn.RunBlockTask(ctx, accel.BlockTask{Entry: "sum", Input: in, InLen: n})
	if err != nil || k != 32 || !bytes.Equal(got, want[:]) {
		t.Fatalf("direct: %x (%v), want %x", got, err, want)
	}
	if _, _, err := conn.RunBlockTask(ctx, accel.BlockTask{Entry: "sum", Input: in, InLen: n, Output: &dst}); err != nil {
		t.Fatal(err)
	}
	if b, err := readNBD(ctx, out.URI, 32, 4096); err != nil || !bytes.Equal(b, want[:]) {
		t.Fatalf("the output lease holds %x (%v), want %x", b, err, want)
	}

	for _, chunk := range []int{64 << 10, n} {
		if err := conn.WriteMem(ctx, 0, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		if err := RelayLoad(ctx, conn, 0, n, in, chunk, nil); err != nil {
			t.Fatal(err)
		}
		task, err := conn.Start(ctx, accel.TaskSpec{Entry: "sum", InLen: n, Out: n, OutCap: 64})
		if err != nil {
			t.Fatal(err)
		}
		if k, err := task.Wait(ctx); err != nil || k != 32 {
			t.Fatalf("relayed task: %d %v", k, err)
		}
		rdst := dst
		rdst.Offset = 8192 + uint64(chunk)
		if err := RelayStore(ctx, conn, n, 32, rdst, chunk, nil); err != nil {
			t.Fatal(err)
		}
		if b, err := readNBD(ctx, out.URI, 32, 8192+int64(chunk)); err != nil || !bytes.Equal(b, want[:]) {
			t.Fatalf("chunk %d: relayed output %x (%v), want %x", chunk, b, err, want)
		}
	}
	if err := RelayLoad(ctx, conn, 0, 4096, accel.BlockRange{Parts: in.Parts, StripeUnit: in.StripeUnit, Offset: 3<<20 - 100}, 0, nil); err == nil {
		t.Fatal("a relay past the volume's end succeeded")
	}
}
