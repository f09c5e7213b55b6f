package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	memclient "github.com/rialto-project/rialto/internal/dataplane/memory/client"
)

// partURIs are a lease's data-plane URIs, one per part.
func partURIs(l api.Lease) []string {
	var out []string
	for _, p := range l.Parts {
		out = append(out, p.URI)
	}
	if len(out) == 1 && out[0] == "" {
		out[0] = l.URI
	}
	return out
}

// partRanges are a lease's parts as "node/device@offset+length".
func partRanges(l api.Lease) []string {
	var out []string
	for _, p := range l.Parts {
		out = append(out, fmt.Sprintf("%s/%s@%d+%d", p.NodeID, p.DeviceID, p.Offset, p.Length))
	}
	slices.Sort(out)
	return out
}

// nonZeroBlocks counts the 4 KiB blocks of b that hold a non-zero byte.
func nonZeroBlocks(b []byte) int {
	n := 0
	zero := make([]byte, 4096)
	for off := 0; off < len(b); off += 4096 {
		if !bytes.Equal(b[off:min(off+4096, len(b))], zero[:min(4096, len(b)-off)]) {
			n++
		}
	}
	return n
}

// fillParts writes a tenant's pattern over every byte of every part.
func fillParts(ctx context.Context, t *testing.T, l api.Lease, tenant string) {
	t.Helper()
	for i, uri := range partURIs(l) {
		nc, err := nbd.DialURI(ctx, uri)
		if err != nil {
			t.Fatalf("part %d: %v", i, err)
		}
		pat := bytes.Repeat([]byte(tenant+" secret "), int(nc.Size())/len(tenant)+1)[:nc.Size()]
		if _, err := nc.WriteAtContext(ctx, pat, 0, true); err != nil {
			t.Fatalf("part %d: write: %v", i, err)
		}
		nc.Close()
	}
}

// leakedBlocks reads every part of l whole and counts its non-zero blocks.
func leakedBlocks(ctx context.Context, t *testing.T, l api.Lease) int {
	t.Helper()
	leaked := 0
	for i, uri := range partURIs(l) {
		nc, err := nbd.DialURI(ctx, uri)
		if err != nil {
			t.Fatalf("part %d: %v", i, err)
		}
		b := make([]byte, nc.Size())
		if _, err := nc.ReadAtContext(ctx, b, 0); err != nil {
			t.Fatalf("part %d: read: %v", i, err)
		}
		nc.Close()
		leaked += nonZeroBlocks(b)
	}
	return leaked
}

// dataExtents reads every part of l's block status and returns the
// extents that are not reported hole and zero, as "part N [off,+len)".
func dataExtents(ctx context.Context, t *testing.T, l api.Lease) []string {
	t.Helper()
	var out []string
	for i, uri := range partURIs(l) {
		nc, err := nbd.DialURI(ctx, uri)
		if err != nil {
			t.Fatalf("part %d: %v", i, err)
		}
		const want = nbd.StateHole | nbd.StateZero
		for off := int64(0); off < nc.Size(); { // an answer may cover less than asked
			ext, err := nc.ExtentsContext(ctx, off, nc.Size()-off)
			if err != nil {
				t.Fatalf("part %d: block status: %v", i, err)
			}
			for _, e := range ext {
				if e.Flags&want != want {
					out = append(out, fmt.Sprintf("part %d [%d,+%d) flags %#x", i, off, e.Length, e.Flags))
				}
				off += e.Length
			}
		}
		nc.Close()
	}
	return out
}

