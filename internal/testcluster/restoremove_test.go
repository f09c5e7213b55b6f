package testcluster

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// writeURI writes p at off through the NBD export at uri, durably.
func writeURI(ctx context.Context, t *testing.T, uri string, p []byte, off int64) {
	t.Helper()
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.WriteAtContext(ctx, p, off, true); err != nil {
		t.Fatal(err)
	}
}

// readURI reads len(p) bytes at off through the NBD export at uri.
func readURI(ctx context.Context, t *testing.T, uri string, n int, off int64) []byte {
	t.Helper()
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := make([]byte, n)
	if _, err := nc.ReadAtContext(ctx, got, off); err != nil {
		t.Fatal(err)
	}
	return got
}

// deviceAllocated is the bytes device dev holds for live parts, as the control
// plane counts them.
func deviceAllocated(ctx context.Context, t *testing.T, c *Cluster, dev string) int64 {
	t.Helper()
	ds, err := c.Client().Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.ID == dev {
			return d.Allocated
		}
	}
	t.Fatalf("device %s not found", dev)
	return 0
}

// TestRestoredDatabaseAdoptsMovedPart: the control plane's database is
// restored from a backup taken before the one part of an active block
// lease moved (`rialto lease move`) from node X to node Y; X wiped its
// range after the move. The restored database places the part on X,
// which does not serve it; Y serves it, with the bytes written before
// the move and those written after it. Y is not told to tear it down:
// once X's heartbeats show it does not serve the part, the control plane
// adopts Y's copy (the part's record moves to Y, at the range Y serves,
// its capacity counted on Y and freed on X, event lease.part.adopted),
// and the lease reads back every byte from Y.
func TestRestoredDatabaseAdoptsMovedPart(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2})
	ctx := ctxT(t)
	cl := c.Client()
	l := createBlock(t, cl, 4<<20, api.ModeShared)
	x := c.NodeByID(l.NodeID)
	y := c.Nodes[0]
	if y == x {
		y = c.Nodes[1]
	}
	before := bytes.Repeat([]byte("written before the move "), 512)
	writeURI(ctx, t, l.URI, before, 0)
	backup := backupDB(t, c)

	ms, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{ToNode: y.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if ms = waitMoves(t, c, l.ID, len(ms)); ms[0].State != api.MoveDone || ms[0].Error != "" {
		t.Fatalf("the move: %+v", ms[0])
	}
	moved := c.Lease(l.ID)
	if moved.NodeID != y.ID() {
		t.Fatalf("moved to %s, not %s", moved.NodeID, y.ID())
	}
	c.Eventually("X let go of the part", func() bool { return !x.Serves(l.ID) })
	after := bytes.Repeat([]byte("written after the move "), 512)
	writeURI(ctx, t, moved.URI, after, 1<<20)

	restoreDB(t, c, backup)
	// On X as the backup had it, or on Y already (a loaded machine may
	// be slower than the adoption).
	if got := c.Lease(l.ID); got.NodeID != x.ID() && got.NodeID != y.ID() {
		t.Fatalf("the restored database places the lease on %s, not on X %s (nor adopted on Y)", got.NodeID, x.ID())
	}
	c.Eventually("the part adopted (or the lease lost)", func() bool {
		got := c.Lease(l.ID)
		return got.State != api.LeaseActive || got.Parts[0].NodeID == y.ID()
	})
	got := c.Lease(l.ID)
	if got.State != api.LeaseActive {
		t.Fatalf("the lease after the restore: %s (%q)", got.State, got.Reason)
	}
	p := got.Parts[0]
	if got.NodeID != y.ID() || p.NodeID != y.ID() || p.DeviceID != moved.Parts[0].DeviceID || p.Offset != moved.Parts[0].Offset || p.Length != moved.Parts[0].Length ||
		got.URI != moved.URI || p.URI != moved.URI {
		t.Fatalf("the adopted part is on %s device %s [%d+%d] (its URI Y's: %v), want Y's %+v",
			p.NodeID, p.DeviceID, p.Offset, p.Length, got.URI == moved.URI, moved.Parts[0].DeviceID)
	}
	if !y.Serves(l.ID) {
		t.Fatal("Y does not serve the adopted part")
	}
	if b := readURI(ctx, t, got.URI, len(before), 0); !bytes.Equal(b, before) {
		t.Fatal("the bytes written before the move are gone")
	}
	if b := readURI(ctx, t, got.URI, len(after), 1<<20); !bytes.Equal(b, after) {
		t.Fatal("the bytes written after the move are gone")
	}
	// Capacity: counted on Y's device, freed on X's.
	if a := deviceAllocated(ctx, t, c, p.DeviceID); a != 4<<20 {
		t.Errorf("Y's device holds %d bytes of live parts, want the part's", a)
	}
	if a := deviceAllocated(ctx, t, c, l.DeviceID); a != 0 {
		t.Errorf("X's device still holds %d bytes of live parts", a)
	}
	var adopted api.Event
	for _, e := range allEvents(ctx, t, cl) {
		if e.Type == "lease.part.adopted" && e.Subject == l.ID {
			adopted = e
		}
	}
	if !strings.Contains(adopted.Message, x.ID()) || !strings.Contains(adopted.Message, y.ID()) {
		t.Fatalf("the lease.part.adopted event: %+v", adopted)
	}
	// The borrower's view names Y; the lease goes on there (renewed, it
	// stays served).
	if _, err := cl.RenewLease(ctx, l.ID, 0); err != nil {
		t.Fatal(err)
	}
	c.Heartbeat()
	if !y.Serves(l.ID) || c.Lease(l.ID).State != api.LeaseActive {
		t.Fatal("the adopted lease did not stay served")
	}
}

