package agent

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	memclient "github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/nic"
	"github.com/rialto-project/rialto/internal/logtest"
)

// TestExpiredBlockLeaseRefusedBeforeItsStop: with the control plane
// unreachable, a block lease's requests are refused from its known expiry
// on, on a connection opened before it and on a new one, even while the
// agent's stop of the export has not happened yet (held up here as it can
// be on a loaded machine: enforceExpiry waits for the agent's other
// work); a renewal an answer brought before then moves the data plane's
// deadline with the known expiry.
func TestExpiredBlockLeaseRefusedBeforeItsStop(t *testing.T) {
	cp, srv := newFakeCP(t)
	dir := t.TempDir()
	clk := clock.NewFake(time.Date(2026, 1, 1, 13, 40, 0, 0, time.UTC))
	cfg := testConfig(srv.URL, dir)
	cfg.Clock = clk
	cfg.HeartbeatInterval = time.Hour
	a := start(t, cfg).a
	ctx := ctxFor(t)
	resp, err := a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0",
		Length: leaseSize, Export: "x_lease-a", ExpiresAt: clk.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	ua := resp.URI
	data := bytes.Repeat([]byte("until expiry "), leaseSize/13+1)[:leaseSize]
	nbdWrite(t, ua, data, 0)
	open, err := nbd.DialURI(ctx, ua)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()

	// Renewed while served: the data plane serves past the old expiry.
	exp := renewPastOldExpiry(ctx, t, a, cp, clk, "lease-a")
	if _, err := open.ReadAtContext(ctx, make([]byte, 4096), 0); err != nil {
		t.Fatalf("a renewed lease refused a read past its old expiry: %v", err)
	}

	// The control plane goes away; the stop at the expiry is held up.
	release := expireWithStopHeld(t, a, cp, clk, exp)
	if _, err := open.ReadAtContext(ctx, make([]byte, 4096), 0); err == nil {
		t.Fatal("a connection opened before the expiry still reads after it")
	}
	late, err := nbd.DialURI(ctx, ua)
	if err != nil {
		t.Fatal(err) // not stopped yet: the handshake is answered
	}
	defer late.Close()
	if _, err := late.WriteAtContext(ctx, make([]byte, 4096), 0, true); err == nil {
		t.Fatal("a write after the expiry was served")
	}
	if n := testutil.ToFloat64(a.mSuspends.WithLabelValues("block")); n != 0 {
		t.Fatalf("%v suspensions counted: the stop was not held up", n)
	}
	if !bytes.Equal(diskBytes(t, dir, 0, leaseSize), data) {
		t.Fatal("a write after the expiry reached the disk")
	}
	release()
}

// TestExpiredMemoryLeaseRefusedBeforeItsStop is
// TestExpiredBlockLeaseRefusedBeforeItsStop for a memory lease: its
// donor refuses the region's READs and WRITEs from the known expiry on,
// on a session opened before it and on a new one, before the agent's
// stop (the region's suspension) has come.
func TestExpiredMemoryLeaseRefusedBeforeItsStop(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 13, 40, 0, 0, time.UTC))
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Devices = append(cfg.Devices, DeviceConfig{Name: "mem0", Kind: api.KindMemory, Size: 4 << 20})
	cfg.Clock = clk
	cfg.HeartbeatInterval = time.Hour
	a := start(t, cfg).a
	ctx := ctxFor(t)
	open, addr, cred := dialMemory(t, a, api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindMemory, DeviceName: "mem0",
		Length: 1 << 20, Export: "x_lease-m", ExpiresAt: clk.Now().Add(time.Minute)})
	data := bytes.Repeat([]byte("until expiry "), 400)
	if err := open.Write(ctx, memclient.ChannelSync, data, 4096); err != nil {
		t.Fatal(err)
	}

	// Renewed while served: the data plane serves past the old expiry.
	exp := renewPastOldExpiry(ctx, t, a, cp, clk, "lease-m")
	if err := open.Read(ctx, memclient.ChannelSync, make([]byte, 4096), 4096); err != nil {
		t.Fatalf("a renewed lease refused a read past its old expiry: %v", err)
	}

	// The control plane goes away; the stop at the expiry is held up.
	release := expireWithStopHeld(t, a, cp, clk, exp)
	if err := open.Read(ctx, memclient.ChannelSync, make([]byte, 4096), 4096); err == nil {
		t.Fatal("a session opened before the expiry still reads after it")
	}
	open.Close() // a region has one subscriber at a time
	late, err := memclient.Dial(ctx, addr, cred, memclient.Options{})
	if err != nil {
		t.Fatal(err) // not stopped yet: the HELLO is answered
	}
	defer late.Close()
	if err := late.Write(ctx, memclient.ChannelSync, make([]byte, 4096), 4096); err == nil {
		t.Fatal("a write after the expiry was served")
	}
	if n := testutil.ToFloat64(a.mSuspends.WithLabelValues("memory")); n != 0 {
		t.Fatalf("%v suspensions counted: the stop was not held up", n)
	}
	got := make([]byte, len(data))
	if _, err := a.drivers[api.KindMemory].(*MemoryDriver).donor.ReadRegion(cred, got, 4096); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("a write after the expiry reached the region (%v)", err)
	}
	release()
}

