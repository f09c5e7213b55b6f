package agent

import (
	"bytes"
	"encoding/json"
	"os"
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

// joinsOf is the joins the fake control plane received.
func joinsOf(f *fakeCP) []api.JoinRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]api.JoinRequest(nil), f.joins...)
}

// TestMissingExportsRecordWipes: an agent whose identity.json was kept but
// whose exports.json was deleted (with a tenant's lease served from
// disk0) does not take itself for an agent that lends nothing: it wipes
// the device before it serves anything and joins saying its exports are
// lost, as a fresh one does, and keeps the record from then on. So does
// an agent that never had an export: its first start wrote the file,
// empty.
func TestMissingExportsRecordWipes(t *testing.T) {
	f, srv := newFakeCP(t)
	cfg := testConfig(srv.URL, t.TempDir())
	r := start(t, cfg)
	secret := bytes.Repeat([]byte{0x5a}, leaseSize)
	nbdWrite(t, prepareBlock(t, r.a, "lease-a", 4096, leaseSize), secret, 0)
	r.halt(t)
	if !bytes.Equal(diskBytes(t, cfg.StateDir, 4096, leaseSize), secret) {
		t.Fatal("the tenant's bytes are not on the device")
	}
	exports := filepath.Join(cfg.StateDir, exportsFile)
	if err := os.Remove(exports); err != nil {
		t.Fatal(err)
	}

	r = start(t, cfg)
	if got := diskBytes(t, cfg.StateDir, 0, 1<<20); !bytes.Equal(got, make([]byte, 1<<20)) {
		t.Fatal("the device keeps the tenant's bytes after a start that lost the exports record")
	}
	if n := testutil.ToFloat64(r.a.mWipes.WithLabelValues("ok")); n != 1 {
		t.Fatalf("%v wipes, want 1", n)
	}
	if j := joinsOf(f); !j[len(j)-1].LostExports {
		t.Fatal("the join after the exports record was lost did not say lost_exports")
	}
	if len(r.a.Leases()) != 0 {
		t.Fatalf("leases %v", r.a.Leases())
	}
	var saved []persistedExport
	if err := readJSON(exports, &saved); err != nil || len(saved) != 0 {
		t.Fatalf("exports.json after the start: %+v (%v)", saved, err)
	}
	if _, err := os.Stat(exports); err != nil {
		t.Fatalf("exports.json not written again: %v", err)
	}

	// A restart with the (empty) record kept loses nothing.
	r.halt(t)
	r = start(t, cfg)
	if n := testutil.ToFloat64(r.a.mWipes.WithLabelValues("ok")); n != 0 {
		t.Fatalf("%v wipes after a restart with the record kept, want 0", n)
	}
	if j := joinsOf(f); j[len(j)-1].LostExports {
		t.Fatal("a restart with the record kept said its exports were lost")
	}

	// An agent that never had an export: its record is there, empty, and
	// losing it is noticed too.
	f2, srv2 := newFakeCP(t)
	cfg2 := testConfig(srv2.URL, t.TempDir())
	start(t, cfg2).halt(t)
	var none []persistedExport
	if b, err := os.ReadFile(filepath.Join(cfg2.StateDir, exportsFile)); err != nil || json.Unmarshal(b, &none) != nil || none == nil || len(none) != 0 {
		t.Fatalf("exports.json of an agent that never had an export: %q (%v), want []", b, err)
	}
	if err := os.Remove(filepath.Join(cfg2.StateDir, exportsFile)); err != nil {
		t.Fatal(err)
	}
	start(t, cfg2)
	if j := joinsOf(f2); len(j) != 2 || !j[1].LostExports {
		t.Fatalf("joins %+v, want the second saying lost_exports", j)
	}
}

// TestEarlierStateDirWithoutExportsRecord: a state directory written by an
// agent that wrote exports.json only at its first export (identity.json
// without exports_kept, no exports.json) may have had its exports.json
// deleted before this version first started there: the device may hold a
// tenant's bytes. So it is taken for a lost record, as when the marker
// says the file was kept: the device is wiped before anything is served
// and the join says lost_exports. The file is written, the identity
// then says it is kept, and the next start loses nothing.
func TestEarlierStateDirWithoutExportsRecord(t *testing.T) {
	f, srv := newFakeCP(t)
	cfg := testConfig(srv.URL, t.TempDir())
	tenant := bytes.Repeat([]byte{0x77}, 4096) // a lease's, listed by the deleted exports.json
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "disk0.img"), append(tenant, make([]byte, (1<<20)-4096)...), 0o600); err != nil {
		t.Fatal(err)
	}
	old := `{"machine_id":"m-earlier","node_id":"node-n1","credential":"cred-1","agent_key":"key-1"}`
	if err := os.WriteFile(filepath.Join(cfg.StateDir, identityFile), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	r := start(t, cfg)
	if n := testutil.ToFloat64(r.a.mWipes.WithLabelValues("ok")); n != 1 {
		t.Fatalf("%v wipes on an earlier version's state directory without exports.json, want 1", n)
	}
	if !bytes.Equal(diskBytes(t, cfg.StateDir, 0, 4096), make([]byte, 4096)) {
		t.Fatal("the device keeps the bytes a deleted exports.json may have listed")
	}
	if j := joinsOf(f); len(j) != 1 || !j[0].LostExports || j[0].Fingerprint.MachineID != "m-earlier" {
		t.Fatalf("joins %+v, want one saying lost_exports, as machine m-earlier", j)
	}
	r.halt(t)
	var id identity
	if err := readJSON(filepath.Join(cfg.StateDir, identityFile), &id); err != nil || !id.ExportsKept {
		t.Fatalf("identity after the start: %+v (%v), want exports_kept", id, err)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, exportsFile)); err != nil {
		t.Fatalf("exports.json not written: %v", err)
	}
	// The next start, with the record kept, loses nothing: bytes written
	// to the device since (by the agent, say) stay.
	df, err := os.OpenFile(filepath.Join(cfg.StateDir, "disk0.img"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := df.WriteAt(tenant, 0); err != nil {
		t.Fatal(err)
	}
	df.Close()
	r = start(t, cfg)
	if n := testutil.ToFloat64(r.a.mWipes.WithLabelValues("ok")); n != 0 {
		t.Fatalf("%v wipes after a restart with the record kept, want 0", n)
	}
	if !bytes.Equal(diskBytes(t, cfg.StateDir, 0, 4096), tenant) {
		t.Fatal("a restart with the record kept wiped the device")
	}
	if j := joinsOf(f); j[len(j)-1].LostExports {
		t.Fatal("a restart with the record kept said its exports were lost")
	}
	r.halt(t)

	if err := os.Remove(filepath.Join(cfg.StateDir, exportsFile)); err != nil {
		t.Fatal(err)
	}
	start(t, cfg)
	if !bytes.Equal(diskBytes(t, cfg.StateDir, 0, 4096), make([]byte, 4096)) {
		t.Fatal("the device was not wiped once the kept record went missing")
	}
	if j := joinsOf(f); !j[len(j)-1].LostExports {
		t.Fatal("the join after the kept record went missing did not say lost_exports")
	}
}
