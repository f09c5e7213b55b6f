package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// prepareBlock prepares a block lease of disk0 and returns its URI.
func prepareBlock(t *testing.T, a *Agent, lease string, off, n int64) string {
	t.Helper()
	return prepareExport(t, a, lease, "x_"+lease, off, n)
}

// prepareExport is prepareBlock with the export's name.
func prepareExport(t *testing.T, a *Agent, lease, export string, off, n int64) string {
	t.Helper()
	resp, err := a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: lease, Kind: api.KindBlock, DeviceName: "disk0",
		Offset: off, Length: n, Export: export})
	if err != nil {
		t.Fatalf("prepare %s: %v", export, err)
	}
	return resp.URI
}

// nbdWrite writes data at off through uri and flushes.
func nbdWrite(t *testing.T, uri string, data []byte, off int64) {
	t.Helper()
	c, err := nbd.DialURI(ctxFor(t), uri)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.WriteAtContext(ctxFor(t), data, off, true); err != nil {
		t.Fatal(err)
	}
}

// nbdRead reads n bytes at off through uri.
func nbdRead(t *testing.T, uri string, n int, off int64) []byte {
	t.Helper()
	c, err := nbd.DialURI(ctxFor(t), uri)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := make([]byte, n)
	if _, err := c.ReadAtContext(ctxFor(t), b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// diskBytes reads [off, off+n) of the agent's disk0 file.
func diskBytes(t *testing.T, dir string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "disk0.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// writeDisk writes b at off of the agent's disk0 file, behind the agent.
func writeDisk(t *testing.T, dir string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "disk0.img"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt(b, off)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

// journal reads the wipe journal.
func journal(t *testing.T, dir string) []wipeEntry {
	t.Helper()
	var w []wipeEntry
	if err := readJSON(filepath.Join(dir, wipesFile), &w); err != nil {
		t.Fatal(err)
	}
	return w
}

const leaseSize = 256 << 10

// withTenant starts an agent on a fresh state directory (cfg.StateDir)
// whose lease-a, leaseSize bytes of disk0 at off, holds secret (fill
// repeated), written and flushed through its export.
func withTenant(t *testing.T, off int64, fill byte) (r *running, cfg Config, secret []byte) {
	t.Helper()
	_, srv := newFakeCP(t)
	cfg = testConfig(srv.URL, t.TempDir())
	r = start(t, cfg)
	secret = bytes.Repeat([]byte{fill}, leaseSize)
	nbdWrite(t, prepareBlock(t, r.a, "lease-a", off, leaseSize), secret, 0)
	return r, cfg, secret
}

// TestTeardownWipes: after a lease's teardown its range of the shared
// backing file is zero (on disk, and to the next lease of it, whose block
// status shows one hole), the neighbouring lease's bytes are intact, and
// the wipe journal is empty again.
func TestTeardownWipes(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	a := start(t, testConfig(srv.URL, dir)).a
	ua := prepareBlock(t, a, "lease-a", 0, leaseSize)
	un := prepareBlock(t, a, "lease-n", leaseSize, leaseSize)
	secret := bytes.Repeat([]byte("tenant A secret "), leaseSize/16)
	neighbour := bytes.Repeat([]byte("neighbour "), leaseSize/10+1)[:leaseSize]
	nbdWrite(t, ua, secret, 0)
	nbdWrite(t, un, neighbour, 0)

	if err := a.Teardown(ctxFor(t), "lease-a"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), make([]byte, leaseSize)) {
		t.Fatal("the torn-down lease's range is not zero on disk")
	}
	if !bytes.Equal(diskBytes(t, dir, leaseSize, leaseSize), neighbour) {
		t.Fatal("the wipe touched the neighbouring lease")
	}
	if w := journal(t, dir); len(w) != 0 {
		t.Fatalf("journal after the wipe: %+v", w)
	}
	if n := testutil.ToFloat64(a.mWipes.WithLabelValues("ok")); n != 1 {
		t.Errorf("%v wipes counted, want 1", n)
	}

	ub := prepareBlock(t, a, "lease-b", 0, leaseSize)
	if got := nbdRead(t, ub, leaseSize, 0); !bytes.Equal(got, make([]byte, leaseSize)) {
		t.Fatal("the next lease reads the previous tenant's bytes")
	}
	c, err := nbd.DialURI(ctxFor(t), ub)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ext, err := c.Extents(0, leaseSize)
	if err != nil || len(ext) != 1 || ext[0] != (nbd.Extent{Length: leaseSize, Flags: nbd.StateHole | nbd.StateZero}) {
		t.Fatalf("block status of the next lease: %v %v, want one hole", ext, err)
	}
}

// TestBlockLeasePartialPageCopied: a lease's length need only be a
// multiple of 512 bytes, so its last page may be partial; the wipe zeroes
// such a page in place and the next lease there writes it in place, so a
// reply sent from it zero-copy (sendfile) could carry the next tenant's
// bytes to a stalled client of the old one. The backend the agent serves
// the lease with sends zero-copy only the lease's whole pages (or none).
func TestBlockLeasePartialPageCopied(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	cfg := testConfig(srv.URL, dir)
	u := nbd.ZeroCopyAlign()
	cfg.Devices[0].Size = 4 * u
	a := start(t, cfg).a
	n := 2*u + 1536
	prepareBlock(t, a, "lease-a", u, n)
	drv := a.drivers[api.KindBlock].(*BlockDriver)
	drv.mu.Lock()
	x := drv.live["x_lease-a"]
	drv.mu.Unlock()
	if x == nil {
		t.Fatal("the lease's export is not live")
	}
	off, zn := x.be.ZeroCopyRange()
	if zn == 0 {
		t.Log("disk0's filesystem is not known to punch holes: every read is copied")
		return
	}
	if off != 0 || zn != 2*u {
		t.Fatalf("zero-copy range [%d,+%d) of a %d-byte lease, want its whole spans [0,+%d)", off, zn, n, 2*u)
	}
}

// TestCrashMidWipeKeepsRangeUnlendable: a wipe stopped half-way (as by a
// crash) leaves its journal entry; the range is refused to every prepare,
// also after heartbeats retry it under the fault; a restart finishes the
// wipe before anything is served, after which the range is lent again and
// reads as zeroes.
func TestCrashMidWipeKeepsRangeUnlendable(t *testing.T) {
	r, cfg, secret := withTenant(t, 0, 0x5a)
	dir := cfg.StateDir
	a := r.a

	a.Faults.CrashMidWipe.Store(true)
	if err := a.Teardown(ctxFor(t), "lease-a"); !errors.Is(err, errCrashInjected) {
		t.Fatalf("teardown under the fault: %v", err)
	}
	// Half-way: the first half zero, the second still the tenant's.
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize/2), make([]byte, leaseSize/2)) ||
		!bytes.Equal(diskBytes(t, dir, leaseSize/2, leaseSize/2), secret[:leaseSize/2]) {
		t.Fatal("the injected crash did not stop the wipe half-way")
	}
	if w := journal(t, dir); len(w) != 1 || w[0].LeaseID != "lease-a" || w[0].Offset != 0 || w[0].Length != leaseSize {
		t.Fatalf("journal after the crash: %+v", w)
	}
	refused := func(a *Agent) {
		t.Helper()
		_, err := a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "lease-b", Kind: api.KindBlock, DeviceName: "disk0",
			Offset: leaseSize / 2, Length: 4096, Export: "x_lease-b"})
		if !errors.Is(err, ErrOverlap) {
			t.Fatalf("prepare of a range being wiped: %v, want ErrOverlap", err)
		}
	}
	refused(a)
	if err := a.Heartbeat(ctxFor(t)); err != nil { // retries the wipe, which stops again
		t.Fatal(err)
	}
	refused(a)
	prepareBlock(t, a, "lease-c", leaseSize, 4096) // the rest of the device lends
	r.halt(t)
	if w := journal(t, dir); len(w) != 1 {
		t.Fatalf("journal after the agent stopped: %+v", w)
	}

	a2 := start(t, cfg).a
	if w := journal(t, dir); len(w) != 0 {
		t.Fatalf("journal after the restart: %+v", w)
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), make([]byte, leaseSize)) {
		t.Fatal("the restart did not finish the wipe")
	}
	ub := prepareBlock(t, a2, "lease-b", 0, leaseSize)
	if !bytes.Equal(nbdRead(t, ub, leaseSize, 0), make([]byte, leaseSize)) {
		t.Fatal("the next lease reads the previous tenant's bytes")
	}
}

