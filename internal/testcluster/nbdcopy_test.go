package testcluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
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
	c := Start(t, Options{Devices: []agent.DeviceConfig{
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
			t.Fatalf("%s: checksums differ after the round trip", name)
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
	a, err := stripe.Attach(ctx, stripe.AttachConfig{URIs: uris, StripeUnit: composed.StripeUnit})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Volume().Size() < size {
		t.Fatalf("composed volume holds %d bytes, want at least %d", a.Volume().Size(), size)
	}
	roundTrip("composed", a.URI(), nil)
}
