package testcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
)

func moveDevices() []agent.DeviceConfig {
	return []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 64 << 20},
		{Name: "mem0", Kind: api.KindMemory, Size: 16 << 20},
		{Name: "accel0", Kind: api.KindAccel, Size: 2, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}
}

// blockWriter writes stamped 4 KiB blocks through a borrower's NBD view
// and remembers what each block holds once its write completed.
type blockWriter struct {
	vol    *nbd.Client
	blocks int64
	mu     sync.Mutex
	model  map[int64]uint64
	writes atomic.Int64
	errs   atomic.Int64
	last   atomic.Value
	stop   chan struct{}
	wg     sync.WaitGroup
}

func stampBlock(b int64, gen uint64) []byte {
	p := make([]byte, 4096)
	for i := 0; i < len(p); i += 16 {
		binary.LittleEndian.PutUint64(p[i:], uint64(b))
		binary.LittleEndian.PutUint64(p[i+8:], gen)
	}
	return p
}

func startBlockWriter(vol *nbd.Client, blocks int64) *blockWriter {
	w := &blockWriter{vol: vol, blocks: blocks, model: map[int64]uint64{}, stop: make(chan struct{})}
	const workers = 3
	for k := range workers {
		w.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k), 9))
			for gen := uint64(1); ; gen++ {
				select {
				case <-w.stop:
					return
				default:
				}
				b := rng.Int64N(blocks/workers)*workers + int64(k)
				if _, err := vol.WriteAt(stampBlock(b, gen), b*4096); err != nil {
					w.errs.Add(1)
					w.last.Store(err.Error())
					continue
				}
				w.mu.Lock()
				w.model[b] = gen
				w.mu.Unlock()
				w.writes.Add(1)
			}
		})
	}
	return w
}

func (w *blockWriter) halt() { close(w.stop); w.wg.Wait() }