// TestRestartFinishesInterruptedTeardown: an agent that stopped between
// journalling a wipe and forgetting the export (both files name the lease)
// does not serve the export again: it wipes the range.
func TestRestartFinishesInterruptedTeardown(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	cfg := testConfig(srv.URL, dir)
	r := start(t, cfg)
	ua := prepareBlock(t, r.a, "lease-a", 8192, leaseSize)
	nbdWrite(t, ua, bytes.Repeat([]byte{7}, leaseSize), 0)
	r.halt(t)
	if err := writeJSON(filepath.Join(dir, wipesFile), []wipeEntry{{LeaseID: "lease-a", Kind: api.KindBlock,
		DeviceName: "disk0", Offset: 8192, Length: leaseSize}}); err != nil {
		t.Fatal(err)
	}
	a := start(t, cfg).a
	if got := a.Leases(); len(got) != 0 {
		t.Fatalf("leases after the restart: %v", got)
	}
	if _, err := nbd.DialURI(ctxFor(t), ua); err == nil {
		t.Fatal("the export being torn down is served again")
	}
	if !bytes.Equal(diskBytes(t, dir, 8192, leaseSize), make([]byte, leaseSize)) {
		t.Fatal("the range was not wiped")
	}
}

// TestTeardownWaitsForTheJournal: a teardown whose wipe cannot be
// journalled (the state directory's disk full, say) does not forget the
// export: had it gone on, a crash before the wipe finished would leave the
// range with the tenant's bytes, named by neither file, to the next
// lease. The export stays (held after a restart, its range refused) until
// a teardown that can journal it.
func TestTeardownWaitsForTheJournal(t *testing.T) {
	r, cfg, _ := withTenant(t, 0, 0x6b)
	dir := cfg.StateDir

	// The journal cannot be written (a non-empty directory in its place).
	if err := os.MkdirAll(filepath.Join(dir, wipesFile, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	r.a.Faults.CrashMidWipe.Store(true)
	if err := r.a.Teardown(ctxFor(t), "lease-a"); err == nil {
		t.Fatal("a teardown whose wipe could not be journalled succeeded")
	}
	r.halt(t) // the crash
	if err := os.RemoveAll(filepath.Join(dir, wipesFile)); err != nil {
		t.Fatal(err)
	}

	a := start(t, cfg).a
	resp, err := a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "lease-b", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-b"})
	switch {
	case errors.Is(err, ErrOverlap):
	case err != nil:
		t.Fatal(err)
	case !bytes.Equal(nbdRead(t, resp.URI, leaseSize, 0), make([]byte, leaseSize)):
		t.Fatal("the next lease reads the previous tenant's bytes")
	}
}

// TestPrepareWaitsForItsRecord: a prepare whose export cannot be
// recorded in exports.json fails (and serves nothing). Had it been
// served, a restart would forget it: its lease's teardown would find
// nothing to wipe, and the range would go to the next lease with the
// tenant's bytes.
func TestPrepareWaitsForItsRecord(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	cfg := testConfig(srv.URL, dir)
	r := start(t, cfg)
	// exports.json cannot be written (a non-empty directory in its place).
	if err := os.Remove(filepath.Join(dir, exportsFile)); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, exportsFile, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	resp, err := r.a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-a"})
	if err == nil {
		nbdWrite(t, resp.URI, bytes.Repeat([]byte{0x3c}, leaseSize), 0)
	} else if served(t, "nbd://"+r.a.Endpoint(api.KindBlock)+"/x_lease-a") {
		t.Fatal("a refused prepare's export is served")
	}
	r.halt(t) // a crash
	if err := os.RemoveAll(filepath.Join(dir, exportsFile)); err != nil {
		t.Fatal(err)
	}

	a := start(t, cfg).a
	if err := a.Teardown(ctxFor(t), "lease-a"); err != nil {
		t.Fatal(err)
	}
	ub := prepareBlock(t, a, "lease-b", 0, leaseSize)
	if !bytes.Equal(nbdRead(t, ub, leaseSize, 0), make([]byte, leaseSize)) {
		t.Fatal("the next lease reads the previous tenant's bytes")
	}
}

// TestUnreadableExportsRefused: an agent whose exports.json cannot be
// read does not start. It cannot tell which ranges hold tenants' bytes:
// started, its first prepare would overwrite the file, and the teardowns
// of the leases it listed would find nothing to wipe, so their ranges
// would go to the next leases with the bytes.
func TestUnreadableExportsRefused(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, exportsFile), []byte(`[{"lease_id":"l","device_name":"disk0","len`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := refusedStart(t, testConfig(srv.URL, dir)); err == nil {
		t.Fatal("Run with an unreadable exports.json returned nil")
	}
}

// TestUnrestorableRangeWiped: an export a restart cannot restore because
// its device changed in the configuration is not just dropped: what is
// left of its range is wiped before anything is lent (a device shrunk
// under the lease, one renamed, found by its path), or stays refused in
// the journal when its device is gone.
func TestUnrestorableRangeWiped(t *testing.T) {
	const off = 512 << 10
	for _, c := range []struct {
		name   string
		change func(*DeviceConfig)
		// dev and n are the device and length the next lease of the
		// range takes; dev "" when the device is gone.
		dev string
		n   int64
	}{
		{"shrunk", func(d *DeviceConfig) { d.Size = off + leaseSize/2 }, "disk0", leaseSize / 2},
		{"renamed", func(d *DeviceConfig) { d.Name = "disk9" }, "disk9", leaseSize},
		{"gone", func(d *DeviceConfig) { d.Name, d.Path = "disk9", "other.img" }, "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, cfg, secret := withTenant(t, off, 0x3c)
			dir := cfg.StateDir
			r.halt(t)

			c.change(&cfg.Devices[0])
			a := start(t, cfg).a
			if got := a.Leases(); len(got) != 0 {
				t.Fatalf("leases after the restart: %v", got)
			}
			// Not served again: the control plane is told the lease is
			// lost, until it acknowledges it (kept in exports.json).
			a.mu.Lock()
			lost := a.lostLocked()
			a.mu.Unlock()
			if len(lost) != 1 || lost[0].LeaseID != "lease-a" || lost[0].Offset != off || lost[0].Reason != reasonUnrestorable {
				t.Fatalf("lost exports reported: %+v, want lease-a's part", lost)
			}
			if p := persisted(t, dir, "x_lease-a"); p == nil || p.Lost == "" {
				t.Fatalf("exports.json: the lost export %+v, want it kept marked lost", p)
			}
			w := journal(t, dir)
			if c.dev == "" {
				if len(w) != 1 || w[0].DeviceName != "disk0" || w[0].Offset != off || w[0].Length != leaseSize {
					t.Fatalf("journal with the device gone: %+v, want disk0's range kept", w)
				}
				if !bytes.Equal(diskBytes(t, dir, off, leaseSize), secret) {
					t.Fatal("a range of a device no longer lent was changed")
				}
				return
			}
			if len(w) != 0 {
				t.Fatalf("journal after the restart: %+v", w)
			}
			if !bytes.Equal(diskBytes(t, dir, off, c.n), make([]byte, c.n)) {
				t.Fatal("the range of the export that could not be restored keeps the tenant's bytes")
			}
			resp, err := a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "lease-b", Kind: api.KindBlock, DeviceName: c.dev,
				Offset: off, Length: c.n, Export: "x_lease-b"})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(nbdRead(t, resp.URI, int(c.n), 0), make([]byte, c.n)) {
				t.Fatal("the next lease reads the previous tenant's bytes")
			}
		})
	}
}

