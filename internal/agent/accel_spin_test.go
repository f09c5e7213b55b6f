package agent

import (
	"context"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

// A shared lease's borrower controls its role: a Wasm module that never
// returns keeps an execution running on the lease's slot. Ending the lease
// must still end it (interrupting the execution once the slot has had its
// gateway_queue_timeout to drain), not wait for it forever while holding
// the driver, which would stop every other lease's prepare and teardown.
func TestAccelSharedTeardownInterruptsRunaway(t *testing.T) {
	_, srv := newFakeCP(t)
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Devices[1].Attributes["gateway_queue_timeout"] = "200ms"
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "spin-1", Kind: api.KindAccel, Mode: api.ModeShared, DeviceName: "gpu",
		Offset: 0, Length: api.SlotUnits, Export: "rlc_spin.0", Role: "wasm", RoleConfig: &api.RoleConfig{Module: wasmtest.EchoModule()}, Gateway: true})
	if err != nil {
		t.Fatal(err)
	}
	u, cred := accelURI(t, resp.URI)
	c, err := accel.Dial(ctx, u.Host, []byte(cred))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
