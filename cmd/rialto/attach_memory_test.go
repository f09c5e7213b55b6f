package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// A memory lease attached as an NBD export (remote memory as a swap-style
// block device): bytes written through NBD are in the donor's memory.
func TestAttachMemoryLease(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
		{Name: "mem0", Kind: api.KindMemory, Size: 16 << 20},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	uri, done := attached(t, c, runtime, l.ID)
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	if nc.Size() != 4<<20 {
		t.Fatalf("export of %d bytes, lease of %d", nc.Size(), 4<<20)
	}
	want := make([]byte, 256<<10)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	const off = 1 << 20
	if _, err := nc.WriteAt(want, off); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	// The donor admits one subscriber at a time: detach, then read back
	// over the memory protocol itself, not through NBD.
	if _, errb, code := runIn(t, c, runtime, "detach", l.ID); code != 0 {
		t.Fatalf("detach exited %d: %s", code, errb)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("attach exited %d", code)
		}
	case <-ctx.Done():
		t.Fatal("attach did not end after detach")
	}
	u, err := protocol.ParseURI(l.URI)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	testcluster.Eventually(t, 30*time.Second, "donor holds the bytes written over NBD", func() bool {
		mc, err := client.Dial(ctx, u.Address, u.Credential, client.Options{Timeout: 5 * time.Second})
		if err != nil {
			return false
		}
		defer mc.Close()
		return mc.Read(ctx, client.ChannelSync, got, off) == nil && bytes.Equal(got, want)
	})
}