// lenders are the cluster nodes serving l's parts.
func lenders(c *Cluster, l api.Lease) []*Node {
	var out []*Node
	for _, p := range l.Parts {
		if n := c.NodeByID(p.NodeID); n != nil && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// TestNextTenantReadsOnlyZeroes: a block range returns to the pool wiped.
// Tenant alice fills a dedicated, a shared or a composed lease whose parts
// are whole devices, and her lease ends by release, by expiry or by the
// loss of a lender: partitioned (its heartbeats paused, the agent alive),
// or killed (its Run cancelled, no teardown: exports.json and the device
// files stay as they were) and restarted on the same state dir and device
// files once the control plane declared the lease lost. Bob's next lease
// lands on the same ranges and reads zeroes in every 4 KiB block, and its
// block status reports every part as one hole reading as zeroes (the wipe
// punched holes: nbdcopy and qemu-img skip them).
func TestNextTenantReadsOnlyZeroes(t *testing.T) {
	t.Parallel()
	const dev = 4 << 20
	modes := []struct {
		mode  api.Mode
		nodes int
		count int
	}{
		{api.ModeDedicated, 1, 1},
		{api.ModeShared, 1, 1},
		{api.ModeComposed, 3, 3},
	}
	for _, m := range modes {
		for _, end := range []string{"release", "expiry", "node loss", "node killed"} {
			t.Run(string(m.mode)+"/"+end, func(t *testing.T) {
				t.Parallel()
				c := Start(t, Options{Nodes: m.nodes, Tenants: []string{"alice", "bob"},
					Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: dev}}})
				ctx := ctxT(t)
				alice, bob := c.ClientWithToken(TenantToken("alice")), c.ClientWithToken(TenantToken("bob"))
				req := api.LeaseRequest{Kind: api.KindBlock, Mode: m.mode, Size: int64(m.count) * dev, Count: m.count}
				if m.count == 1 {
					req.Count = 0
				}
				if end == "expiry" {
					req.TTLSeconds = 60
				}
				la, err := alice.CreateLease(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				fillParts(ctx, t, la, "alice")

				switch end {
				case "release":
					if _, err := alice.ReleaseLease(ctx, la.ID); err != nil {
						t.Fatal(err)
					}
				case "expiry":
					c.Advance(61 * time.Second)
					c.Heartbeat() // the lenders stay ready
					c.Sweep()
					if s := c.Lease(la.ID).State; s != api.LeaseExpired {
						t.Fatalf("lease after its TTL: %s", s)
					}
				case "node loss":
					victim := c.NodeByID(la.Parts[0].NodeID)
					victim.PauseHeartbeats(true)
					c.Advance(11 * time.Second)
					c.Heartbeat() // the others stay ready
					c.Sweep()
					if s := c.Lease(la.ID).State; s != api.LeaseLost {
						t.Fatalf("lease of a lost lender: %s", s)
					}
					victim.PauseHeartbeats(false)
					c.Eventually("the lost lease torn down when its lender is back", func() bool {
						c.Heartbeat()
						return !victim.Serves(la.ID)
					})
				case "node killed":
					victim := c.NodeByID(la.Parts[0].NodeID)
					victim.Kill()
					c.Advance(11 * time.Second)
					c.Heartbeat() // the others stay ready
					c.Sweep()
					if s := c.Lease(la.ID).State; s != api.LeaseLost {
						t.Fatalf("lease of a killed lender: %s", s)
					}
					// The killed agent's part is still in its state dir,
					// alice's bytes on its device file.
					disk, err := os.ReadFile(filepath.Join(victim.StateDir, "disk0.img"))
					if err != nil {
						t.Fatal(err)
					}
					if nonZeroBlocks(disk) != dev/4096 {
						t.Fatal("the killed lender's device does not hold alice's bytes: the kill tore the lease down")
					}
					victim.Restart() // ready: the control plane's first answer applied
					if victim.Serves(la.ID) {
						t.Fatal("the restarted lender keeps the lost lease after the control plane's first answer")
					}
				}
				for _, n := range lenders(c, la) {
					c.Eventually("alice's exports torn down", func() bool { c.Heartbeat(); return !n.Serves(la.ID) })
				}

				bobReq := req
				bobReq.TTLSeconds = 0
				lb, err := bob.CreateLease(ctx, bobReq)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(partRanges(lb), partRanges(la)) {
					t.Fatalf("bob's lease %v is not on alice's ranges %v", partRanges(lb), partRanges(la))
				}
				if n := leakedBlocks(ctx, t, lb); n != 0 {
					t.Fatalf("bob reads %d of alice's 4 KiB blocks", n)
				}
				if d := dataExtents(ctx, t, lb); len(d) != 0 {
					t.Fatalf("bob's fresh lease is not reported hole and zero: %v", d)
				}
			})
		}
	}
}

// TestNextTenantMemoryAndSlotsZero: memory regions and accelerator slots
// are wiped between leases too: bob's lease of the memory alice filled,
// and of the only slot alice wrote, reads zeroes.
func TestNextTenantMemoryAndSlotsZero(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Tenants: []string{"alice", "bob"}, Devices: []agent.DeviceConfig{
		{Name: "mem0", Kind: api.KindMemory, Size: 1 << 20},
		{Name: "accel0", Kind: api.KindAccel, Size: 1, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}})
	ctx := ctxT(t)
	alice, bob := c.ClientWithToken(TenantToken("alice")), c.ClientWithToken(TenantToken("bob"))
	secret := bytes.Repeat([]byte("alice secret "), 5000)

	memLease := func(cl *api.Client) (api.Lease, *memclient.Client) {
		l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		mc, err := memclient.Dial(ctx, mustURL(t, l.URI).Host, strings.TrimPrefix(mustURL(t, l.URI).Path, "/"), memclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return l, mc
	}
	la, mc := memLease(alice)
	if err := mc.Write(ctx, memclient.ChannelBulk, secret, 0); err != nil {
		t.Fatal(err)
	}
	mc.Close()
	if _, err := alice.ReleaseLease(ctx, la.ID); err != nil {
		t.Fatal(err)
	}
	_, mc = memLease(bob)
	got := make([]byte, len(secret))
	if err := mc.Read(ctx, memclient.ChannelBulk, got, 0); err != nil {
		t.Fatal(err)
	}
	mc.Close()
	if n := nonZeroBlocks(got); n != 0 {
		t.Fatalf("bob's memory lease reads %d of alice's 4 KiB blocks", n)
	}

	slotLease := func(cl *api.Client) (api.Lease, *accel.Conn) {
		l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"})
		if err != nil {
			t.Fatal(err)
		}
		u := mustURL(t, l.URI)
		conn, err := accel.Dial(ctx, u.Host, []byte(strings.TrimPrefix(u.Path, "/")))
		if err != nil {
			t.Fatal(err)
		}
		return l, conn
	}
	la, conn := slotLease(alice)
	if err := conn.WriteMem(ctx, 0, secret); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if _, err := alice.ReleaseLease(ctx, la.ID); err != nil {
		t.Fatal(err)
	}
	lb, conn := slotLease(bob)
	defer conn.Close()
	if lb.Parts[0].Offset != la.Parts[0].Offset {
		t.Fatalf("bob's slot %d is not alice's %d", lb.Parts[0].Offset, la.Parts[0].Offset)
	}
	got, err := conn.ReadMem(ctx, 0, uint32(len(secret)))
	if err != nil {
		t.Fatal(err)
	}
	if n := nonZeroBlocks(got); n != 0 {
		t.Fatalf("bob's slot reads %d of alice's 4 KiB blocks", n)
	}
}

// TestCrashMidWipeLeavesRangeUnlendable: a lender that stops in the middle
// of wiping a released lease's range lends it to no one (the next lease
// waits for the wipe, Options.WipeWait, then finds no room: the range is
// still being wiped) until, restarted, it has finished the wipe; the next
// tenant then reads zeroes.
func TestCrashMidWipeLeavesRangeUnlendable(t *testing.T) {
	t.Parallel()
	const dev = 4 << 20
	c := Start(t, Options{Nodes: 1, Tenants: []string{"alice", "bob"},
		Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: dev}}})
	ctx := ctxT(t)
	alice, bob := c.ClientWithToken(TenantToken("alice")), c.ClientWithToken(TenantToken("bob"))
	req := api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, Size: dev}
	la, err := alice.CreateLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	fillParts(ctx, t, la, "alice")
	lender := c.Nodes[0]
	lender.Faults().CrashMidWipe.Store(true)
	if _, err := alice.ReleaseLease(ctx, la.ID); err != nil {
		t.Fatal(err)
	}
	disk, err := os.ReadFile(filepath.Join(lender.StateDir, "disk0.img"))
	if err != nil {
		t.Fatal(err)
	}
	if z := nonZeroBlocks(disk); z == 0 || z == dev/4096 {
		t.Fatalf("%d of %d blocks still alice's: the wipe did not stop half-way", z, dev/4096)
	}
	if _, err := bob.CreateLease(ctx, req); err == nil {
		t.Fatal("a range whose wipe did not finish was lent")
	} else if !strings.Contains(err.Error(), "is still being wiped after an earlier lease") {
		t.Fatalf("bob's lease failed for another reason than the unfinished wipe: %v", err)
	}
	lender.Restart() // a new agent, without the fault
	lb, err := bob.CreateLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if n := leakedBlocks(ctx, t, lb); n != 0 {
		t.Fatalf("bob reads %d of alice's 4 KiB blocks", n)
	}
}

