package testcluster

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// TestRestartedLenderLosesMemoryLease: a memory lease's region lives in
// its lender's process, so after the lender restarts on its state dir the
// lease is lost in the control plane (recorded by the restarted agent's
// first heartbeat, before it is ready), its credential reaches no region
// (a borrower that reconnects is refused, and a following one stops: it
// never reads zeroes where its data was), the agent warns naming the lease
// (never the export name) and counts it, and the memory returns to the
// pool: a lease of the whole device is placed there again and reads
// zeroes. The next restart reports nothing again.
func TestRestartedLenderLosesMemoryLease(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	c := Start(t, Options{Nodes: 1, Logger: slog.New(rec), Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
		{Name: "mem0", Kind: api.KindMemory, Size: 4 << 20},
	}})
	ctx := ctxT(t)
	cl := c.Client()
	block := createBlock(t, cl, 1<<20, api.ModeDedicated)
	mem, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	u := mustURL(t, mem.URI)
	secret := strings.TrimPrefix(u.Path, "/")
	relocate := func(ctx context.Context) (string, string, error) {
		l, err := cl.Lease(ctx, mem.ID)
		if err != nil {
			return "", "", err
		}
		if l.State != api.LeaseActive {
			return "", "", client.ErrEnded
		}
		lu := mustURL(t, l.URI)
		return lu.Host, strings.TrimPrefix(lu.Path, "/"), nil
	}
	f, err := client.DialFollowing(ctx, u.Host, secret, client.Options{}, client.FollowConfig{Relocate: relocate})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := bytes.Repeat([]byte("rialto memory "), 300)
	if err := f.Write(ctx, client.ChannelSync, want, 8192); err != nil {
		t.Fatal(err)
	}

	lender := c.Nodes[0]
	lender.Restart()
	got := c.Lease(mem.ID)
	if got.State != api.LeaseLost || !strings.Contains(got.Reason, "memory region") {
		t.Fatalf("memory lease after its lender restarted: %s (%q), want lost", got.State, got.Reason)
	}
	if s := c.Lease(block.ID).State; s != api.LeaseActive || !lender.Serves(block.ID) {
		t.Fatalf("block lease after the restart: %s", s)
	}
	if lender.Serves(mem.ID) {
		t.Fatal("the restarted agent keeps an export of the lost memory lease")
	}
	if n := restartCounter(lender, "lost"); n != 1 {
		t.Errorf("%v exports counted lost, want 1", n)
	}
	if n := restartCounter(lender, "same_address"); n != 1 {
		t.Errorf("%v exports restored at the same address, want 1 (the block lease)", n)
	}
	var warned map[string]string
	rec.mu.Lock()
	for _, w := range rec.warns {
		if strings.Contains(w["msg"], "did not survive the restart") && w["lease"] == mem.ID {
			warned = w
		}
		for k, v := range w {
			if strings.Contains(v, secret) {
				t.Errorf("warning %q: attribute %s holds the export name", w["msg"], k)
			}
		}
	}
	rec.mu.Unlock()
	if warned == nil {
		t.Error("no warning names the lost memory lease")
	}

	// The borrower is refused, not served zeroes.
	buf := make([]byte, len(want))
	if err := f.Read(ctx, client.ChannelSync, buf, 8192); err == nil {
		t.Fatalf("a following session read the lost lease's region (zeroes: %v)", bytes.Equal(buf, make([]byte, len(buf))))
	}
	if mc, err := client.Dial(ctx, u.Host, secret, client.Options{}); !errors.Is(err, protocol.ErrAuth) {
		if err == nil {
			mc.Close()
		}
		t.Fatalf("dialling the lost lease's URI: %v, want %v", err, protocol.ErrAuth)
	}
	if saved := savedURIs(t, lender); saved[mem.ID] != "" || len(saved) != 1 {
		t.Errorf("the state file lists %d exports (the memory lease: %v), want only the block lease", len(saved), saved[mem.ID] != "")
	}

	// The memory is back in the pool, zeroed.
	again, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 4 << 20})
	if err != nil {
		t.Fatalf("a lease of the whole memory device after the loss: %v", err)
	}
	au := mustURL(t, again.URI)
	mc, err := client.Dial(ctx, au.Host, strings.TrimPrefix(au.Path, "/"), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mc.Read(ctx, client.ChannelSync, buf, 8192); err != nil || !bytes.Equal(buf, make([]byte, len(buf))) {
		t.Fatalf("the next memory lease: %v (zeroes: %v)", err, bytes.Equal(buf, make([]byte, len(buf))))
	}
	mc.Close()
	if _, err := cl.ReleaseLease(ctx, again.ID); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the second memory lease torn down", func() bool { return !lender.Serves(again.ID) })

	// Acknowledged: the next restart reports nothing.
	lender.Restart()
	if n := restartCounter(lender, "lost"); n != 0 {
		t.Errorf("the next restart counted %v exports lost again", n)
	}
	if s := c.Lease(block.ID).State; s != api.LeaseActive || !lender.Serves(block.ID) {
		t.Fatalf("block lease after the second restart: %s", s)
	}
}