// TestRestoredDatabaseLosesUnservedPart: a composed block lease has its
// two parts on one lender, A. The control plane's database is restored
// from a backup taken before part 1 moved to node B, whose agent has
// stopped since. A serves part 0 only: its heartbeats list the lease,
// but not part 1's export. Part 1, which no lender serves, is recorded
// lost (the lease with it: a composed volume does not go on without a
// part), saying which part and why, rather than the lease left active
// with a part no one serves.
func TestRestoredDatabaseLosesUnservedPart(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2})
	ctx := ctxT(t)
	cl := c.Client()
	a, b := c.Nodes[0], c.Nodes[1]
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 8 << 20, Affinity: []string{a.Name}})
	if err != nil {
		t.Fatal(err)
	}
	if l.State != api.LeaseActive || len(l.Parts) != 2 || l.Parts[0].NodeID != a.ID() || l.Parts[1].NodeID != a.ID() {
		t.Fatalf("the lease: %s, parts %+v", l.State, l.Parts)
	}
	backup := backupDB(t, c)
	one := 1
	ms, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{Part: &one, ToNode: b.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if ms = waitMoves(t, c, l.ID, len(ms)); ms[0].State != api.MoveDone || ms[0].Error != "" {
		t.Fatalf("the move: %+v", ms[0])
	}
	b.Kill()

	restoreDB(t, c, backup)
	c.Eventually("the lease with a part its lender does not serve recorded lost", func() bool { return c.Lease(l.ID).State == api.LeaseLost })
	got := c.Lease(l.ID)
	if !strings.Contains(got.Reason, a.ID()) || !strings.Contains(got.Reason, "does not serve part 1") {
		t.Fatalf("the lease's reason: %q", got.Reason)
	}
	if a.Serves(l.ID) {
		c.Eventually("A tears the lost lease's part 0 down", func() bool { return !a.Serves(l.ID) })
	}
}

// TestRestoredDatabaseAdoptsPartNextToAnother: a composed block lease
// has part 0 on node Y and part 1 on node X when the control plane's
// database is backed up; part 1 then moves to Y too. After the restore,
// Y's heartbeats list both parts' exports, the database places part 0
// on Y and part 1 on X: Y is told to keep serving part 0 and to leave
// part 1's export as it is (not to drop it as a part that moved away),
// and once X's heartbeats show it does not serve part 1, part 1 is
// adopted on Y. Both parts keep their bytes.
func TestRestoredDatabaseAdoptsPartNextToAnother(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2})
	ctx := ctxT(t)
	cl := c.Client()
	x, y := c.Nodes[0], c.Nodes[1]
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 8 << 20, Affinity: []string{x.Name}})
	if err != nil {
		t.Fatal(err)
	}
	if l.State != api.LeaseActive || l.Parts[0].NodeID != x.ID() || l.Parts[1].NodeID != x.ID() {
		t.Fatalf("the lease: %s, parts %+v", l.State, l.Parts)
	}
	move := func(part int) api.Lease {
		t.Helper()
		ms, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{Part: &part, ToNode: y.ID()})
		if err != nil {
			t.Fatal(err)
		}
		Eventually(t, 90*time.Second, "the move to end", func() bool {
			m, err := cl.Moves(ctx, l.ID)
			return err == nil && slices.ContainsFunc(m, func(m api.Move) bool { return m.ID == ms[0].ID && m.Done() })
		})
		got := c.Lease(l.ID)
		if got.Parts[part].NodeID != y.ID() {
			t.Fatalf("part %d did not move to Y: %+v", part, got.Parts[part])
		}
		return got
	}
	pats := [2][]byte{bytes.Repeat([]byte("part zero's bytes "), 300), bytes.Repeat([]byte("part one's bytes "), 300)}
	before := move(0)
	for i, p := range pats {
		writeURI(ctx, t, before.Parts[i].URI, p, 0)
	}
	backup := backupDB(t, c)
	after := move(1)
	later := bytes.Repeat([]byte("written to part one after its move "), 100)
	writeURI(ctx, t, after.Parts[1].URI, later, 1<<20)

	restoreDB(t, c, backup)
	// Part 1 on X as the backup had it, or on Y already (adopted).
	if got := c.Lease(l.ID); got.Parts[0].NodeID != y.ID() || (got.Parts[1].NodeID != x.ID() && got.Parts[1].NodeID != y.ID()) {
		t.Fatalf("the restored database places the parts on %s and %s", got.Parts[0].NodeID, got.Parts[1].NodeID)
	}
	c.Eventually("part 1 adopted on Y (or the lease lost)", func() bool {
		got := c.Lease(l.ID)
		return got.State != api.LeaseActive || got.Parts[1].NodeID == y.ID()
	})
	got := c.Lease(l.ID)
	if got.State != api.LeaseActive || got.Parts[1] != after.Parts[1] || got.Parts[0] != after.Parts[0] {
		t.Fatalf("after the restore: %s (%q), parts %+v, want %+v", got.State, got.Reason, stripURIs(got.Parts), stripURIs(after.Parts))
	}
	for i, p := range pats {
		if b := readURI(ctx, t, got.Parts[i].URI, len(p), 0); !bytes.Equal(b, p) {
			t.Fatalf("part %d's bytes are gone", i)
		}
	}
	if b := readURI(ctx, t, got.Parts[1].URI, len(later), 1<<20); !bytes.Equal(b, later) {
		t.Fatal("the bytes written to part 1 after its move are gone")
	}
}

// stripURIs is parts without their URIs (secrets), for messages.
func stripURIs(parts []api.Part) []api.Part {
	out := make([]api.Part, len(parts))
	for i, p := range parts {
		p.URI = ""
		out[i] = p
	}
	return out
}
