package client

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd/nbdtest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
)

func TestBackendOverNBD(t *testing.T) {
	const size = 8 << 20
	td := memorytest.Start(t, size, 0)
	c := dial(t, td.Addr, Options{})
	be := NewBackend(c)
	srv := &nbd.Server{}
	if err := srv.AddExport(nbd.Export{Name: "swap-" + testCred, Backend: be}); err != nil {
		t.Fatal(err)
	}
	ln := nbdtest.Listen(t)
	nbdtest.Serve(t, srv, ln)
	ctx := context.Background()
	nc, err := nbd.Dial(ctx, "tcp", ln.Addr().String(), "swap-"+testCred)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.Size() != size {
		t.Fatalf("export size %d", nc.Size())
	}
	shadow := make([]byte, size)
	rng := rand.New(rand.NewPCG(8, 9))
	for _, n := range []int{512, 4096, 65536, 1 << 20, 3 << 20} {
		off := rng.Int64N(int64(size-n)) &^ 511
		p := make([]byte, n)
		_, _ = rand.NewChaCha8([32]byte{byte(n)}).Read(p)
		if _, err := nc.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		copy(shadow[off:], p)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if _, err := nc.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, shadow) {
		t.Fatal("NBD view differs")
	}
	// The same bytes are visible through the memory channels.
	if err := c.Read(context.Background(), ChannelBulk, got, 0); err != nil || !bytes.Equal(got, shadow) {
		t.Fatalf("memory view differs: %v", err)
	}
	// A real third-party client copies an image in and out.
	if _, err := exec.LookPath("nbdcopy"); err != nil {
		t.Skip("nbdcopy not installed")
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	_, _ = rand.NewChaCha8([32]byte{42}).Read(shadow)
	if err := os.WriteFile(in, shadow, 0o600); err != nil {
		t.Fatal(err)
	}
	uri := "nbd://" + ln.Addr().String() + "/swap-" + testCred
	if b, err := exec.Command("nbdcopy", in, uri).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy in: %v %s", err, b)
	}
	if b, err := exec.Command("nbdcopy", uri, out).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy out: %v %s", err, b)
	}
	back, err := os.ReadFile(out)
	if err != nil || !bytes.Equal(back, shadow) {
		t.Fatalf("nbdcopy round trip differs: %v", err)
	}
}
