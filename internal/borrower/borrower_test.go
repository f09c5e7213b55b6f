package borrower

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/testcluster"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func devices() []agent.DeviceConfig {
	return []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
		{Name: "mem0", Kind: api.KindMemory, Size: 8 << 20},
		{Name: "accel0", Kind: api.KindAccel, Size: 3, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}
}

// countingSource is the control plane, counting the leases asked for.
type countingSource struct {
	LeaseSource
	asked atomic.Int64
}

func (s *countingSource) Lease(ctx context.Context, id string) (api.Lease, error) {
	s.asked.Add(1)
	return s.LeaseSource.Lease(ctx, id)
}

func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, seed+1))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func writeNBD(ctx context.Context, t *testing.T, uri string, data []byte, off int64) {
	t.Helper()
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.WriteAtContext(ctx, data, off, true); err != nil {
		t.Fatal(err)
	}
}

func readNBD(ctx context.Context, uri string, n int, off int64) ([]byte, error) {
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	b := make([]byte, n)
	if _, err := nc.ReadAtContext(ctx, b, off); err != nil {
		return nil, err
	}
	return b, nil
}

// A composed block lease attached as one NBD export: its stripes land on
// the parts in layout order, and when the lender of a part restarts with
// the part's port taken, the attachment asks the control plane (through
// the LeaseSource) and follows the part to its new address.
func TestAttachComposedFollowsMovedPart(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{Nodes: 3, Devices: devices()})
	ctx := ctxT(t)
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 3, Size: 3 << 20, StripeUnit: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := AttachParts(l); n != 3 || err != nil {
		t.Fatalf("AttachParts: %d, %v", n, err)
	}
	src := &countingSource{LeaseSource: c.Client()}
	att, err := Attach(ctx, src, l, AttachConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	if !strings.HasPrefix(att.URI(), "nbd://127.0.0.1:") || att.Volume().Size() < l.Size {
		t.Fatalf("attached at %s, %d bytes", att.URI(), att.Volume().Size())
	}
	want := randomBytes(3<<20, 1)
	writeNBD(ctx, t, att.URI(), want, 0)
	unit, err := readNBD(ctx, l.Parts[1].URI, 64<<10, 0)
	if err != nil || !bytes.Equal(unit, want[64<<10:128<<10]) {
		t.Fatalf("part 1 does not hold the second stripe unit: %v", err)
	}

	lender := c.NodeByID(l.Parts[0].NodeID)
	if lender == nil {
		t.Fatalf("no node serves part 0")
	}
	old, err := url.Parse(l.Parts[0].URI)
	if err != nil {
		t.Fatal(err)
	}
	lender.Kill()
	squatter, err := net.Listen("tcp", old.Host)
	if err != nil {
		t.Fatalf("taking part 0's address: %v", err)
	}
	defer squatter.Close()
	lender.Restart()
	c.Heartbeat()
	if moved := c.Lease(l.ID).Parts[0].URI; moved == l.Parts[0].URI {
		t.Fatal("part 0 kept its URI although its port was taken")
	}
	got, err := readNBD(ctx, att.URI(), len(want), 0)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("attachment after part 0 moved: %v (equal: %v)", err, bytes.Equal(got, want))
	}
	if src.asked.Load() == 0 {
		t.Error("the attachment never asked the control plane where the part went")
	}
}

// A lease of one part, served on a Unix socket: what is written through
// the attachment is on the lender.
func TestAttachOnePartOnUnixSocket(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, Devices: devices()})
	ctx := ctxT(t)
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "vol.sock")
	att, err := Attach(ctx, nil, l, AttachConfig{Listen: "unix:" + sock})
	if err != nil {
		t.Fatal(err)
	}
	u, err := nbd.ParseURI(att.URI())
	if err != nil || u.Network != "unix" || u.Address != sock {
		t.Fatalf("attached at %s (%v)", att.URI(), err)
	}
	msg := []byte("through a unix socket")
	writeNBD(ctx, t, att.URI(), msg, 4096)
	if err := att.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := readNBD(ctx, l.URI, len(msg), 4096)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("lender holds %q, %v", got, err)
	}
}