// attachWriter attaches lease l through `rialto attach`'s code (over TLS
// with cfg when it is set), dials the attachment's NBD export and starts
// writing its first size bytes; it returns once the first 100 writes are
// in. The attachment and the connection close when the test ends.
func attachWriter(ctx context.Context, t *testing.T, cl *api.Client, l api.Lease, size int64, cfg *tls.Config) *blockWriter {
	t.Helper()
	att, err := borrower.Attach(ctx, cl, l, borrower.AttachConfig{RequestTimeout: 20 * time.Second, TLS: borrower.StaticTLS(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { att.Close() })
	vol, err := nbd.DialURI(ctx, att.URI())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	w := startBlockWriter(vol, size/4096)
	w.waitWrites(t, 100)
	return w
}

// finish waits for 100 more writes (at the lease's new place), stops the
// writers and checks that none failed and every block holds what was
// last written to it.
func (w *blockWriter) finish(t *testing.T) {
	t.Helper()
	w.waitWrites(t, 100)
	w.halt()
	if n := w.errs.Load(); n != 0 {
		t.Fatalf("the borrower saw %d write errors (last: %v)", n, w.last.Load())
	}
	w.check(t)
}

func (w *blockWriter) waitWrites(t *testing.T, n int64) {
	t.Helper()
	base := w.writes.Load()
	Eventually(t, 60*time.Second, "the borrower's writes", func() bool { return w.writes.Load() >= base+n })
}

func (w *blockWriter) check(t *testing.T) {
	t.Helper()
	p := make([]byte, 4096)
	for b := range w.blocks {
		if _, err := w.vol.ReadAt(p, b*4096); err != nil {
			t.Fatalf("read block %d: %v", b, err)
		}
		want := make([]byte, 4096)
		if gen, ok := w.model[b]; ok {
			want = stampBlock(b, gen)
		}
		if !bytes.Equal(p, want) {
			t.Fatalf("block %d holds gen %d, want %d", b, binary.LittleEndian.Uint64(p[8:]), w.model[b])
		}
	}
}

// waitMoves waits until the moves of lease id have all ended and returns
// them.
func waitMoves(t *testing.T, c *Cluster, id string, n int) []api.Move {
	t.Helper()
	var ms []api.Move
	Eventually(t, 90*time.Second, "the moves to end", func() bool {
		var err error
		if ms, err = c.Client().Moves(ctxT(t), id); err != nil || len(ms) < n {
			return false
		}
		for _, m := range ms {
			if !m.Done() {
				return false
			}
		}
		return true
	})
	return ms
}

// TestMoveComposedLease moves both parts of a composed block lease while a
// borrower, attached as `rialto attach` attaches, writes it: no write
// fails, every block holds what was last written, the lease points at the
// new lenders, the old ones serve nothing, and the events tell the story.
func TestMoveComposedLease(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 4, Devices: moveDevices()})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	w := attachWriter(ctx, t, cl, l, 8<<20, nil)

	// Refusals: another tenant's lease, a part that does not exist, a
	// destination of the wrong kind.
	if _, err := c.ClientWithToken(TenantToken("nobody")).MoveLease(ctx, l.ID, api.MoveRequest{}); err == nil {
		t.Error("an unknown token moved a lease")
	}
	bad := 5
	if _, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{Part: &bad}); !api.IsCode(err, api.CodeInvalid) {
		t.Errorf("moving part 5: %v", err)
	}
	old := map[string]bool{l.Parts[0].NodeID: true, l.Parts[1].NodeID: true}
	ms, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("%d moves started", len(ms))
	}
	ms = waitMoves(t, c, l.ID, 2)
	w.waitWrites(t, 100) // at the new lenders
	w.halt()
	for _, m := range ms {
		if m.State != api.MoveDone || m.Copied == 0 || m.From.NodeID == m.To.NodeID {
			t.Errorf("move %+v", m)
		}
	}
	if n := w.errs.Load(); n != 0 {
		t.Fatalf("the borrower saw %d write errors (last: %v)", n, w.last.Load())
	}
	if err := w.vol.Flush(); err != nil {
		t.Fatalf("flush after the moves: %v", err)
	}
	w.check(t)
	got, err := cl.Lease(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		p := got.Parts[m.Part]
		if p.NodeID != m.To.NodeID || p.DeviceID != m.To.DeviceID || p.URI == l.Parts[m.Part].URI {
			t.Errorf("part %d is on %s, its move went to %s (or its URI did not change)", m.Part, p.NodeID, m.To.NodeID)
		}
	}
	for id := range old {
		n := c.NodeByID(id)
		if n.Serves(l.ID) && !slices.ContainsFunc(got.Parts, func(p api.Part) bool { return p.NodeID == id }) {
			t.Errorf("old lender %s still serves the lease", n.Name)
		}
	}
	evs := allEvents(ctx, t, cl)
	var types []string
	for _, e := range evs {
		if e.Subject == l.ID {
			types = append(types, e.Type)
		}
	}
	for _, want := range []string{"lease.move.started", "lease.move.progress", "lease.moved", "lease.move.done"} {
		if !slices.Contains(types, want) {
			t.Errorf("no %s event for the lease (%v)", want, types)
		}
	}
	// A plain NBD client of an old URI finds nothing there.
	if c2, err := nbd.DialURI(ctx, l.Parts[0].URI); !errors.Is(err, nbd.ErrExportNotFound) {
		if c2 != nil {
			c2.Close()
		}
		t.Errorf("the old URI: %v", err)
	}
}

// TestMoveMemoryLease moves a memory lease, written through `rialto
// attach` (a swap-style device), while it is used: no error, its bytes
// kept.
func TestMoveMemoryLease(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: moveDevices()})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	w := attachWriter(ctx, t, cl, l, 4<<20, nil)
	if _, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{}); err != nil {
		t.Fatal(err)
	}
	ms := waitMoves(t, c, l.ID, 1)
	w.finish(t)
	if ms[0].State != api.MoveDone {
		t.Fatalf("move %+v", ms[0])
	}
	if got, _ := cl.Lease(ctx, l.ID); got.NodeID == l.NodeID || got.URI == l.URI {
		t.Errorf("the lease after its move: %+v", got)
	}
}

