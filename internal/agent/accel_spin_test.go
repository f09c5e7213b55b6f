package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

// A shared lease's borrower controls its role: a Wasm module that never
// returns keeps an execution running on the lease's slot. Ending the lease
// must still end it — revoking the lease at the gateway cancels the
// execution, on the slot too — not wait for it forever (nor for the
// gateway's queue timeout, an hour here) while holding the driver, which
// would stop every other lease's prepare and teardown.
func TestAccelSharedTeardownInterruptsRunaway(t *testing.T) {
	_, srv := newFakeCP(t)
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Devices[1].Attributes["gateway_queue_timeout"] = "1h"
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "spin-1", Kind: api.KindAccel, Mode: api.ModeShared, DeviceName: "gpu",
		Offset: 0, Length: api.SlotUnits, Export: "rlc_spin.0", Role: "wasm", RoleConfig: &api.RoleConfig{Module: wasmtest.EchoModule()}, Gateway: true})
	if err != nil {
		t.Fatal(err)
	}
	c, _, _ := dialAccel(ctx, t, resp.URI)
	go func() { _, _ = c.Call(ctx, "spin", []byte("x")) }()
	app := r.a.drivers[api.KindAccel].(*AccelDriver).Appliance("gpu")
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for st, _ := app.Slot(0); st.InFlight == 0; st, _ = app.Slot(0) {
		select {
		case <-deadline:
			t.Fatal("the spinning call never reached the slot")
		case <-tick.C:
		}
	}
	done := make(chan error, 1)
	go func() { done <- r.a.Teardown(ctx, "spin-1") }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		// Rescue the agent so that the test can stop it: end the slot's
		// lease by hand, which interrupts the execution.
		_ = app.SetCredential(0, nil)
		<-done
		t.Fatal("Teardown of a shared lease waited for a runaway execution")
	}
	if st, _ := app.Slot(0); st.InFlight != 0 || st.Leased {
		t.Fatalf("slot after teardown: %+v", st)
	}
}

// When a shared lease ends, its slot leaves the gateway: another lease's
// execution running there is cancelled on that slot (which is never left
// running work of a lease that is not its own after the teardown) and runs
// again on another slot, instead of failing.
func TestAccelSharedLeavingSlotMovesOthersWork(t *testing.T) {
	_, srv := newFakeCP(t)
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Devices[1].Attributes["gateway_workers"] = "4"
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prep := func(lease string, slot int64, export string) (string, string) {
		resp, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: lease, Kind: api.KindAccel, Mode: api.ModeShared, DeviceName: "gpu",
			Offset: slot * api.SlotUnits, Length: api.SlotUnits, Export: export, Role: "wasm", RoleConfig: &api.RoleConfig{Module: wasmtest.EchoModule()}, Gateway: true})
		if err != nil {
			t.Fatal(err)
		}
		u, cred := accelURI(t, resp.URI)
		return u.Host, cred
	}
	prep("mv-a", 0, "rlc_mva.0")
	host, credB := prep("mv-b", 1, "rlc_mvb.0")
	b, err := accel.Dial(ctx, host, []byte(credB))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	app := r.a.drivers[api.KindAccel].(*AccelDriver).Appliance("gpu")
	inFlight := func(i int) int64 { st, _ := app.Slot(i); return st.InFlight }
	poll := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond) // polling, not synchronisation
		}
	}
	// Lease B's two runaway calls, one on each slot (the gateway sends an
	// execution to the least busy slot).
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	errs := make(chan error, 2)
	spin := func() { _, err := b.Call(bctx, "spin", []byte("x")); errs <- err }
	go spin()
	poll("B's first call on a slot", func() bool { return inFlight(0)+inFlight(1) == 1 })
	go spin()
	poll("B's calls on both slots", func() bool { return inFlight(0) == 1 && inFlight(1) == 1 })

	if err := r.a.Teardown(ctx, "mv-a"); err != nil {
		t.Fatal(err)
	}
	if st, _ := app.Slot(0); st.InFlight != 0 || st.Leased {
		t.Fatalf("lease A's slot after its teardown: %+v", st)
	}
	select {
	case err := <-errs:
		t.Fatalf("lease B's call failed when lease A's slot left: %v", err)
	default:
	}
	// B's call moved to B's own slot; B giving up stops both there.
	poll("B's moved call on its slot", func() bool { return inFlight(1) >= 1 })
	bcancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("lease B's call: %v, want context.Canceled", err)
		}
	}
	poll("B's slot to stop", func() bool { return inFlight(1) == 0 })
}