// A memory lease attached as an NBD export (remote memory as a swap-style
// block device): what is written over NBD is in the donor's region, read
// back over the memory protocol once the attachment has let go of it.
func TestAttachMemoryLease(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, Devices: devices()})
	ctx := ctxT(t)
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := AttachParts(l); n != 1 || err != nil {
		t.Fatalf("AttachParts: %d, %v", n, err)
	}
	att, err := Attach(ctx, c.Client(), l, AttachConfig{RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if att.Volume().Size() != 4<<20 {
		t.Errorf("export of %d bytes for a lease of %d", att.Volume().Size(), 4<<20)
	}
	want := randomBytes(256<<10, 2)
	writeNBD(ctx, t, att.URI(), want, 1<<20)
	if err := att.Close(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	testcluster.Eventually(t, 30*time.Second, "the donor holds the bytes written over NBD", func() bool {
		mc, err := DialMemory(ctx, l, 0, client.Options{Timeout: 5 * time.Second})
		if err != nil {
			return false // the donor has not seen the attachment's session end yet
		}
		defer mc.Close()
		return mc.Read(ctx, client.ChannelSync, got, 1<<20) == nil && bytes.Equal(got, want)
	})
}

// memLease is a memory lease record whose parts are the regions of child
// donors (a mapping's donor must run in another process).
func memLease(t *testing.T, parts int) api.Lease {
	l := api.Lease{ID: "lease-mem", Kind: api.KindMemory, State: api.LeaseActive}
	for range parts {
		_, addr := memorytest.StartChild(t, 2<<20)
		l.Parts = append(l.Parts, api.Part{URI: protocol.URI{Address: addr, Credential: memorytest.Credential}.String()})
	}
	return l
}

// A memory lease mapped into the process: bytes written through the
// mapping reach the donor when the mapping closes.
func TestMapMemory(t *testing.T) {
	t.Parallel()
	l := memLease(t, 1)
	ctx := ctxT(t)
	m, err := MapMemory(ctx, nil, l, 0, client.Options{}, mapping.Options{})
	if errors.Is(err, mapping.ErrUffdUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	want := randomBytes(len(m.Bytes()), 3)
	copy(m.Bytes(), want)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	testcluster.Eventually(t, 30*time.Second, "the donor holds the bytes written through the mapping", func() bool {
		c, err := DialMemory(ctx, l, 0, client.Options{})
		if err != nil {
			return false
		}
		defer c.Close()
		return c.Read(ctx, client.ChannelBulk, got, 0) == nil && bytes.Equal(got, want)
	})
	if _, err := MapMemory(ctx, nil, l, 1, client.Options{}, mapping.Options{}); err == nil || !strings.Contains(err.Error(), "has 1 part(s)") {
		t.Errorf("MapMemory of a part the lease lacks: %v", err)
	}
}

// Memtest runs over every part of a lease; a part that fails its steps
// does not stop the others, a donor that refuses the session stops it.
func TestMemtestLease(t *testing.T) {
	t.Parallel()
	l := memLease(t, 2)
	ctx := ctxT(t)
	parts, err := MemtestLease(ctx, nil, l, 256<<10, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 2 {
		t.Fatalf("%d parts tested", len(parts))
	}
	for _, p := range parts {
		if p.Err != nil || len(p.Steps) != 5 {
			t.Errorf("part %d: %d steps, %v", p.Part, len(p.Steps), p.Err)
		}
	}
	u, _ := protocol.ParseURI(l.Parts[1].URI)
	u.Credential = "rlc_not-the-credential.1"
	l.Parts[1].URI = u.String()
	parts, err = MemtestLease(ctx, nil, l, 64<<10, 0, nil)
	if !errors.Is(err, protocol.ErrAuth) || !strings.HasPrefix(err.Error(), "lease lease-mem part 1: ") || len(parts) != 1 {
		t.Fatalf("a refused part 1: %d parts, %v", len(parts), err)
	}
	if strings.Contains(err.Error(), u.Credential) {
		t.Errorf("the error shows the credential: %v", err)
	}
}

// A dedicated accelerator lease's slots and a shared lease's gateway are
// dialled and run the lease's role.
func TestDialAccel(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, Devices: devices()})
	ctx := ctxT(t)
	ded, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	shared, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256([]byte("abc"))
	for _, tc := range []struct {
		l      api.Lease
		slots  int
		shared bool
	}{{ded, 2, false}, {shared, 1, true}} {
		slots, err := AccelSlots(tc.l)
		if err != nil || len(slots) != tc.slots {
			t.Fatalf("lease %s: %d slots, want %d (%v)", tc.l.ID, len(slots), tc.slots, err)
		}
		for i, s := range slots {
			if s.Shared() != tc.shared {
				t.Errorf("lease %s slot %d: shared %v", tc.l.ID, i, s.Shared())
			}
			conn, err := DialAccel(ctx, s, nil)
			if err != nil {
				t.Fatalf("lease %s slot %d: %v", tc.l.ID, i, err)
			}
			sum, err := conn.Call(ctx, "sum", []byte("abc"))
			role := conn.Info().Role
			conn.Close()
			if err != nil || role != "sha256" || !bytes.Equal(sum, want[:]) {
				t.Errorf("lease %s slot %d runs %q: %x, %v", tc.l.ID, i, role, sum, err)
			}
		}
	}
	s := AccelSlot{Address: "127.0.0.1:1", Credential: "rlc_wrong"}
	if conn, err := DialAccel(ctx, s, nil); err == nil {
		conn.Close()
		t.Error("dialled a closed port")
	}
}