// TestWipeLostExports: with Config.WipeLostExports an agent whose
// exports.json cannot be read starts, having wiped every block device in
// full before serving anything, and keeps the file aside.
func TestWipeLostExports(t *testing.T) {
	r, cfg, secret := withTenant(t, 4096, 0x2d)
	dir := cfg.StateDir
	r.halt(t)
	if !bytes.Equal(diskBytes(t, dir, 4096, leaseSize), secret) {
		t.Fatal("the tenant's bytes are not on the device")
	}
	bad := []byte(`[{"lease_id":"lease-a","device_name":"disk0","len`)
	if err := os.WriteFile(filepath.Join(dir, exportsFile), bad, 0o600); err != nil {
		t.Fatal(err)
	}

	cfg.WipeLostExports = true
	a := start(t, cfg).a
	if got := a.Leases(); len(got) != 0 {
		t.Fatalf("leases after the restart: %v", got)
	}
	if w := journal(t, dir); len(w) != 0 {
		t.Fatalf("journal after the restart: %+v", w)
	}
	size := cfg.Devices[0].Size
	if !bytes.Equal(diskBytes(t, dir, 0, size), make([]byte, size)) {
		t.Fatal("the device keeps a tenant's bytes")
	}
	aside, _ := filepath.Glob(filepath.Join(dir, exportsFile+".unreadable-*"))
	if len(aside) != 1 {
		t.Fatalf("set aside: %v", aside)
	}
	if b, err := os.ReadFile(aside[0]); err != nil || !bytes.Equal(b, bad) {
		t.Fatalf("the file set aside: %q, %v", b, err)
	}
	ub := prepareBlock(t, a, "lease-b", 4096, leaseSize)
	if !bytes.Equal(nbdRead(t, ub, leaseSize, 0), make([]byte, leaseSize)) {
		t.Fatal("the next lease reads the previous tenant's bytes")
	}
}

