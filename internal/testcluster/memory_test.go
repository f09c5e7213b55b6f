package testcluster

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
)

func TestMemoryLease(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
		{Name: "mem0", Kind: api.KindMemory, Size: 8 << 20},
	}})
	ctx := ctxT(t)
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if l.State != api.LeaseActive || !strings.HasPrefix(l.URI, "rialto-mem://") {
		t.Fatalf("memory lease %+v", l)
	}
	lender := c.NodeByID(l.NodeID)
	addr := lender.Agent().Endpoint(api.KindMemory)
	export := l.URI[strings.LastIndex(l.URI, "/")+1:]
	mc, err := client.Dial(ctx, addr, export, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0xab}, 4096)
	if err := mc.Write(ctx, client.ChannelSync, want, 8192); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if err := mc.Read(ctx, client.ChannelSync, got, 8192); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back: %v", err)
	}
	mc.Close()
	if bad, err := client.Dial(ctx, addr, "not-a-credential", client.Options{}); err == nil {
		bad.Close()
		t.Fatal("a wrong credential reached a region")
	}
	if _, err := c.Client().ReleaseLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	c.Eventually("region freed", func() bool { return !lender.Serves(l.ID) })
}
