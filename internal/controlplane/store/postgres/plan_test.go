package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// TestTransitionPlans: on a fresh database (tables empty and never
// analyzed), the generic plan of every shape of transition statement
// finds the lease and its parts by primary key, never by the tenant's
// index or a partial index of live parts, which a cached plan would then
// scan in full on every release (planGuard).
func TestTransitionPlans(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openStore(ctx, t)
	at := time.Unix(1700000000, 0).UTC()
	ev := api.Event{Type: "lease.test", Subject: "lease-x", At: at}
	cases := map[string]store.LeaseChange{
		"release by a tenant": {From: []api.LeaseState{api.LeaseActive}, To: api.LeaseReleasing, Tenant: "t1", At: at},
		"released":            {From: []api.LeaseState{api.LeaseReleasing}, To: api.LeaseReleased, At: at},
		"parts lost":          {From: []api.LeaseState{api.LeaseActive}, To: api.LeaseActive, LostParts: []int{0}, At: at},
		"activation":          {From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseActive, URIs: []string{"nbd://x"}, At: at},
	}
	for name, ch := range cases {
		q, args := transitionSQL(store.Transition{ID: "lease-x", Change: ch, Event: ev}, "")
		var plan []string
		err := s.onConn(ctx, "connection", func(c *pgx.Conn) error {
			if _, err := c.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
				return err
			}
			defer c.Exec(ctx, "RESET plan_cache_mode")
			rows, err := c.Query(ctx, "EXPLAIN "+q, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					return err
				}
				plan = append(plan, line)
			}
			return rows.Err()
		})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		text := strings.Join(plan, "\n")
		for _, bad := range []string{"leases_by_tenant", "leases_by_state", "parts_live_by_node", "parts_live_by_device", "Seq Scan on leases", "Seq Scan on lease_parts"} {
			if strings.Contains(text, bad) {
				t.Errorf("%s: the generic plan uses %s:\n%s", name, bad, text)
			}
		}
		if !strings.Contains(text, "leases_pkey") {
			t.Errorf("%s: the generic plan does not find the lease by its key:\n%s", name, text)
		}
	}
}
