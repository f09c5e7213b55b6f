package controlplane

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/placement"
)

// The audit log is one tenant's business: a tenant sees the events of its
// own leases (and the cluster's: nodes, profiles), never another tenant's
// lease IDs, requests or failure reasons. The admin and nodes see all.
func TestEventsTenantIsolation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	la, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := e.bob.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.alice.ReleaseLease(e.ctx(), la.ID); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		c           *api.Client
		sees, blind []string // lease IDs
	}{
		{"alice", e.alice, []string{la.ID}, []string{lb.ID}},
		{"bob", e.bob, []string{lb.ID}, []string{la.ID}},
		{"admin", e.admin, []string{la.ID, lb.ID}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := tc.c.Events(e.ctx(), 0)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			node := false
			for _, ev := range evs {
				seen[ev.Subject] = true
				node = node || ev.Type == "node.joined"
				for _, id := range tc.blind {
					if ev.Subject == id || strings.Contains(ev.Message, id) {
						t.Errorf("sees event %q of another tenant's lease %s: %q", ev.Type, id, ev.Message)
					}
				}
				if tc.name == "bob" && strings.Contains(ev.Message, "alice") {
					t.Errorf("sees alice in %q: %q", ev.Type, ev.Message)
				}
			}
			for _, id := range tc.sees {
				if !seen[id] {
					t.Errorf("does not see the events of lease %s", id)
				}
			}
			if !node {
				t.Error("does not see the node.joined event")
			}
		})
	}
}

// A plan tells its tenant how it would slow the running leases, but names
// only the tenant's own: another tenant's lease IDs stay hidden, as GET
// /v1/leases/{id} hides them.
func TestPlanHidesOtherTenantsLeases(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.joinModel("n1", placement.SMUFINModel, 64<<30)
	if _, err := e.admin.PutProfile(e.ctx(), seed000APIProfile()); err != nil {
		t.Fatal(err)
	}
	writer := api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 1 << 30, Bandwidth: placement.SMUFINWriterDemand, Work: 150e9}
	la, err := e.alice.CreateLease(e.ctx(), writer)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := e.bob.CreateLease(e.ctx(), writer)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := e.bob.Explain(e.ctx(), writer)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Impacts) != 2 {
		t.Fatalf("want the impact on both running leases: %+v", plan.Impacts)
	}
	own := false
	for _, im := range plan.Impacts {
		own = own || im.LeaseID == lb.ID
	}
	if !own {
		t.Errorf("bob's own lease %s is not named: %+v", lb.ID, plan.Impacts)
	}
	if s := fmt.Sprintf("%+v", plan); strings.Contains(s, la.ID) || strings.Contains(s, "alice") {
		t.Errorf("bob's plan names alice's lease %s:\n%s", la.ID, s)
	}
	// The plan a created lease keeps (placed with the cached index).
	lc, err := e.bob.CreateLease(e.ctx(), writer)
	if err != nil {
		t.Fatal(err)
	}
	if lc, err = e.bob.Lease(e.ctx(), lc.ID); err != nil {
		t.Fatal(err)
	}
	if lc.Plan == nil || len(lc.Plan.Impacts) == 0 {
		t.Fatalf("created lease has no impacts: %+v", lc.Plan)
	}
	if s := fmt.Sprintf("%+v", *lc.Plan); strings.Contains(s, la.ID) {
		t.Errorf("bob's lease's plan names alice's lease %s:\n%s", la.ID, s)
	}
}
