package agent

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

// Two shared leases that upload the same Wasm module share a gateway and
// its slot: their executions run on that slot's instances of the module.
// A module can return memory it did not write in the call (what an earlier
// call's input left there): no lease may read, that way, bytes of another
// lease — one still running, or one that ended — which an instance reused
// across executions would show.
func TestAccelSharedWasmInstancesIsolateLeases(t *testing.T) {
	_, srv := newFakeCP(t)
	r := start(t, testConfig(srv.URL, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const q = api.SlotUnits / 4
	dial := func(lease string, off int64) *accel.Conn {
		t.Helper()
		resp, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: lease, Kind: api.KindAccel, Mode: api.ModeShared, DeviceName: "gpu",
			Offset: off, Length: q, Export: "rlc_" + lease + ".0", Role: "wasm",
			RoleConfig: &api.RoleConfig{Module: wasmtest.DumpModule()}, Gateway: true})
		if err != nil {
			t.Fatal(err)
		}
		c, _, _ := dialAccel(ctx, t, resp.URI)
		return c
	}
	pristine := make([]byte, wasmtest.DumpLen)
	// dump, called with an empty input, writes nothing: it shows what the
	// instance's memory held before the call.
	dump := func(who string, c *accel.Conn, secret []byte) {
		t.Helper()
		out, err := c.Call(ctx, "dump", nil)
		if err != nil {
			t.Fatalf("%s dump: %v", who, err)
		}
		if bytes.Contains(out, secret) {
			t.Errorf("%s reads another lease's input from the module's memory: %q", who, out)
		} else if !bytes.Equal(out, pristine) {
			t.Errorf("%s's dump is %q, want the module's initial memory (zeros)", who, out)
		}
	}
	a := dial("iso-a", 0)
	b := dial("iso-b", q)
	drv := r.a.drivers[api.KindAccel].(*AccelDriver)
	if gs := drv.Gateways(); len(gs) != 1 || gs[0].Leases != 2 || gs[0].Slots != 1 {
		t.Fatalf("two shares of one slot, one module: gateways %+v", gs)
	}

	secret := []byte("lease A's secret input, 0123456789")
	if out, err := a.Call(ctx, "echo", secret); err != nil || !bytes.Equal(out, secret) {
		t.Fatalf("A echo: %q %v", out, err)
	}
	dump("lease B", b, secret)

	// A ends; C takes A's share of the same slot at the same gateway.
	secret2 := []byte("lease A's last input before it ends")
	if out, err := a.Call(ctx, "echo", secret2); err != nil || !bytes.Equal(out, secret2) {
		t.Fatalf("A echo: %q %v", out, err)
	}
	if err := r.a.Teardown(ctx, "iso-a"); err != nil {
		t.Fatal(err)
	}
	c := dial("iso-c", 0)
	if gs := drv.Gateways(); len(gs) != 1 || gs[0].Leases != 2 || gs[0].Slots != 1 {
		t.Fatalf("B and C on A's gateway and slot: gateways %+v", gs)
	}
	dump("lease C (after A ended)", c, secret2)
	dump("lease B (after A ended)", b, secret2)

	// The other way round: B does not see C's input either.
	secret3 := []byte("lease C's input, 0123456789abcdef")
	if outs, err := c.CallBatch(ctx, "echo", [][]byte{secret3, secret3}); err != nil || len(outs) != 2 || !bytes.Equal(outs[1], secret3) {
		t.Fatalf("C echo: %q %v", outs, err)
	}
	dump("lease B (after C)", b, secret3)
}
