package agent

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/api"
)

// TestFreshStateDirWipesExistingDevices: an agent started on a fresh state
// directory (no identity.json, no exports.json) whose block device file
// already exists, holding a tenant's bytes of a run on another state
// directory, wipes the file in full before it serves anything and joins
// saying its exports are lost; a device file it creates is not wiped. A
// restart on the same, no longer fresh, state directory wipes nothing and
// says nothing is lost.
func TestFreshStateDirWipesExistingDevices(t *testing.T) {
	r, cfg, secret := withTenant(t, 4096, 0x5a)
	old := cfg.StateDir
	r.halt(t)
	if !bytes.Equal(diskBytes(t, old, 4096, leaseSize), secret) {
		t.Fatal("the tenant's bytes are not on the device")
	}

	f, srv := newFakeCP(t)
	cfg.ControlPlane = srv.URL
	cfg.StateDir = t.TempDir()
	disk := filepath.Join(old, "disk0.img")
	cfg.Devices = []DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: disk, Size: 1 << 20},
		{Name: "disk1", Kind: api.KindBlock, Path: "disk1.img", Size: 1 << 20}, // created now
	}
	r = start(t, cfg)
	if got := diskBytes(t, old, 0, 1<<20); !bytes.Equal(got, make([]byte, 1<<20)) {
		t.Fatal("the device keeps the previous tenant's bytes")
	}
	if n := testutil.ToFloat64(r.a.mWipes.WithLabelValues("ok")); n != 1 {
		t.Fatalf("%v wipes, want 1 (the existing file only)", n)
	}
	if w := journal(t, cfg.StateDir); len(w) != 0 {
		t.Fatalf("journal after the start: %+v", w)
	}
	f.mu.Lock()
	joins := append([]api.JoinRequest(nil), f.joins...)
	f.mu.Unlock()
	if len(joins) != 1 || !joins[0].LostExports {
		t.Fatalf("joins %+v, want one saying lost_exports", joins)
	}
	var id identity
	if err := readJSON(filepath.Join(cfg.StateDir, identityFile), &id); err != nil || id.LostExports || id.NodeID == "" {
		t.Fatalf("identity after the join: %+v (%v)", id, err)
	}

	// A lease served now, then a restart with the state kept: the bytes stay.
	secret = bytes.Repeat([]byte{0x6b}, leaseSize)
	nbdWrite(t, prepareBlock(t, r.a, "lease-b", 8192, leaseSize), secret, 0)
	r.halt(t)
	r = start(t, cfg)
	if !bytes.Equal(diskBytes(t, old, 8192, leaseSize), secret) {
		t.Fatal("a restart on the kept state directory wiped a served lease's bytes")
	}
	if n := testutil.ToFloat64(r.a.mWipes.WithLabelValues("ok")); n != 0 {
		t.Fatalf("%v wipes after a restart with the state kept, want 0", n)
	}
	f.mu.Lock()
	last := f.joins[len(f.joins)-1]
	f.mu.Unlock()
	if last.LostExports {
		t.Fatal("a restart with the state kept said its exports were lost")
	}
}