// TestMoveMemoryLeaseMapping: a memory lease mapped into the borrower
// (borrower.MapMemory) stays mapped across its move: what the program
// wrote before reads the same after, without the mapping being opened
// again, and writes after the move reach the new place. The mapping's
// bytes are touched with plain loops: the donors run in this process.
func TestMoveMemoryLeaseMapping(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: moveDevices()})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	mm, err := borrower.MapMemory(ctx, cl, l, 0, client.Options{Timeout: 10 * time.Second}, mapping.Options{CacheBytes: 256 << 10})
	if errors.Is(err, mapping.ErrUffdUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer mm.Close()
	b := mm.Bytes()
	pattern := func(i int, gen byte) byte { return byte(i*7+i/4096) ^ gen }
	for i := range b {
		b[i] = pattern(i, 0)
	}
	if _, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{}); err != nil {
		t.Fatal(err)
	}
	if ms := waitMoves(t, c, l.ID, 1); ms[0].State != api.MoveDone {
		t.Fatalf("move %+v", ms[0])
	}
	for i := range b {
		if b[i] != pattern(i, 0) {
			t.Fatalf("byte %d reads %d after the move, want %d (%v)", i, b[i], pattern(i, 0), mm.Err())
		}
	}
	for i := range b {
		b[i] = pattern(i, 0x5a)
	}
	if err := mm.Flush(); err != nil {
		t.Fatalf("flush after the move: %v", err)
	}
	if st := mm.Stats(); st.Follows == 0 || mm.Session.Moves() != 1 {
		t.Fatalf("the mapping did not follow: %d new connections, %d session moves", st.Follows, mm.Session.Moves())
	}
	got := make([]byte, len(b))
	if err := mm.Session.Read(ctx, client.ChannelBulk, got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != pattern(i, 0x5a) {
			t.Fatalf("the new place's byte %d is %d, want %d", i, got[i], pattern(i, 0x5a))
		}
	}
	moved, _ := cl.Lease(ctx, l.ID)
	if moved.NodeID == l.NodeID {
		t.Fatalf("the lease did not move: %+v", moved)
	}
	// Released, the lease is followed no more: once its region is gone a
	// request fails saying the lease ended, without waiting for a place
	// that will not come.
	if err := mm.Mapping.Close(); err != nil { // the session stays open
		t.Fatal(err)
	}
	if _, err := cl.ReleaseLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, "a request on the released lease's session fails as ended", func() bool {
		err := mm.Session.Read(ctx, client.ChannelSync, got[:4096], 0)
		return errors.Is(err, client.ErrEnded)
	})
}