// TestRestoreFollowsDevicePath: a restart whose configuration gave a
// device's name to another file (disk0 renamed disk9, a new disk0 added)
// does not restore the export on the file now under the old name (its
// tenant would read that file's bytes), and wipes the export's range of
// the file it was on, now disk9's, before disk9 lends it on.
func TestRestoreFollowsDevicePath(t *testing.T) {
	const off = 512 << 10
	r, cfg, secret := withTenant(t, off, 0x4e)
	dir := cfg.StateDir
	r.halt(t)

	cfg.Devices[0].Name = "disk9"
	cfg.Devices = append(cfg.Devices, DeviceConfig{Name: "disk0", Kind: api.KindBlock, Path: "other.img", Size: 1 << 20})
	a := start(t, cfg).a
	if got := a.Leases(); len(got) != 0 {
		t.Fatalf("leases after the restart: %v (restored on another file)", got)
	}
	if w := journal(t, dir); len(w) != 0 {
		t.Fatalf("journal after the restart: %+v", w)
	}
	if bytes.Equal(diskBytes(t, dir, off, leaseSize), secret) {
		t.Fatal("the range of the export's file keeps the tenant's bytes")
	}
	resp, err := a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "lease-b", Kind: api.KindBlock, DeviceName: "disk9",
		Offset: off, Length: leaseSize, Export: "x_lease-b"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(nbdRead(t, resp.URI, leaseSize, 0), make([]byte, leaseSize)) {
		t.Fatal("the next lease of the range reads the previous tenant's bytes")
	}
}

