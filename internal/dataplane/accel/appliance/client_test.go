package appliance

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

func TestClient(t *testing.T) {
	a := start(t, Config{Slots: 2, SlotMemory: 4096, ManagementToken: "tok"})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	ctx := context.Background()
	c := NewClient(srv.URL, "tok", nil)
	if _, err := NewClient(srv.URL, "wrong", nil).Slots(ctx); err == nil {
		t.Fatal("wrong token accepted")
	}
	st, err := c.Load(ctx, 1, roles.Spec{Name: "wasm", Module: wasmtest.EchoModule()})
	if err != nil || st.Role != "wasm" || len(st.Entries) != 3 {
		t.Fatalf("load: %+v %v", st, err)
	}
	for _, tc := range []struct {
		err  error
		want error
	}{
		{func() error { _, err := c.Load(ctx, 5, roles.Spec{Name: "echo"}); return err }(), ErrNoSlot},
		{func() error { _, err := c.Load(ctx, 0, roles.Spec{Name: "npu"}); return err }(), roles.ErrUnknownRole},
		{func() error { _, err := c.Load(ctx, 0, roles.Spec{Name: "wasm", Module: []byte{0, 'a'}}); return err }(), roles.ErrBadModule},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%v, want %v", tc.err, tc.want)
		}
	}
	if err := c.SetCredential(ctx, 1, []byte("lease-1")); err != nil {
		t.Fatal(err)
	}
	addr, _ := a.Addr(1)
	conn, err := accel.Dial(ctx, addr, []byte("lease-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if out, err := conn.Call(ctx, "upper", []byte("ok")); err != nil || string(out) != "OK" {
		t.Fatalf("call %q %v", out, err)
	}
	if err := c.Reset(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Unload(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.SetCredential(ctx, 1, nil); err != nil {
		t.Fatal(err)
	}
	slots, err := c.Slots(ctx)
	if err != nil || len(slots) != 2 || slots[1].Leased || slots[1].Role != "" {
		t.Fatalf("slots %+v %v", slots, err)
	}
	if h, err := c.Health(ctx); err != nil || !h.Healthy {
		t.Fatalf("health %+v %v", h, err)
	}
	if info, err := c.Info(ctx); err != nil || len(info.Slots) != 2 {
		t.Fatalf("info %+v %v", info, err)
	}
}