// TestExpiredAccelLeaseRefusedBeforeItsStop is
// TestExpiredBlockLeaseRefusedBeforeItsStop for accelerator leases, a
// dedicated one (its slot refuses) and a shared one (its gateway
// refuses): their calls are refused from the known expiry on, on a
// connection opened before it and on a new one, before the agent's stop
// (the lease's end at its slot or gateway) has come.
func TestExpiredAccelLeaseRefusedBeforeItsStop(t *testing.T) {
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 13, 40, 0, 0, time.UTC))
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Clock = clk
	cfg.HeartbeatInterval = time.Hour
	a := start(t, cfg).a
	ctx := ctxFor(t)
	type lease struct {
		id, addr, cred string
		open           *accel.Conn
	}
	var leases []*lease
	for _, p := range []api.PrepareRequest{
		{LeaseID: "acc-dedicated", Offset: 0, Export: "rlc_dedicated.0"},
		{LeaseID: "acc-shared", Offset: api.SlotUnits, Export: "rlc_shared.0", Mode: api.ModeShared, Gateway: true},
	} {
		p.Kind, p.DeviceName, p.Length, p.Role, p.ExpiresAt = api.KindAccel, "gpu", api.SlotUnits, "echo", clk.Now().Add(time.Minute)
		resp, err := a.Prepare(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		c, addr, cred := dialAccel(ctx, t, resp.URI)
		leases = append(leases, &lease{id: p.LeaseID, addr: addr, cred: cred, open: c})
	}

	// Renewed while served: the data planes serve past the old expiry.
	exp := renewPastOldExpiry(ctx, t, a, cp, clk, "acc-dedicated", "acc-shared")
	for _, l := range leases {
		if out, err := l.open.Call(ctx, "echo", []byte("renewed")); err != nil || string(out) != "renewed" {
			t.Fatalf("%s: a renewed lease refused a call past its old expiry: %q %v", l.id, out, err)
		}
	}

	// The control plane goes away; the stop at the expiry is held up.
	release := expireWithStopHeld(t, a, cp, clk, exp)
	for _, l := range leases {
		if _, err := l.open.Call(ctx, "echo", []byte("late")); err == nil {
			t.Errorf("%s: a connection opened before the expiry still calls after it", l.id)
		}
		late, err := accel.Dial(ctx, l.addr, []byte(l.cred))
		if err != nil {
			t.Fatalf("%s: %v", l.id, err) // not stopped yet: the HELLO is answered
		}
		defer late.Close()
		if _, err := late.Call(ctx, "echo", []byte("late")); err == nil {
			t.Errorf("%s: a call after the expiry was served", l.id)
		}
	}
	if err := leases[0].open.WriteMem(ctx, 0, []byte("late")); err == nil {
		t.Error("a dedicated slot's memory was written after the expiry")
	}
	if n := testutil.ToFloat64(a.mSuspends.WithLabelValues("accel")); n != 0 {
		t.Fatalf("%v stops counted: the stop was not held up", n)
	}
	release()
}