// TestUnrestorableRangeCut: a persisted entry whose range reaches outside
// its device (a negative offset: a damaged or hand-edited file) has what
// lies inside the device wiped, not a wipe that cannot run and keeps the
// device's first bytes refused for good.
func TestUnrestorableRangeCut(t *testing.T) {
	r, cfg, _ := withTenant(t, 0, 0x71)
	dir := cfg.StateDir
	saved := haltedExports(t, r, dir, 1)
	// Beside it, entries whose ranges lie before the device or overflow:
	// none of the device is theirs, nothing is wiped for them (the
	// neighbour's bytes at leaseSize stay).
	neighbour := bytes.Repeat([]byte{0x17}, 4096)
	writeDisk(t, dir, neighbour, leaseSize)
	p := saved[0]
	saved[0].Offset, saved[0].Length = -4096, leaseSize+4096
	for i, r := range [][2]int64{{math.MinInt64, 1 << 20}, {math.MinInt64 + 4096, math.MaxInt64}, {math.MaxInt64 - 4096, 8192}, {4096, -1}} {
		q := p
		q.LeaseID, q.Export = fmt.Sprintf("lease-z%d", i), fmt.Sprintf("x_lease-z%d", i)
		q.Offset, q.Length = r[0], r[1]
		saved = append(saved, q)
	}
	if err := writeJSON(filepath.Join(dir, exportsFile), saved); err != nil {
		t.Fatal(err)
	}

	a := start(t, cfg).a
	if w := journal(t, dir); len(w) != 0 {
		t.Fatalf("journal after the restart: %+v", w)
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), make([]byte, leaseSize)) {
		t.Fatal("the range keeps the tenant's bytes")
	}
	if !bytes.Equal(diskBytes(t, dir, leaseSize, 4096), neighbour) {
		t.Fatal("bytes outside every entry's range were wiped")
	}
	prepareBlock(t, a, "lease-b", 0, leaseSize)
}

// TestSameFileTwiceRefused: two block devices backed by one file (the same
// path spelt twice) would lend its bytes twice, under each name, to two
// tenants at once; the agent refuses to start.
func TestSameFileTwiceRefused(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	cfg := testConfig(srv.URL, dir)
	cfg.Devices = append(cfg.Devices, DeviceConfig{Name: "disk1", Kind: api.KindBlock, Path: filepath.Join(dir, "disk0.img")})
	if err := refusedStart(t, cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("Run with two devices on one file: %v, want ErrConfig", err)
	}
}

// TestWipeFollowsTheFile: the wipe journal names a range of a file, not
// of a device name. A restart that gives a lease's device name to another
// file neither wipes that file's range in its place (and forgets the
// tenant's bytes) nor refuses it; the tenant's range stays in the journal
// and is wiped once its file is lent again, under another name.
func TestWipeFollowsTheFile(t *testing.T) {
	const off = 512 << 10
	r, cfg, secret := withTenant(t, off, 0x5c)
	dir := cfg.StateDir
	r.halt(t)

	cfg.Devices[0].Path = "other.img" // disk0 is now another file
	r = start(t, cfg)
	if got := r.a.Leases(); len(got) != 0 {
		t.Fatalf("leases after the restart: %v", got)
	}
	w := journal(t, dir)
	if len(w) != 1 || filepath.Base(w[0].DevicePath) != "disk0.img" || w[0].Offset != off || w[0].Length != leaseSize {
		t.Fatalf("journal with the file no longer lent: %+v, want disk0.img's range", w)
	}
	if !bytes.Equal(diskBytes(t, dir, off, leaseSize), secret) {
		t.Fatal("a range of a file no longer lent was changed")
	}
	// The name's new file is not refused for the old file's range.
	prepareBlock(t, r.a, "lease-b", off, leaseSize)
	if err := r.a.Teardown(ctxFor(t), "lease-b"); err != nil {
		t.Fatal(err)
	}
	r.halt(t)

	cfg.Devices[0] = DeviceConfig{Name: "disk9", Kind: api.KindBlock, Path: "disk0.img", Size: 1 << 20}
	start(t, cfg)
	if w := journal(t, dir); len(w) != 0 {
		t.Fatalf("journal once the file is lent again: %+v", w)
	}
	if !bytes.Equal(diskBytes(t, dir, off, leaseSize), make([]byte, leaseSize)) {
		t.Fatal("the tenant's range was not wiped once its file was lent again")
	}
}

// refusedStart runs an agent with cfg that must refuse to start, and
// returns Run's error; the test fails if the agent starts.
func refusedStart(t *testing.T, cfg Config) error {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-a.Ready():
		cancel()
		<-done
		t.Fatal("the agent started")
		return nil
	}
}

