package postgres

import (
	"context"
	"strconv"
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
		text := genericPlan(ctx, t, s, name, q, args)
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

// genericPlan is the generic plan of q (EXPLAIN).
func genericPlan(ctx context.Context, t *testing.T, s *Store, name, q string, args []any) string {
	t.Helper()
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
	return strings.Join(plan, "\n")
}

// TestCreationPlans: on a fresh database, the generic plan of a
// creation checking its parts (checkedCreateSQL) and of the devices' lock
// look up every device, node and live part by index, never scanning a
// table: a connection keeps that plan however large the tables grow.
func TestCreationPlans(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openStore(ctx, t)
	at := time.Unix(1700000000, 0).UTC()
	for _, n := range []int{1, 3} {
		l := api.Lease{ID: "lease-x", State: api.LeaseReserved, Kind: api.KindBlock, Mode: api.ModeShared, Tenant: "t1", CreatedAt: at, UpdatedAt: at}
		var devs []string
		for i := range n {
			d := "dev-" + strconv.Itoa(i)
			l.Parts = append(l.Parts, api.Part{NodeID: "node-1", DeviceID: d, Offset: int64(i) << 20, Length: 1 << 20})
			devs = append(devs, d)
		}
		nl := store.NewLease{Lease: l, Event: api.Event{Type: "lease.reserved", Subject: l.ID, At: at}}
		q, args := createSQL(nl, s.OpTexts([]store.LeaseOp{{Create: &nl}})[0], true)
		name := strconv.Itoa(n) + " parts"
		text := genericPlan(ctx, t, s, name, q, args)
		for _, bad := range []string{"Seq Scan on devices", "Seq Scan on nodes", "Seq Scan on lease_parts", "parts_live_by_node"} {
			if strings.Contains(text, bad) {
				t.Errorf("%s: the generic plan has %s:\n%s", name, bad, text)
			}
		}
		if !strings.Contains(text, "parts_live_by_device") {
			t.Errorf("%s: the generic plan does not find live parts by device:\n%s", name, text)
		}
		t.Logf("%s:\n%s", name, text)
		for _, events := range []bool{false, true} {
			args := anys(devs)
			if events {
				args = append(args, lockClass, lockEvents)
			}
			text = genericPlan(ctx, t, s, "lock "+name, lockDevicesSQL(n, events), args)
			if strings.Contains(text, "Seq Scan") || !strings.Contains(text, "devices_pkey") {
				t.Errorf("lock %s: the generic plan does not lock the devices by key:\n%s", name, text)
			}
		}
	}
}