// TestExpiredNICLeaseRefusedBeforeItsStop is
// TestExpiredBlockLeaseRefusedBeforeItsStop for a NIC lease: its lender
// drops the lease's packets from the known expiry on, on the session
// opened before it, and ends that session with the reason, which the
// borrower reports; the borrower's new session is refused likewise — all
// before the agent's stop (the lease's teardown at the lender) has come.
func TestExpiredNICLeaseRefusedBeforeItsStop(t *testing.T) {
	lab, out := nicLab(t)
	cp, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 13, 40, 0, 0, time.UTC))
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Listen = lab.Gateway().String() // the NIC endpoint the borrower's host reaches
	cfg.Devices = append(cfg.Devices, DeviceConfig{Name: "wan", Kind: api.KindNIC, Path: "wan0", Size: 125_000_000})
	cfg.Drivers = map[api.Kind]Driver{api.KindNIC: nsNICDriver{NICDriver: NewNICDriver(slog.New(slog.DiscardHandler)), lab: lab, host: 1}}
	cfg.Clock = clk
	cfg.HeartbeatInterval = time.Hour
	a := start(t, cfg).a
	ctx := ctxFor(t)
	resp, err := a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-n", Kind: api.KindNIC, DeviceName: "wan",
		Length: 2_000_000, Export: "x_lease-n-0123456789abcdef", ExpiresAt: clk.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	u, err := nic.ParseURI(resp.URI)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logtest.Buffer{}
	var ifc *nic.Interface
	if err := lab.Do(0, func() error {
		var err error
		ifc, err = nic.Attach(ctx, nic.Config{Members: []nic.Member{u.Member()}, Name: "rnic0",
			Routes: []netip.Prefix{netip.PrefixFrom(out.Server, 32)}, Logger: slog.New(slog.NewTextHandler(logs, nil)),
			Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return lab.Dial(ctx, 0, network, addr)
			}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer lab.Do(0, ifc.Close)
	ping := func() bool {
		return lab.Command(ctx, 0, "busybox", "ping", "-c", "1", "-W", "1", out.Server.String()).Run() == nil
	}
	if !ping() {
		t.Fatal("no ping through the lent NIC")
	}

	// Renewed while served: the data plane serves past the old expiry.
	exp := renewPastOldExpiry(ctx, t, a, cp, clk, "lease-n")
	if !ping() {
		t.Fatal("a renewed lease dropped a ping past its old expiry")
	}

	// The control plane goes away; the stop at the expiry is held up.
	release := expireWithStopHeld(t, a, cp, clk, exp)
	if ping() {
		t.Fatal("a session opened before the expiry still carries a ping after it")
	}
	reason := "lease lease-n expired at " + exp.UTC().Format(time.RFC3339Nano)
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	// The borrower's next session (it redials at once) is refused too.
	for m := ifc.Members()[0]; m.Up || !strings.Contains(m.Err, "nic: lease ended ("+reason+")"); m = ifc.Members()[0] {
		if time.Now().After(deadline) {
			t.Fatalf("the borrower's lender is %+v, want down, its redial refused: %s", m, reason)
		}
		<-tick.C
	}
	if said := `err="nic: lease ended: ` + reason + `"`; !strings.Contains(logs.String(), said) {
		t.Errorf("the borrower did not log its session's end with %s:\n%s", said, logs.String())
	}
	if ping() {
		t.Fatal("a ping crossed the lent NIC after the expiry")
	}
	if n := testutil.ToFloat64(a.mSuspends.WithLabelValues("nic")); n != 0 {
		t.Fatalf("%v stops counted: the stop was not held up", n)
	}
	release()
}

// renewPastOldExpiry has the control plane's heartbeat answer renew leases
// (prepared to expire a minute from now) to two minutes from now, then
// moves clk a second past their old expiry; it returns the new expiry.
func renewPastOldExpiry(ctx context.Context, t *testing.T, a *Agent, cp *fakeCP, clk *clock.Fake, leases ...string) time.Time {
	t.Helper()
	exp := clk.Now().Add(2 * time.Minute)
	expires := make(map[string]time.Time, len(leases))
	for _, id := range leases {
		expires[id] = exp
	}
	cp.set(func(f *fakeCP) { f.expires = expires })
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Advance(61 * time.Second)
	return exp
}

// expireWithStopHeld takes the control plane away and moves clk to exp
// while the agent's stop at the expiry is held up, as it can be on a
// loaded machine (enforceExpiry waits for the agent's other work). The
// stop goes ahead when release is called, or else when the test ends.
func expireWithStopHeld(t *testing.T, a *Agent, cp *fakeCP, clk *clock.Fake, exp time.Time) (release func()) {
	cp.set(func(f *fakeCP) { f.down = true })
	a.enforceMu.Lock()
	release = sync.OnceFunc(a.enforceMu.Unlock)
	t.Cleanup(release)
	clk.Advance(exp.Sub(clk.Now()))
	return release
}
