package testcluster

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
)

// TestFreshStateDirWipesDevices: an agent restarted with a fresh state
// directory (no identity.json, no exports.json: a state dir on tmpfs, or
// the default relative one from another working directory) but the same
// machine and the same persistent block device no longer knows which of
// the device's ranges hold a tenant's bytes. It wipes the device before
// it serves anything; holding no credential of the node, it joins once
// the node is down (its leases recorded lost: nothing serves them), not
// while it is ready; bob's lease on alice's range reads zeroes.
func TestFreshStateDirWipesDevices(t *testing.T) {
	t.Parallel()
	disk := filepath.Join(t.TempDir(), "disk0.img") // outside the state dir: it stays
	lostStateNextTenantReadsZeroes(t, disk, "its lender came back without its state", func(n *Node) {
		n.cfg.StateDir = filepath.Join(t.TempDir(), "fresh")
	})
}

// TestMissingExportsRecordWipesDevices: an agent restarted with its
// identity.json but without its exports.json (deleted) rejoins as the same
// node but no longer knows which ranges hold a tenant's bytes; alice's
// release then tears down an export it does not know, which it cannot
// wipe. So the start wipes the device before it serves anything and has
// the control plane record the node's leases lost: bob's lease on alice's
// range reads zeroes.
func TestMissingExportsRecordWipesDevices(t *testing.T) {
	t.Parallel()
	lostStateNextTenantReadsZeroes(t, "disk0.img", "its lender lost its exports record", func(n *Node) {
		if err := os.Remove(filepath.Join(n.cfg.StateDir, "exports.json")); err != nil {
			t.Fatal(err)
		}
	})
}

// TestEarlierVersionMissingExportsRecordWipesDevices: the state directory
// an earlier version left (identity.json without exports_kept: it wrote
// exports.json only at its first export) whose exports.json was deleted
// before the upgrade: identity only, alice's bytes on the device. The
// start cannot tell it from a node that never had an export, so it takes
// the record for lost: it wipes the device and has alice's lease recorded
// lost, and bob's lease on her range reads zeroes.
func TestEarlierVersionMissingExportsRecordWipesDevices(t *testing.T) {
	t.Parallel()
	lostStateNextTenantReadsZeroes(t, "disk0.img", "its lender, upgraded, lost its exports record", func(n *Node) {
		if err := os.Remove(filepath.Join(n.cfg.StateDir, "exports.json")); err != nil {
			t.Fatal(err)
		}
		// What the earlier version wrote: the identity without the
		// marker (the only field it lacked).
		path := filepath.Join(n.cfg.StateDir, "identity.json")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var id map[string]any
		if err := json.Unmarshal(b, &id); err != nil {
			t.Fatal(err)
		}
		if id["exports_kept"] != true {
			t.Fatalf("identity.json %s: no exports_kept to take away", b)
		}
		delete(id, "exports_kept")
		if b, err = json.Marshal(id); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	})
}

// lostStateNextTenantReadsZeroes: alice fills a dedicated lease on the
// one node's device at path; the node is killed, lose takes away what it
// knew of its exports, and it is started again. It must rejoin as the same
// node (at once with its identity.json, once the node is down without
// it) with alice's lease recorded lost (what says how it lost its state),
// and bob's lease on alice's range, after her release, must read zeroes.
func lostStateNextTenantReadsZeroes(t *testing.T, path, what string, lose func(n *Node)) {
	t.Helper()
	const dev = 8 << 20
	c := Start(t, Options{Nodes: 1, Tenants: []string{"alice", "bob"},
		Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: path, Size: dev}}})
	ctx := ctxT(t)
	alice, bob := c.ClientWithToken(TenantToken("alice")), c.ClientWithToken(TenantToken("bob"))
	req := api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, Size: dev}
	la, err := alice.CreateLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	fillParts(ctx, t, la, "alice")

	n := c.Nodes[0]
	id := n.ID()
	n.Kill()
	lose(n)
	reason := "lost the record of its exports"
	if _, err := os.Stat(filepath.Join(n.cfg.StateDir, "identity.json")); errors.Is(err, fs.ErrNotExist) {
		// Without its identity the agent has no credential to prove it is
		// the node's: it joins once the node is down (whose leases the
		// sweep recorded lost).
		launchRefused(t, c, n, id)
		reason = "is down"
	} else {
		n.Launch()
		n.WaitReady()
	}
	if got := n.ID(); got != id {
		t.Fatalf("the node rejoined as %s, not %s (same machine)", got, id)
	}
	if got := c.Lease(la.ID); got.State != api.LeaseLost || !strings.Contains(got.Reason, reason) {
		t.Fatalf("alice's lease after %s: %s (%q), want lost", what, got.State, got.Reason)
	}

	// Alice releases what she holds (a lost lease is ended already; the
	// agent tears down an export it does not know).
	if _, err := alice.ReleaseLease(ctx, la.ID); err != nil && !isConflict(err) {
		t.Fatal(err)
	}
	c.Heartbeat()
	lb, err := bob.CreateLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(partRanges(lb), partRanges(la)) {
		t.Fatalf("bob's lease %v is not on alice's ranges %v", partRanges(lb), partRanges(la))
	}
	if k := leakedBlocks(ctx, t, lb); k != 0 {
		t.Fatalf("bob reads %d of alice's 4 KiB blocks", k)
	}
}

// TestFreshStateDirNewDeviceFilesLosesLeases: with the device inside the
// state directory (a relative path), a fresh state directory brings a new,
// empty device file: no bytes can leak, but the old leases' ranges are in
// the old file, which nothing serves. The agent joins once the node is
// down (it holds no credential of the node), its leases recorded lost
// rather than left active.
func TestFreshStateDirNewDeviceFilesLosesLeases(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
	}})
	cl := c.Client()
	before := createBlock(t, cl, 1<<20, api.ModeShared)
	n := c.Nodes[0]
	id := n.ID()
	n.Kill()
	n.cfg.StateDir = filepath.Join(t.TempDir(), "fresh")
	launchRefused(t, c, n, id) // no credential: it joins once the node is down
	if got := c.Lease(before.ID); got.State != api.LeaseLost {
		t.Fatalf("a lease of the node after it came back without its state: %s (%q), want lost", got.State, got.Reason)
	}
	after := createBlock(t, cl, 1<<20, api.ModeShared)
	n.Restart()
	if s := c.Lease(after.ID).State; s != api.LeaseActive || !n.Serves(after.ID) {
		t.Fatalf("a lease made after the fresh start, after a restart with the state kept: %s", s)
	}
}

// isConflict reports whether err is the API's conflict error.
func isConflict(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae) && ae.Code == api.CodeConflict
}
