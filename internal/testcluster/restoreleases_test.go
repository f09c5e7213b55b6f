package testcluster

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// TestRestoredDatabaseReconcilesLeases: the control plane's database is
// restored from a backup taken while lease A was active on the one
// lender's only block device (8 MiB). Since the backup A was released (its
// lender tore it down and wiped its range) and lease B, the whole device,
// was created and written. After the restore the control plane holds A
// active and knows nothing of B; the agent, which did not restart, goes
// on heartbeating with its credential and lists B as the one lease it
// serves.
//
// B is torn down on its lender (the answer's teardown list) and wiped. A,
// which its lender no longer serves, is recorded lost, saying why (not
// left active for good, its range held and its borrower's attach failing),
// its capacity freed: a lease of the whole device is placed after it, and
// reads none of B's bytes.
func TestRestoredDatabaseReconcilesLeases(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20}}})
	ctx := ctxT(t)
	n := c.Nodes[0]
	a := createBlock(t, c.Client(), 4<<20, api.ModeShared)
	backup := backupDB(t, c)

	if got, err := c.Client().ReleaseLease(ctx, a.ID); err != nil || got.State != api.LeaseReleased {
		t.Fatalf("release A: %v (%s)", err, got.State)
	}
	c.Eventually("A torn down on its lender", func() bool { return !n.Serves(a.ID) })
	b := createBlock(t, c.Client(), 8<<20, api.ModeShared)
	pat := bytes.Repeat([]byte("lease B's bytes "), 256)
	nc, err := nbd.DialURI(ctx, b.URI)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 4 << 20} { // A's half and the other
		if _, err := nc.WriteAtContext(ctx, pat, off, true); err != nil {
			t.Fatal(err)
		}
	}
	nc.Close()

	restoreDB(t, c, backup)
	if _, err := c.Client().Lease(ctx, b.ID); !api.IsCode(err, api.CodeNotFound) {
		t.Fatalf("B after the restore: %v", err)
	}
	c.Eventually("B torn down on its lender, which the restored database does not tell to serve it", func() bool { return !n.Serves(b.ID) })
	c.Eventually("A, which its lender does not serve, recorded lost", func() bool { return c.Lease(a.ID).State == api.LeaseLost })
	if got := c.Lease(a.ID); !strings.Contains(got.Reason, "does not serve") {
		t.Fatalf("A's reason: %q", got.Reason)
	}
	evs, err := c.Client().Events(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var lost api.Event
	for _, e := range evs {
		if e.Type == "lease.lost" && e.Subject == a.ID {
			lost = e
		}
	}
	if !strings.Contains(lost.Message, "does not serve") {
		t.Fatalf("A's lease.lost event: %+v", lost)
	}

	// A's capacity is free, B's range wiped: the whole device is lent
	// again, zeroes.
	d := createBlock(t, c.Client(), 8<<20, api.ModeShared)
	nc, err = nbd.DialURI(ctx, d.URI)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := make([]byte, 8<<20)
	if _, err := nc.ReadAtContext(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	for i, x := range got {
		if x != 0 {
			t.Fatalf("the next tenant reads a byte of an earlier lease at offset %d", i)
		}
	}
}