// TestDrainNode drains a node lending a block lease, a stateless
// accelerator lease and a Wasm one: the block lease moves while written,
// the sha256 slot is placed again (the borrower told: an event, a new
// URI that answers), the Wasm slot is left in place and reported, its
// tenant told; the node stays cordoned and gets no new lease.
func TestDrainNode(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 3, Devices: moveDevices()})
	ctx := ctxT(t)
	cl := c.Client()
	target := c.Nodes[0]
	pin := []string{target.Name}
	blk, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20, Affinity: pin})
	if err != nil {
		t.Fatal(err)
	}
	sha, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256", Affinity: pin})
	if err != nil {
		t.Fatal(err)
	}
	wasm, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "wasm", RoleConfig: &api.RoleConfig{Module: wasmtest.EchoModule()}, Affinity: pin})
	if err != nil {
		t.Fatal(err)
	}
	w := attachWriter(ctx, t, cl, blk, 8<<20, nil)

	if _, err := c.ClientWithToken(TenantToken("nobody")).DrainNode(ctx, target.ID(), api.DrainRequest{}); err == nil {
		t.Error("a drain without an admin token")
	}
	d, err := cl.DrainNode(ctx, target.Name, api.DrainRequest{DeadlineSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	if d.State != api.DrainRunning || len(d.Leases) != 3 {
		t.Fatalf("drain started: %+v", d)
	}
	// The wasm lease never moves: once the others are off, the drain
	// ends, incomplete, before its deadline.
	Eventually(t, 90*time.Second, "the drain's end", func() bool {
		d, err = cl.NodeDrain(ctx, target.ID())
		return err == nil && d.State != api.DrainRunning
	})
	w.finish(t)
	if d.State != api.DrainIncomplete || d.FinishedAt.After(d.Deadline) {
		t.Fatalf("drain: %+v", d)
	}
	for _, e := range d.Leases {
		switch e.LeaseID {
		case wasm.ID:
			if e.State != api.DrainLeaseLeft || !strings.Contains(e.Reason, "wasm") {
				t.Errorf("the wasm lease: %+v", e)
			}
		default:
			if e.State != api.DrainLeaseDone {
				t.Errorf("lease %s: %+v", e.LeaseID, e)
			}
		}
	}
	// The re-placed slot answers at the lease's new URI.
	got, err := cl.Lease(ctx, sha.ID)
	if err != nil || got.NodeID == target.ID() || got.URI == sha.URI {
		t.Fatalf("the sha256 lease after the drain: %+v %v", got, err)
	}
	u, _ := accel.ParseURI(got.URI)
	conn, err := accel.Dial(ctx, u.Slots[0], []byte(u.Credential))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := conn.Call(ctx, "sum", []byte("abc"))
	conn.Close()
	if err != nil || !bytes.HasPrefix(sum, []byte{0xba, 0x78, 0x16, 0xbf}) {
		t.Fatalf("the re-placed slot: %x %v", sum, err)
	}
	if b, _ := cl.Lease(ctx, blk.ID); b.NodeID == target.ID() {
		t.Errorf("the block lease is still on the drained node")
	}
	// Events: the replaced slot, the lease left, the incomplete drain.
	evs := allEvents(ctx, t, cl)
	seen := map[string]bool{}
	for _, e := range evs {
		seen[e.Subject+" "+e.Type] = true
	}
	for _, want := range []string{sha.ID + " lease.replaced", wasm.ID + " lease.drain.left", target.ID() + " node.drain.incomplete", target.ID() + " node.cordoned"} {
		if !seen[want] {
			t.Errorf("no event %q", want)
		}
	}
	// Cordoned: nothing new lands on it, and it says why.
	if n, _ := cl.Node(ctx, target.ID()); !n.Cordoned {
		t.Error("the drained node is not cordoned")
	}
	if _, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Affinity: pin}); !api.IsCode(err, api.CodeInfeasible) || !strings.Contains(err.Error(), "cordoned") {
		t.Errorf("a lease on the cordoned node: %v", err)
	}
	if _, err := cl.UncordonNode(ctx, target.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Affinity: pin}); err != nil {
		t.Errorf("a lease on the uncordoned node: %v", err)
	}
	_ = context.Background
}

// TestDrainDeadline: a drain whose lease cannot move yet (no other
// lender has room) is given up at its deadline, the lease left in place
// and reported; without leases a drain ends drained at once.
func TestDrainDeadline(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: moveDevices()})
	ctx := ctxT(t)
	cl := c.Client()
	target, other := c.Nodes[0], c.Nodes[1]
	if _, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 40 << 20, Affinity: []string{other.Name}}); err != nil {
		t.Fatal(err)
	}
	big, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 40 << 20, Affinity: []string{target.Name}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := cl.DrainNode(ctx, target.ID(), api.DrainRequest{DeadlineSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, "the lease to be found unmovable for now", func() bool {
		d, err = cl.NodeDrain(ctx, target.ID())
		return err == nil && len(d.Leases) == 1 && strings.Contains(d.Leases[0].Reason, "cannot move yet")
	})
	c.Advance(2 * time.Minute)
	Eventually(t, 30*time.Second, "the drain's end", func() bool {
		d, err = cl.NodeDrain(ctx, target.ID())
		return err == nil && d.State != api.DrainRunning
	})
	if d.State != api.DrainIncomplete || d.Leases[0].State != api.DrainLeaseLeft || !strings.Contains(d.Leases[0].Reason, "deadline") {
		t.Fatalf("drain: %+v", d)
	}
	if l, _ := cl.Lease(ctx, big.ID); l.State != api.LeaseActive || l.NodeID != target.ID() {
		t.Fatalf("the lease left in place: %+v", l)
	}
	// The other node, once its lease is released, drains at once.
	ls, _ := cl.Leases(ctx)
	for _, l := range ls {
		if l.NodeID == other.ID() {
			cl.ReleaseLease(ctx, l.ID)
		}
	}
	if _, err := cl.DrainNode(ctx, other.Name, api.DrainRequest{}); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, "the empty node drained", func() bool {
		d, err = cl.NodeDrain(ctx, other.ID())
		return err == nil && d.State == api.DrainDone
	})
}

