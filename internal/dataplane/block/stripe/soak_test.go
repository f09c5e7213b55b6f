package stripe

import (
	"bytes"
	"context"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// TestSoakNbdcopyComposed round-trips 64 MiB with nbdcopy through a 3-way
// composed volume over three lenders serving partitions of files on tmpfs
// (as agents serve leases: the partition in the middle of a larger file),
// RIALTO_SOAK_ITERS times (default 100), comparing every byte, each time
// with fresh lenders and a fresh attachment. Rare silent corruption shows
// here and not in one round trip: a write whose iovecs the kernel read
// from a goroutine's old stack (rawCall took a uintptr) failed
// TestNbdcopyThroughLeases once in CI; TestRawCallsAcrossStackGrowth
// checks that cause directly. Under `make soak` (RIALTO_SOAK=1).
func TestSoakNbdcopyComposed(t *testing.T) {
	if os.Getenv("RIALTO_SOAK") == "" {
		t.Skip("RIALTO_SOAK not set")
	}
	need(t, "nbdcopy")
	iters := 100
	if s := os.Getenv("RIALTO_SOAK_ITERS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("RIALTO_SOAK_ITERS=%q: want a positive count", s)
		}
		iters = n
	}
	dir := t.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		// tmpfs: the lenders serve from memory, which is when requests
		// overlap most (the failure above needed it).
		shm, err := os.MkdirTemp("/dev/shm", "rialto-soak-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(shm) })
		dir = shm
	}
	const size = 64 << 20
	const part = 22 << 20 // 3 × 22 MiB ≥ 64 MiB
	data := make([]byte, size)
	mrand.NewChaCha8([32]byte{11}).Read(data)
	src := filepath.Join(t.TempDir(), "src.img")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	for it := range iters {
		soakRoundTrip(t, it, dir, src, data, part)
	}
}

// soakRoundTrip is one round trip of TestSoakNbdcopyComposed through
// fresh lenders over files in dir, each holding its part in the middle.
func soakRoundTrip(t *testing.T, it int, dir, src string, data []byte, part int64) {
	t.Helper()
	size := len(data)
	var uris []string
	for i := range 3 {
		p := filepath.Join(dir, "dev"+strconv.Itoa(i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 3*part); err != nil {
			t.Fatal(err)
		}
		be, err := nbd.OpenFile(p, nbd.FileOptions{Offset: part, Length: part})
		if err != nil {
			t.Fatal(err)
		}
		l := startLenderWith(t, be)
		uris = append(uris, l.uri)
		defer func() {
			l.kill()
			be.Close()
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := Attach(ctx, AttachConfig{URIs: uris, StripeUnit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	dst := filepath.Join(t.TempDir(), "dst.img")
	if out, err := exec.CommandContext(ctx, "nbdcopy", src, a.URI()).CombinedOutput(); err != nil {
		t.Fatalf("round trip %d: nbdcopy in: %v\n%s", it, err, out)
	}
	if out, err := exec.CommandContext(ctx, "nbdcopy", a.URI(), dst).CombinedOutput(); err != nil {
		t.Fatalf("round trip %d: nbdcopy out: %v\n%s", it, err, out)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < size {
		t.Fatalf("round trip %d: read back %d bytes, want %d", it, len(got), size)
	}
	for off := 0; off < size; off += 4 << 10 {
		if !bytes.Equal(got[off:off+4<<10], data[off:off+4<<10]) {
			t.Fatalf("round trip %d: the 4 KiB block at %d differs (zeroes: %v)", it, off,
				bytes.Count(got[off:off+4<<10], []byte{0}) == 4<<10)
		}
	}
}