// TestRestartedAgentRefusesLostLease: an agent restarted after the control
// plane declared its lease lost, while the control plane is down, refuses
// the lease's export from the very first request; once the control plane
// is back the lease is torn down and its range wiped, never served.
func TestRestartedAgentRefusesLostLease(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Tenants: []string{"alice"},
		Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20}}})
	ctx := ctxT(t)
	alice := c.ClientWithToken(TenantToken("alice"))
	l, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	fillParts(ctx, t, l, "alice")
	lender := c.Nodes[0]
	lender.Kill()
	c.Eventually("the killed lender's lease lost", func() bool {
		c.Advance(11 * time.Second)
		c.Sweep()
		return c.Lease(l.ID).State == api.LeaseLost
	})

	c.StopControlPlane()
	lender.Launch()
	addr := mustURL(t, l.URI).Host
	// The port may take connections (the kernel's backlog) before the
	// agent serves; the NBD answers below come only once it serves, and it
	// serves only after it holds the exports it restored (agent.Run).
	Eventually(t, 15*time.Second, "the restarted lender's data plane", func() bool {
		nc, err := net.Dial("tcp", addr)
		if err == nil {
			nc.Close()
		}
		return err == nil
	})
	for range 3 {
		if nc, err := nbd.DialURI(ctx, l.URI); !errors.Is(err, nbd.ErrExportNotFound) {
			if err == nil {
				nc.Close()
			}
			t.Fatalf("a lost lease's export with the control plane down: %v, want unknown export", err)
		}
	}
	if !lender.Serves(l.ID) {
		t.Fatal("the restarted lender serves its data plane without holding the restored export, or dropped it before the control plane said so")
	}

	c.StartControlPlane()
	lender.WaitReady()
	if lender.Serves(l.ID) {
		t.Fatal("the lost lease is still held after the control plane answered")
	}
	if nc, err := nbd.DialURI(ctx, l.URI); err == nil {
		nc.Close()
		t.Fatal("the lost lease's export is served")
	}
	p := l.Parts[0]
	disk, err := os.ReadFile(filepath.Join(lender.StateDir, "disk0.img"))
	if err != nil {
		t.Fatal(err)
	}
	if n := nonZeroBlocks(disk[p.Offset : p.Offset+p.Length]); n != 0 {
		t.Fatalf("%d blocks of the lost lease's range not wiped", n)
	}
}