// TestUnrestorableSparesRestoredRange: a damaged exports.json whose
// unrestorable entry (a device name no longer configured, or a range
// overlapping an earlier entry's on the same device) overlaps the range
// of a lease that does restore wipes only what of its range the restored
// lease does not hold: the restored tenant's bytes stay. The entry's lease
// is reported lost.
func TestUnrestorableSparesRestoredRange(t *testing.T) {
	for _, c := range []struct{ name, device string }{
		{"unknown device", "diskX"},
		{"overlapping range", "disk0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, cfg, secret := withTenant(t, 0, 0x29)
			dir := cfg.StateDir
			saved := haltedExports(t, r, dir, 1)
			// Bytes past lease-a that the damaged entry also names.
			tail := bytes.Repeat([]byte{0x33}, leaseSize/2)
			writeDisk(t, dir, tail, leaseSize)
			bad := saved[0]
			bad.LeaseID, bad.Export, bad.DeviceName = "lease-z", "x_lease-z", c.device
			bad.Offset, bad.Length = leaseSize/2, leaseSize
			if err := writeJSON(filepath.Join(dir, exportsFile), append(saved, bad)); err != nil {
				t.Fatal(err)
			}

			a := start(t, cfg).a
			if got := a.Leases(); len(got) != 1 || got[0] != "lease-a" {
				t.Fatalf("leases after the restart: %v, want lease-a (held)", got)
			}
			if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), secret) {
				t.Fatal("the restored lease's bytes were wiped for a damaged entry overlapping them")
			}
			if !bytes.Equal(diskBytes(t, dir, leaseSize, leaseSize/2), make([]byte, leaseSize/2)) {
				t.Fatal("the damaged entry's own range past the restored lease was not wiped")
			}
			a.mu.Lock()
			lost := a.lostLocked()
			a.mu.Unlock()
			if len(lost) != 1 || lost[0].LeaseID != "lease-z" {
				t.Fatalf("lost exports reported: %+v, want lease-z's part", lost)
			}
		})
	}
}

func TestCut(t *testing.T) {
	for _, c := range []struct {
		rs     [][2]int64
		lo, hi int64
		want   [][2]int64
	}{
		{[][2]int64{{0, 10}}, 3, 5, [][2]int64{{0, 3}, {5, 10}}},
		{[][2]int64{{0, 10}}, 0, 10, nil},
		{[][2]int64{{0, 10}}, -5, 3, [][2]int64{{3, 10}}},
		{[][2]int64{{0, 10}}, 8, 20, [][2]int64{{0, 8}}},
		{[][2]int64{{0, 10}}, 10, 20, [][2]int64{{0, 10}}},
		{[][2]int64{{0, 4}, {6, 10}}, 3, 7, [][2]int64{{0, 3}, {7, 10}}},
	} {
		if got := cut(c.rs, c.lo, c.hi); !reflect.DeepEqual(got, c.want) {
			t.Errorf("cut(%v, %d, %d) = %v, want %v", c.rs, c.lo, c.hi, got, c.want)
		}
	}
}

// TestDuplicateEntryLosesNoOtherLease: a damaged exports.json that lists
// a lease's export twice, the second time at another lease's range, does
// not cost that other lease: the duplicate is not served (the export is
// served under its first entry), so it overlaps no restored range. The
// other lease is restored with its bytes, and is not reported lost.
func TestDuplicateEntryLosesNoOtherLease(t *testing.T) {
	r, cfg, secret := withTenant(t, 0, 0x29)
	dir := cfg.StateDir
	other := bytes.Repeat([]byte{0x44}, leaseSize)
	nbdWrite(t, prepareBlock(t, r.a, "lease-b", leaseSize, leaseSize), other, 0)
	saved := haltedExports(t, r, dir, 2)
	dup := saved[0]
	dup.Offset = leaseSize
	if err := writeJSON(filepath.Join(dir, exportsFile), []persistedExport{saved[0], dup, saved[1]}); err != nil {
		t.Fatal(err)
	}

	a := start(t, cfg).a
	if got := a.Leases(); len(got) != 2 {
		t.Fatalf("leases after the restart: %v, want lease-a and lease-b (held)", got)
	}
	a.mu.Lock()
	lost := a.lostLocked()
	a.mu.Unlock()
	for _, x := range lost {
		if x.LeaseID == "lease-b" {
			t.Fatalf("lost exports reported: %+v: lease-b lost for a duplicate of lease-a's entry", lost)
		}
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), secret) || !bytes.Equal(diskBytes(t, dir, leaseSize, leaseSize), other) {
		t.Fatal("a restored lease's bytes were wiped")
	}
}

