package controlplane

import (
	"errors"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestReserverHolds: parts placed but not yet written (held) are avoided
// by the next placements, also after the view is reloaded from the store,
// until Release gives them back or Commit hands them to the store.
func TestReserverHolds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	r := e.srv.res
	req := api.LeaseRequest{Kind: api.KindBlock, Size: 512 << 20, Mode: api.ModeShared}
	place := func(id string) (api.Plan, error) {
		return r.Place(e.ctx(), hold{id: id, tenant: "alice", kind: api.KindBlock}, req, nil, e.clock.Now())
	}
	a, err := place("lease-a")
	if err != nil {
		t.Fatal(err)
	}
	r.Invalidate() // a join, a liveness change...: the view is reloaded without lease-a's write
	b, err := place("lease-b")
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != "lease-a" || b.ID != "lease-b" || len(a.Parts) != 1 || len(b.Parts) != 1 {
		t.Fatalf("plans %+v %+v", a, b)
	}
	if pa, pb := a.Parts[0], b.Parts[0]; pa.DeviceID == pb.DeviceID && pa.Offset < pb.Offset+pb.Length && pb.Offset < pa.Offset+pa.Length {
		t.Fatalf("a reload forgot a held part: %+v overlaps %+v", pa, pb)
	}
	r.Invalidate()
	if _, err := place("lease-c"); !errors.Is(err, ErrInfeasible) {
		t.Fatalf("device full of held parts: %v", err)
	}
	r.Release("lease-a") // its write was refused
	c, err := place("lease-c")
	if err != nil || c.Parts[0] != a.Parts[0] {
		t.Fatalf("released part not placed again: %v %+v, want %+v", err, c.Parts, a.Parts)
	}
	// After Commit the store is the authority: lease-b was never written,
	// so the next reload frees its part.
	r.Commit("lease-b")
	r.Invalidate()
	d, err := place("lease-d")
	if err != nil || d.Parts[0] != b.Parts[0] {
		t.Fatalf("committed part not reloaded from the store: %v %+v, want %+v", err, d.Parts, b.Parts)
	}
	// Nothing was written: the store knows of no lease.
	if ls, err := e.srv.st.Leases(e.ctx(), storeAll); err != nil || len(ls) != 0 {
		t.Fatalf("%v %+v", err, ls)
	}
}