// TestMoveLeaseTLS: with a cluster CA, the control plane drives the
// lenders' transfers over mutual TLS like every other agent call, and the
// parts themselves cross over the data planes' TLS: a block lease's bytes
// to the new lender's nbds:// transfer export, a memory lease's (written
// by an attached borrower throughout, which follows it over TLS) to its
// rialto-mems:// region; the moved leases keep their TLS schemes.
func TestMoveLeaseTLS(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: moveDevices(), TLS: true})
	ctx := ctxT(t)
	cl := c.Client()
	cfg := dataTLS(t, c)
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(l.URI, "nbds://") {
		t.Fatalf("block lease URI %q is not nbds://", l.URI)
	}
	nc, err := nbd.DialURI(ctx, l.URI, nbd.WithTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("moved over mTLS "), 4096)
	if _, err := nc.WriteAtContext(ctx, want, 4096, true); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if _, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{}); err != nil {
		t.Fatal(err)
	}
	if ms := waitMoves(t, c, l.ID, 1); ms[0].State != api.MoveDone {
		t.Fatalf("move %+v", ms[0])
	}
	got, _ := cl.Lease(ctx, l.ID)
	if !strings.HasPrefix(got.URI, "nbds://") {
		t.Fatalf("moved block lease URI %q is not nbds://", got.URI)
	}
	nc, err = nbd.DialURI(ctx, got.URI, nbd.WithTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p := make([]byte, len(want))
	if _, err := nc.ReadAt(p, 4096); err != nil || !bytes.Equal(p, want) || got.NodeID == l.NodeID {
		t.Fatalf("the moved lease: %v (on %s, was %s)", err, got.NodeID, l.NodeID)
	}

	ml, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ml.URI, "rialto-mems://") {
		t.Fatalf("memory lease URI %q is not rialto-mems://", ml.URI)
	}
	w := attachWriter(ctx, t, cl, ml, 4<<20, cfg)
	if _, err := cl.MoveLease(ctx, ml.ID, api.MoveRequest{}); err != nil {
		t.Fatal(err)
	}
	ms := waitMoves(t, c, ml.ID, 1)
	w.finish(t)
	if ms[0].State != api.MoveDone {
		t.Fatalf("memory move %+v", ms[0])
	}
	if mg, _ := cl.Lease(ctx, ml.ID); mg.NodeID == ml.NodeID || !strings.HasPrefix(mg.URI, "rialto-mems://") {
		t.Errorf("the memory lease after its move: %+v", mg)
	}
}

// allEvents reads the whole event log, page after page.
func allEvents(ctx context.Context, t *testing.T, cl *api.Client) []api.Event {
	t.Helper()
	var all []api.Event
	var since int64
	for {
		evs, err := cl.Events(ctx, since)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			return all
		}
		all = append(all, evs...)
		since = evs[len(evs)-1].ID
	}
}