// TestDroppedEntryListedAgain: a damaged exports.json lists an export
// first over another lease's range (not served: its lease is reported
// lost), then again where it was: the lease is not served under the
// second entry either (it would be served and lost at once), and its
// range is wiped.
func TestDroppedEntryListedAgain(t *testing.T) {
	r, cfg, _ := withTenant(t, 0, 0x29)
	dir := cfg.StateDir
	other := bytes.Repeat([]byte{0x44}, leaseSize)
	nbdWrite(t, prepareBlock(t, r.a, "lease-b", leaseSize, leaseSize), other, 0)
	saved := haltedExports(t, r, dir, 2)
	over := saved[0]
	over.Offset = leaseSize + leaseSize/2
	if err := writeJSON(filepath.Join(dir, exportsFile), []persistedExport{saved[1], over, saved[0]}); err != nil {
		t.Fatal(err)
	}

	a := start(t, cfg).a
	if got := a.Leases(); len(got) != 1 || got[0] != "lease-b" {
		t.Fatalf("leases after the restart: %v, want lease-b (held) only", got)
	}
	a.mu.Lock()
	lost := a.lostLocked()
	a.mu.Unlock()
	if len(lost) != 1 || lost[0].LeaseID != "lease-a" {
		t.Fatalf("lost exports reported: %+v, want lease-a's", lost)
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), make([]byte, leaseSize)) {
		t.Fatal("the lost lease's range keeps its bytes")
	}
	if !bytes.Equal(diskBytes(t, dir, leaseSize, leaseSize), other) {
		t.Fatal("the restored lease's bytes were wiped")
	}
}

// TestUnrestorableEntryListedAgain: a damaged exports.json lists an export
// first on a device no longer configured, then again as it was: the lease
// is reported lost and not served under the second entry (it would be
// served and lost at once), and its range is wiped. Listed the other way
// round, the export is served under its first entry and not reported
// lost: only the damaged entry is dropped.
func TestUnrestorableEntryListedAgain(t *testing.T) {
	for _, c := range []struct {
		name      string
		badFirst  bool
		wantLease bool
	}{
		{"bad entry first", true, false},
		{"bad entry second", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, cfg, secret := withTenant(t, 0, 0x29)
			dir := cfg.StateDir
			saved := haltedExports(t, r, dir, 1)
			bad := saved[0]
			bad.DeviceName, bad.DevicePath = "diskX", ""
			entries := []persistedExport{saved[0], bad}
			if c.badFirst {
				entries = []persistedExport{bad, saved[0]}
			}
			if err := writeJSON(filepath.Join(dir, exportsFile), entries); err != nil {
				t.Fatal(err)
			}

			a := start(t, cfg).a
			a.mu.Lock()
			lost := a.lostLocked()
			a.mu.Unlock()
			got := a.Leases()
			if c.wantLease {
				if len(got) != 1 || got[0] != "lease-a" || len(lost) != 0 {
					t.Fatalf("leases after the restart: %v, lost %+v; want lease-a served, none lost", got, lost)
				}
				if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), secret) {
					t.Fatal("the served lease's bytes were wiped")
				}
				return
			}
			if len(got) != 0 || len(lost) != 1 || lost[0].LeaseID != "lease-a" {
				t.Fatalf("leases after the restart: %v, lost %+v; want none served, lease-a lost", got, lost)
			}
			if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), make([]byte, leaseSize)) {
				t.Fatal("the lost lease's range keeps its bytes")
			}
		})
	}
}

// haltedExports halts r and returns the exports its state directory dir
// lists: n entries, lease-a's first.
func haltedExports(t *testing.T, r *running, dir string, n int) []persistedExport {
	t.Helper()
	r.halt(t)
	var saved []persistedExport
	if err := readJSON(filepath.Join(dir, exportsFile), &saved); err != nil || len(saved) != n || saved[0].LeaseID != "lease-a" {
		t.Fatalf("exports: %+v, %v", saved, err)
	}
	return saved
}

// TestTeardownWaitsForWipeUnderWay: a teardown whose range a heartbeat's
// retry is already wiping answered at once, before the range was zero,
// and the control plane took it as free. The teardown's run now waits
// for the one under way and answers with its outcome; the heartbeat's
// retry still does not wait for a teardown's.
func TestTeardownWaitsForWipeUnderWay(t *testing.T) {
	r, cfg, _ := withTenant(t, 0, 0x5a)
	dir := cfg.StateDir
	a := r.a

	// A failed wipe leaves the entry for the heartbeat's retry.
	a.Faults.CrashMidWipe.Store(true)
	if err := a.Teardown(ctxFor(t), "lease-a"); !errors.Is(err, errCrashInjected) {
		t.Fatalf("teardown under the fault: %v", err)
	}
	a.Faults.CrashMidWipe.Store(false)
	a.mu.Lock()
	if len(a.wipes) != 1 {
		a.mu.Unlock()
		t.Fatalf("%d pending wipes, want 1", len(a.wipes))
	}
	w := a.wipes[0]
	a.mu.Unlock()

	retried := make(chan error, 1)
	release := holdNextWipe(a, func() { retried <- a.retryWipes(ctxFor(t)) })

	// The heartbeat's retry holds the entry: another retry skips it.
	if err := a.retryWipes(ctxFor(t)); err != nil {
		t.Fatalf("a second retry: %v", err)
	}
	torn := make(chan error, 1)
	go func() { torn <- a.runWipe(ctxFor(t), w) }()
	waitsForWipe(t, a, w, torn, "the teardown's wipe", "the retry's")
	close(release)
	if err := <-torn; err != nil {
		t.Fatalf("the teardown's wipe: %v", err)
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), make([]byte, leaseSize)) {
		t.Fatal("the teardown answered before its range was zero")
	}
	if err := <-retried; err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if j := journal(t, dir); len(j) != 0 {
		t.Fatalf("journal after the wipe: %+v", j)
	}
}

