package controlplane

import (
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestLendersLearnExpiries: a lender's prepare request carries the lease's
// expiry (and the control plane's clock, and the call's bound, which the
// lender deducts from the time left), and each heartbeat answer lists the reported leases that are
// still wanted with their current expiry (a renewal shows up there);
// leases no longer wanted are torn down instead of listed.
func TestLendersLearnExpiries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j, node := e.join("n1", 1<<30)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	e.lender.mu.Lock()
	var prepared api.PrepareRequest
	for _, r := range e.lender.exports {
		if r.LeaseID == l.ID {
			prepared = r
		}
	}
	e.lender.mu.Unlock()
	if !prepared.ExpiresAt.Equal(l.ExpiresAt) || prepared.ExpiresAt.IsZero() || !prepared.Now.Equal(e.clock.Now()) {
		t.Fatalf("prepare request expiry %v at %v, lease expiry %v at %v", prepared.ExpiresAt, prepared.Now, l.ExpiresAt, e.clock.Now())
	}
	if want := e.srv.cfg.PrepareTimeout.Seconds(); prepared.TimeoutSeconds != want || want == 0 {
		t.Fatalf("prepare request bound %vs, want the prepare timeout, %vs", prepared.TimeoutSeconds, want)
	}
	gone, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.alice.ReleaseLease(e.ctx(), gone.ID); err != nil {
		t.Fatal(err)
	}

	beat := func() api.HeartbeatResponse {
		t.Helper()
		resp, err := node.Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok", Leases: []string{l.ID, gone.ID}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := beat()
	if !resp.Now.Equal(e.clock.Now()) {
		t.Fatalf("heartbeat answer stamped %v, clock %v", resp.Now, e.clock.Now())
	}
	if len(resp.Leases) != 1 || resp.Leases[0].ID != l.ID || !resp.Leases[0].ExpiresAt.Equal(l.ExpiresAt) {
		t.Fatalf("heartbeat leases %+v, want %s until %v", resp.Leases, l.ID, l.ExpiresAt)
	}
	if len(resp.Teardown) != 1 || resp.Teardown[0] != gone.ID {
		t.Fatalf("heartbeat teardown %v, want %s", resp.Teardown, gone.ID)
	}

	e.clock.Advance(30 * time.Second)
	r, err := e.alice.RenewLease(e.ctx(), l.ID, 120)
	if err != nil {
		t.Fatal(err)
	}
	if resp := beat(); len(resp.Leases) != 1 || !resp.Leases[0].ExpiresAt.Equal(r.ExpiresAt) {
		t.Fatalf("heartbeat leases after a renewal %+v, want expiry %v", resp.Leases, r.ExpiresAt)
	}
}
