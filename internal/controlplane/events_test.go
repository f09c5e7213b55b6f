package controlplane

import (
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// The audit log is one tenant's business: a tenant sees the events of its
// own leases (and the cluster's: nodes, profiles), never another tenant's
// lease IDs, requests or failure reasons. The admin and nodes see all.
func TestEventsTenantIsolation(t *testing.T) {
	e := newEnv(t)
	e.join("n1", 1<<30)
	la, err := e.alice.CreateLease(e.ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := e.bob.CreateLease(e.ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.alice.ReleaseLease(e.ctx, la.ID); err != nil {
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
			evs, err := tc.c.Events(e.ctx, 0)
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
