package agent

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// The block driver counts each device's traffic through its exports, over
// real NBD connections (large requests take the splice and sendfile paths,
// small ones the buffered path), and reports what its sparse backing file
// holds.
func TestBlockDriverUsage(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	b := NewBlockDriver(nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		b.Serve(ctx, ln)
	}()
	defer func() {
		cancel()
		wg.Wait()
		b.Close()
	}()
	dev, err := b.Open(ctx, DeviceConfig{Name: "disk0", Kind: api.KindBlock, Path: filepath.Join(t.TempDir(), "disk0.img"), Size: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if u := b.Usage(); len(u) != 1 || u[0].Name != "disk0" || u[0].ReadBytes != 0 || u[0].WrittenBytes != 0 || u[0].UsedBytes == nil || *u[0].UsedBytes != 0 {
		t.Fatalf("a fresh device: %+v", u)
	}
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i)
	}
	for i, off := range []int64{0, 32 << 20} {
		name := "x" + string(rune('0'+i))
		resp, err := b.Prepare(ctx, Export{Request: api.PrepareRequest{LeaseID: "l", Export: name, Offset: off, Length: 16 << 20},
			Device: dev, Endpoint: ln.Addr().String()})
		if err != nil {
			t.Fatal(err)
		}
		c, err := nbd.DialURI(ctx, resp.URI)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteAt(big, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteAt(big[:4096], 2<<20); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ReadAt(big, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ReadAt(big[:4096], 0); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	u := b.Usage()
	want := int64(2 * (1<<20 + 4096))
	if len(u) != 1 || u[0].WrittenBytes != want || u[0].ReadBytes != want {
		t.Fatalf("counters %+v, want %d written and read", u, want)
	}
	// What was written is allocated in the sparse file, and little else.
	if used := u[0].UsedBytes; used == nil || *used < 2<<20 || *used > 8<<20 {
		t.Errorf("used %v bytes after writing 2 MiB", used)
	}
}
