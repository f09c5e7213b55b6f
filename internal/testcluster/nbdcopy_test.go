package testcluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/logtest"
)

// TestNbdcopyThroughLeases is the block interop check end to end: nbdcopy
// (libnbd, a third-party client) round-trips 256 MiB of random data with
// identical checksums through a dedicated, a shared and a 3-way composed
// lease, each placed by the control plane and served by the agents; the
// composed volume is served locally by stripe.Attach, as `rialto attach`
// does.
func TestNbdcopyThroughLeases(t *testing.T) {
	t.Parallel()
	nbdcopy, err := exec.LookPath("nbdcopy")
	if err != nil {
		t.Skip("nbdcopy not installed")
	}
	const size = 256 << 20
	// Two devices per node (like `rialto up`), each large enough that every
	// node keeps room for a part whatever the first leases took: the
	// composed lease's three parts must land on three lenders.
	// The cluster's and the attachment's log, shown if the test fails.
	log, logs := logtest.Logger(&slog.HandlerOptions{Level: slog.LevelDebug})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", logs.String())
		}
	})
	c := Start(t, Options{Logger: log, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 2 * size},
		{Name: "disk1", Kind: api.KindBlock, Path: "disk1.img", Size: 2 * size},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	data := make([]byte, size)
	rand.NewChaCha8([32]byte{7}).Read(data)
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	data = nil

	// roundTrip copies src into uri and back with nbdcopy; between runs
	// after the copy in.
	// inspect, when set, says more about a range that differs (what the
	// composed volume holds there).
	var inspect func(off, n int64, want []byte) string
	roundTrip := func(name, uri string, between func()) {
		t.Helper()
		if out, err := exec.CommandContext(ctx, nbdcopy, src, uri).CombinedOutput(); err != nil {
			t.Fatalf("%s: nbdcopy in: %v\n%s", name, err, out)
		}
		if between != nil {
			between()
		}
		dst := filepath.Join(dir, name+".img")
		if out, err := exec.CommandContext(ctx, nbdcopy, uri, dst).CombinedOutput(); err != nil {
			t.Fatalf("%s: nbdcopy out: %v\n%s", name, err, out)
		}
		// The export may be larger than the data (a whole device): compare
		// the first size bytes, and the length.
		f, err := os.Open(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		h := sha256.New()
		if n, err := io.CopyN(h, f, size); err != nil || n != size {
			t.Fatalf("%s: read back %d bytes: %v", name, n, err)
		}
		if got := h.Sum(nil); !bytes.Equal(got, want[:]) {
			t.Fatalf("%s: checksums differ after the round trip: %s", name, describeDiff(t, src, dst, size, inspect))
		}
		if err := os.Remove(dst); err != nil {
			t.Fatal(err)
		}
	}

	dedicated := createBlock(t, c.Client(), size, api.ModeDedicated)
	roundTrip("dedicated", dedicated.URI, nil)

	// A shared lease, with a neighbour written between the copy in and the
	// copy out: on whichever device it landed, the neighbour's bytes must
	// stay out of this lease's partition.
	shared := createBlock(t, c.Client(), size, api.ModeShared)
	other := createBlock(t, c.Client(), 16<<20, api.ModeShared)
	roundTrip("shared", shared.URI, func() {
		nc, err := nbd.DialURI(ctx, other.URI)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		junk := bytes.Repeat([]byte("neighbour"), (16<<20)/9+1)[:16<<20]
		if _, err := nc.WriteAtContext(ctx, junk, 0, true); err != nil {
			t.Fatalf("neighbour write: %v", err)
		}
	})

	composed, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 3, Size: size})
	if err != nil {
		t.Fatal(err)
	}
	if composed.State != api.LeaseActive || len(composed.Parts) != 3 {
		t.Fatalf("composed lease %+v", composed)
	}
	nodes := map[string]bool{}
	var uris []string
	for _, p := range composed.Parts {
		nodes[p.NodeID] = true
		uris = append(uris, p.URI)
	}
	if len(nodes) != 3 {
		t.Errorf("composed parts on %d nodes, want 3: %+v", len(nodes), composed.Parts)
	}
	for _, p := range composed.Parts {
		t.Logf("composed part on %s: device %s [%d, +%d)", p.NodeID, p.DeviceID, p.Offset, p.Length)
	}
	a, err := stripe.Attach(ctx, stripe.AttachConfig{URIs: uris, StripeUnit: composed.StripeUnit, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Volume().Size() < size {
		t.Fatalf("composed volume holds %d bytes, want at least %d", a.Volume().Size(), size)
	}
	inspect = func(off, n int64, want []byte) string {
		// Read back through the volume itself, not through the local
		// export nbdcopy used: tells a write that did not land from a
		// read (or a block status) that went wrong.
		got := make([]byte, n)
		if _, err := a.Volume().ReadAt(got, off); err != nil {
			return "volume read: " + err.Error()
		}
		ext, err := a.Volume().Extents(off, n)
		return fmt.Sprintf("volume holds the source's bytes: %v; block status %+v (err %v)", bytes.Equal(got, want), ext, err)
	}
	roundTrip("composed", a.URI(), nil)
}

// describeDiff says where the first size bytes of files a and b differ:
// each differing 4 KiB block range (up to ten), whether b holds zeroes
// there (a hole reported where there is data) or other bytes, and what
// inspect (if set) finds there.
func describeDiff(t *testing.T, a, b string, size int64, inspect func(off, n int64, want []byte) string) string {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		return err.Error()
	}
	y, err := os.ReadFile(b)
	if err != nil {
		return err.Error()
	}
	const blk = 4 << 10
	var out []string
	zero := make([]byte, blk)
	for off := int64(0); off < size && len(out) < 10; off += blk {
		if bytes.Equal(x[off:off+blk], y[off:off+blk]) {
			continue
		}
		end := off + blk
		for end < size && !bytes.Equal(x[end:end+blk], y[end:end+blk]) {
			end += blk
		}
		what := "other bytes"
		if bytes.Equal(y[off:off+blk], zero) {
			what = "zeroes"
		}
		more := ""
		if inspect != nil {
			more = "; " + inspect(off, end-off, x[off:end])
		}
		out = append(out, fmt.Sprintf("[%d, %d) (%d KiB, %s%s)", off, end, (end-off)>>10, what, more))
		off = end - blk
	}
	return strings.Join(out, ", ")
}