// TestMovedPartKeepsCaps moves a capped block lease: the lease record
// keeps its request's caps, and the destination enforces them (an IOPS
// cap of 20: 30 reads of its new URI take over a second; uncapped they
// take milliseconds).
func TestMovedPartKeepsCaps(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: moveDevices()})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, IOPSCap: 20, BandwidthCap: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := cl.Lease(ctx, l.ID); got.IOPSCap != 20 || got.BandwidthCap != 64<<20 {
		t.Fatalf("the lease record lost its caps: %+v", got)
	}
	if _, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{}); err != nil {
		t.Fatal(err)
	}
	if ms := waitMoves(t, c, l.ID, 1); ms[0].State != api.MoveDone {
		t.Fatalf("move %+v", ms[0])
	}
	moved, err := cl.Lease(ctx, l.ID)
	if err != nil || moved.NodeID == l.NodeID || moved.IOPSCap != 20 {
		t.Fatalf("after the move: %v %+v", err, moved)
	}
	vol, err := nbd.DialURI(ctx, moved.URI)
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	p := make([]byte, 4096)
	start := time.Now()
	for i := range 30 {
		if _, err := vol.ReadAt(p, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	// 30 requests at 20/s with a burst of 100 ms: at least 1.4 s.
	if d := time.Since(start); d < time.Second {
		t.Errorf("30 reads of the moved part took %v: its IOPS cap of 20 is gone", d)
	}
}

// TestMoveWholeLeaseToExclusiveDevice: the part of a whole-device lease
// moves onto an exclusive device named by --to (larger than it: the lease
// keeps its size), its bytes kept; a shared lease's part may not go there,
// and the refusal says why.
func TestMoveWholeLeaseToExclusiveDevice(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20}},
		Configure: func(i int, cfg *agent.Config) {
			if i == 1 {
				cfg.Devices = append(cfg.Devices, agent.DeviceConfig{Name: "ex0", Kind: api.KindBlock, Path: "ex0.img", Size: 24 << 20, Sharing: "exclusive"})
			}
		}})
	ctx := ctxT(t)
	cl := c.Client()
	devs, err := cl.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ex, disk0 api.Device
	for _, d := range devs {
		switch {
		case d.Name == "ex0":
			ex = d
		case d.Name == "disk0" && d.NodeID == c.Nodes[0].ID():
			disk0 = d
		}
	}
	whole, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Whole: true, Affinity: []string{disk0.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if whole.Mode != api.ModeDedicated || whole.Parts[0].Length != 16<<20 {
		t.Fatalf("whole lease: %+v", whole)
	}
	shared, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Affinity: []string{c.Nodes[1].ID()}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.MoveLease(ctx, shared.ID, api.MoveRequest{ToDevice: ex.ID})
	if !api.IsCode(err, api.CodeInvalid) || !strings.Contains(err.Error(), "exclusive (lent whole only)") {
		t.Fatalf("moving a shared lease onto an exclusive device: %v", err)
	}
	data := bytes.Repeat([]byte("whole device "), 4096)
	vol, err := nbd.DialURI(ctx, whole.URI)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vol.WriteAt(data, 5<<20); err != nil {
		t.Fatal(err)
	}
	if err := vol.Flush(); err != nil {
		t.Fatal(err)
	}
	vol.Close()
	if _, err := cl.MoveLease(ctx, whole.ID, api.MoveRequest{ToDevice: ex.ID}); err != nil {
		t.Fatal(err)
	}
	if ms := waitMoves(t, c, whole.ID, 1); ms[0].State != api.MoveDone {
		t.Fatalf("move %+v", ms[0])
	}
	got, err := cl.Lease(ctx, whole.ID)
	if err != nil {
		t.Fatal(err)
	}
	if p := got.Parts[0]; p.DeviceID != ex.ID || p.Offset != 0 || p.Length != 16<<20 || got.Size != whole.Size {
		t.Fatalf("after the move: %+v", got)
	}
	vol, err = nbd.DialURI(ctx, got.URI)
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	if vol.Size() != 16<<20 {
		t.Errorf("the moved lease serves %d bytes", vol.Size())
	}
	back := make([]byte, len(data))
	if _, err := vol.ReadAt(back, 5<<20); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("the moved lease's bytes: %v", err)
	}
	// The exclusive device is held whole: nothing else gets a part of it.
	if _, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Whole: true, Affinity: []string{ex.ID}}); !api.IsCode(err, api.CodeInfeasible) {
		t.Fatalf("a lease of the exclusive device a moved part holds: %v", err)
	}
}
