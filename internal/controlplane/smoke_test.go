package controlplane

import (
	"testing"

	"github.com/rialto-project/rialto/api"
)

func TestLeaseCycleHTTP(t *testing.T) {
	e := newEnv(t)
	jr, _ := e.join("n1", 1<<30)
	l, err := e.alice.CreateLease(e.ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if l.State != api.LeaseActive || l.NodeID != jr.NodeID || l.URI == "" || l.Credential == "" || l.Mode != api.ModeShared {
		t.Fatalf("lease %+v", l)
	}
	r, err := e.alice.ReleaseLease(e.ctx, l.ID)
	if err != nil || r.State != api.LeaseReleased {
		t.Fatalf("release: %v %+v", err, r)
	}
	devs, err := e.alice.Devices(e.ctx)
	if err != nil || len(devs) != 1 || devs[0].Allocated != 0 {
		t.Fatalf("devices %v %+v", err, devs)
	}
}
