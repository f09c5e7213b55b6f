package testcluster

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
)

// TestWipeLostExportsLosesLeases: an agent restarted with
// --wipe-lost-exports after its exports.json became unreadable wiped its
// devices without knowing which leases they held; its join tells the
// control plane, which records every lease with a part on the node lost
// (not left active with nothing serving it). The next restart (the file
// readable again) loses nothing: the lease made since stays active.
func TestWipeLostExportsLosesLeases(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
	}})
	cl := c.Client()
	before := createBlock(t, cl, 1<<20, api.ModeDedicated)
	lender := c.Nodes[0]
	lender.Kill()
	dir := lender.cfg.StateDir
	if err := os.WriteFile(filepath.Join(dir, "exports.json"), []byte(`[{"lease_id":`), 0o600); err != nil {
		t.Fatal(err)
	}
	lender.cfg.WipeLostExports = true
	lender.Launch()
	lender.WaitReady()

	got := c.Lease(before.ID)
	if got.State != api.LeaseLost || !strings.Contains(got.Reason, "lost the record of its exports") {
		t.Fatalf("the lease after its lender wiped its lost exports: %s (%q), want lost", got.State, got.Reason)
	}
	var id struct {
		LostExports bool `json:"lost_exports"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "identity.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &id); err != nil || id.LostExports {
		t.Fatalf("identity.json after the join: lost_exports %v (%v), want it cleared", id.LostExports, err)
	}

	after := createBlock(t, cl, 1<<20, api.ModeDedicated)
	lender.Restart()
	if s := c.Lease(after.ID).State; s != api.LeaseActive || !lender.Serves(after.ID) {
		t.Fatalf("a lease made after the wipe, after the next restart: %s", s)
	}
}

// TestWipeLostExportsPrepareBeforeJoin: an agent restarted with
// --wipe-lost-exports serves its API (with the agent key of its last run)
// before its join tells the control plane that its exports are lost. A
// lease the control plane places on the node meanwhile (it still counts
// the node ready) must not be made active there only to be lost by that
// join: the agent takes no lease call until its join has been answered.
func TestWipeLostExportsPrepareBeforeJoin(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
	}})
	cl := c.Client()
	before := createBlock(t, cl, 1<<20, api.ModeShared)
	lender := c.Nodes[0]
	lender.Kill()
	if err := os.WriteFile(filepath.Join(lender.cfg.StateDir, "exports.json"), []byte(`[{"lease_id":`), 0o600); err != nil {
		t.Fatal(err)
	}
	lender.cfg.WipeLostExports = true
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hold := func(ctx context.Context) {
		once.Do(func() {
			close(reached)
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
	}
	lender.LaunchWith(func(a *agent.Agent) { a.Faults.BeforeJoin.Store(&hold) })
	<-reached

	during, err := cl.CreateLease(ctxT(t), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Mode: api.ModeShared})
	t.Logf("create while the join is held: %+v %v", during.State, err)
	close(release)
	lender.WaitReady()

	if got := c.Lease(before.ID); got.State != api.LeaseLost {
		t.Fatalf("the lease of the wiped exports: %s (%q), want lost", got.State, got.Reason)
	}
	if err == nil && during.State == api.LeaseActive {
		if got := c.Lease(during.ID); got.State != api.LeaseActive {
			t.Fatalf("a lease made active on the node before its join said its exports were lost: %s (%q) after the join, want active", got.State, got.Reason)
		}
	}
	after := createBlock(t, cl, 1<<20, api.ModeShared)
	if s := c.Lease(after.ID).State; s != api.LeaseActive {
		t.Fatalf("a lease made after the join: %s", s)
	}
}