// holdNextWipe runs start on a goroutine of its own and returns once the
// wipe it starts is held just before it writes (Faults.BeforeWipe; later
// wipes are not held); the wipe goes on once release is closed, or its
// context ends.
func holdNextWipe(a *Agent, start func()) (release chan struct{}) {
	entered, release := make(chan struct{}), make(chan struct{})
	hold := func(ctx context.Context, lease string) {
		close(entered)
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	a.Faults.BeforeWipe.Store(&hold)
	go start()
	<-entered
	a.Faults.BeforeWipe.Store(nil)
	return release
}

// waitsForWipe returns once a call (what), whose answer is to come on
// done, waits for wipe w, under way for another (whose): the test fails
// if the call answers first, or neither answers nor waits within 20
// seconds.
func waitsForWipe(t *testing.T, a *Agent, w *pendingWipe, done <-chan error, what, whose string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for waiting := false; !waiting; {
		select {
		case err := <-done:
			t.Fatalf("%s answered (%v) while %s wipe was under way: the range still holds the tenant's bytes", what, err, whose)
		default:
		}
		a.mu.Lock()
		waiting = w.waiting == 1
		a.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("%s neither answered nor waited", what)
		}
		runtime.Gosched()
	}
}

// TestSecondTeardownWaitsForTheFirstsWipe: a teardown call of a lease
// whose exports another teardown (a heartbeat answer's, say) has already
// retired found nothing left to tear down and answered at once, while
// the other's wipe was under way, or not even started: the range still
// held the tenant's bytes, and a forced removal returned before the
// agent had wiped the lease lost with the node. The call now waits for
// the wipe under way, and runs one not started yet.
func TestSecondTeardownWaitsForTheFirstsWipe(t *testing.T) {
	t.Run("under way", func(t *testing.T) {
		r, cfg, _ := withTenant(t, 0, 0x5a)
		a := r.a
		first := make(chan error, 1)
		release := holdNextWipe(a, func() { first <- a.teardownAnswered(ctxFor(t), "lease-a", math.MaxUint64) })
		a.mu.Lock()
		if len(a.wipes) != 1 {
			a.mu.Unlock()
			t.Fatalf("%d pending wipes, want 1", len(a.wipes))
		}
		w := a.wipes[0]
		a.mu.Unlock()

		second := make(chan error, 1)
		go func() { second <- a.Teardown(ctxFor(t), "lease-a") }()
		waitsForWipe(t, a, w, second, "the second teardown", "the first's")
		close(release)
		if err := <-second; err != nil {
			t.Fatalf("the second teardown: %v", err)
		}
		if !bytes.Equal(diskBytes(t, cfg.StateDir, 0, leaseSize), make([]byte, leaseSize)) {
			t.Fatal("the second teardown answered before the range was zero")
		}
		if err := <-first; err != nil {
			t.Fatalf("the first teardown: %v", err)
		}
		if j := journal(t, cfg.StateDir); len(j) != 0 {
			t.Fatalf("journal after the wipe: %+v", j)
		}
	})
	t.Run("not started", func(t *testing.T) {
		r, cfg, _ := withTenant(t, 0, 0x5a)
		a := r.a
		// The first teardown has retired the export and not started
		// its wipe yet.
		owed, err := a.retireExports(ctxFor(t), "lease-a", func(Export) bool { return true })
		if err != nil || len(owed) != 1 {
			t.Fatalf("retire: %d wipes owed, %v", len(owed), err)
		}
		if err := a.TeardownPlacement(ctxFor(t), "lease-a", 1); err != nil {
			t.Fatalf("the second teardown: %v", err)
		}
		if !bytes.Equal(diskBytes(t, cfg.StateDir, 0, leaseSize), make([]byte, leaseSize)) {
			t.Fatal("the second teardown answered before the range was zero")
		}
		if err := a.runWipes(ctxFor(t), owed); err != nil {
			t.Fatalf("the first teardown's wipe, run after: %v", err)
		}
		if n := testutil.ToFloat64(a.mWipes.WithLabelValues("ok")); n != 1 {
			t.Errorf("%v wipes of the range, want 1: the first teardown's ran again, once the range was free", n)
		}
		if j := journal(t, cfg.StateDir); len(j) != 0 {
			t.Fatalf("journal after the wipe: %+v", j)
		}
	})
}
