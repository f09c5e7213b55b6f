package agent

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/api"
	memclient "github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// TestRestartLosesMemoryExport: a restarted agent does not serve a memory
// export again (its region, and the lease's data, went with the process):
// the credential reaches no region, and every heartbeat reports the part
// lost, with a reason, until the control plane acknowledges it —
// exports.json keeps it marked lost until then, so a restart in between
// reports it again (counting it once). The block export beside it is
// restored as usual.
func TestRestartLosesMemoryExport(t *testing.T) {
	cp, srv := newFakeCP(t)
	dir := t.TempDir()
	cfg := testConfig(srv.URL, dir)
	cfg.Devices = append(cfg.Devices, DeviceConfig{Name: "mem0", Kind: api.KindMemory, Size: 4 << 20})
	r := start(t, cfg)
	ctx := ctxFor(t)
	ub := prepareBlock(t, r.a, "lease-b", 0, leaseSize)
	mc, addr, cred := dialMemory(t, r.a, api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindMemory, DeviceName: "mem0", DeviceID: "dev-m",
		Offset: 1 << 20, Length: 1 << 20, Export: "x_lease-m"})
	if err := mc.Write(ctx, memclient.ChannelSync, bytes.Repeat([]byte{0x6d}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	mc.Close()
	r.halt(t)

	lostIn := func(hb api.Heartbeat) []api.LostExport { return hb.Lost }
	r = start(t, cfg)
	a := r.a
	if got := a.Leases(); len(got) != 1 || got[0] != "lease-b" {
		t.Fatalf("leases after the restart: %v", got)
	}
	if !served(t, ub) {
		t.Fatal("the block export is not served after the restart")
	}
	if c, err := memclient.Dial(ctx, addr, cred, memclient.Options{}); err == nil {
		c.Close()
		t.Fatal("the memory export is served after the restart (a zeroed region under the lease's credential)")
	} else if !errors.Is(err, protocol.ErrAuth) {
		t.Fatalf("dialling the lost memory export: %v", err)
	}
	lost := lostIn(cp.lastBeat())
	if len(lost) != 1 || lost[0].LeaseID != "lease-m" || lost[0].DeviceID != "dev-m" || lost[0].Offset != 1<<20 || lost[0].Reason == "" {
		t.Fatalf("the heartbeat reports lost %+v, want lease-m's part", lost)
	}
	if n := testutil.ToFloat64(a.mRestored.WithLabelValues("lost")); n != 1 {
		t.Errorf("%v exports counted lost, want 1", n)
	}
	if p := persisted(t, dir, "x_lease-m"); p == nil || p.Lost == "" {
		t.Fatalf("exports.json: the lost export %+v, want it kept marked lost", p)
	}

	// Not acknowledged (an older control plane): reported again after
	// the next restart, and not counted again.
	r.halt(t)
	r = start(t, cfg)
	a = r.a
	if lost := lostIn(cp.lastBeat()); len(lost) != 1 || lost[0].LeaseID != "lease-m" {
		t.Fatalf("after a second restart the heartbeat reports lost %+v", lost)
	}
	if n := testutil.ToFloat64(a.mRestored.WithLabelValues("lost")); n != 0 {
		t.Errorf("%v exports counted lost again", n)
	}

	cp.set(func(f *fakeCP) { f.ackLost = true })
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if p := persisted(t, dir, "x_lease-m"); p != nil {
		t.Fatalf("exports.json keeps the acknowledged lost export: %+v", p)
	}
	if persisted(t, dir, "x_lease-b") == nil {
		t.Fatal("exports.json lost the block export")
	}
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if lost := lostIn(cp.lastBeat()); len(lost) != 0 {
		t.Fatalf("after the acknowledgement the heartbeat reports lost %+v", lost)
	}
}

// persisted is the entry of exports.json for export name, or nil.
func persisted(t *testing.T, dir, name string) *persistedExport {
	t.Helper()
	var saved []persistedExport
	if err := readJSON(filepath.Join(dir, exportsFile), &saved); err != nil {
		t.Fatal(err)
	}
	for i := range saved {
		if saved[i].Export == name {
			return &saved[i]
		}
	}
	return nil
}
