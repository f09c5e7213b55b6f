package robustness

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// metric reads one sample of a replica's /metrics (the line that starts
// with series, e.g. `rialto_controlplane_leader` or
// `rialto_forwarded_calls_total{outcome="forwarded"}`); -1 if it does
// not answer or lacks it.
func metric(url, series string) float64 {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// leaderOf waits until exactly one of rs (but skip) reports leading and
// returns its index.
func leaderOf(t *testing.T, rs []*replica, skip int, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		lead := -1
		n := 0
		for i, r := range rs {
			if i != skip && metric(r.url(), "rialto_controlplane_leader") == 1 {
				lead, n = i, n+1
			}
		}
		if n == 1 {
			return lead
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d replicas lead after %v, want 1", n, within)
		}
		time.Sleep(100 * time.Millisecond) // polling with a deadline
	}
}

const forwarded = `rialto_forwarded_calls_total{outcome="forwarded"}`

// TestPlacementLeaderForwarding: with three `rialto server` replicas on one
// PostgreSQL database, lease creations and releases sent to the replicas
// that do not lead are forwarded to the elected one, which places every
// lease (the others write no lease transition, and nobody loses a race for
// a device). When the leader is SIGKILLed, creations sent to a surviving
// replica keep succeeding (served locally while no leader is known, then
// forwarded to the new leader), and the new leader is elected and
// forwarded to within the failover bound.
func TestPlacementLeaderForwarding(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	_, rs := startReplicas(t, 3)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	lenders(t, ctx, addrList(rs))
	lead := leaderOf(t, rs, -1, 15*time.Second)

	// cycle creates and releases a lease through replica i alone (no
	// client-side failover), with an idempotency key.
	seq := 0
	cycle := func(i int) error {
		seq++
		c := api.NewClient(rs[i].url(), tokens["tenant-a"], nil)
		l, err := c.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: leaseSz, IdempotencyKey: fmt.Sprintf("fwd-%d", seq)})
		if err != nil {
			return fmt.Errorf("create through replica %d: %w", i, err)
		}
		if _, err := c.ReleaseLease(ctx, l.ID); err != nil {
			return fmt.Errorf("release %s through replica %d: %w", l.ID, i, err)
		}
		return nil
	}
	const n = 4
	for i := range rs {
		for range n {
			if err := cycle(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, r := range rs {
		fw := metric(r.url(), forwarded)
		active := metric(r.url(), `rialto_lease_transitions_total{state="active"}`)
		if i == lead {
			if fw != 0 {
				t.Errorf("the leader forwarded %v calls", fw)
			}
			if active < 3*n {
				t.Errorf("the leader activated %v leases, want all %d", active, 3*n)
			}
			if rt := metric(r.url(), "rialto_placement_retries_total"); rt != 0 {
				t.Errorf("the leader retried %v placements", rt)
			}
			continue
		}
		if fw < 2*n {
			t.Errorf("replica %d forwarded %v calls, want its %d creations and releases", i, fw, 2*n)
		}
		if active != 0 {
			t.Errorf("replica %d activated %v leases itself", i, active)
		}
	}

	// The leader dies; a surviving replica keeps serving creations.
	via := (lead + 1) % len(rs)
	before := metric(rs[via].url(), forwarded)
	rs[lead].kill()
	killed := time.Now()
	newLead := -1
	for time.Since(killed) < 15*time.Second {
		if err := cycle(via); err != nil {
			t.Fatalf("%v after the leader was killed: %v", time.Since(killed).Round(time.Millisecond), err)
		}
		if newLead < 0 {
			for i, r := range rs {
				if i != lead && metric(r.url(), "rialto_controlplane_leader") == 1 {
					newLead = i
					t.Logf("replica %d leads %v after the kill", i, time.Since(killed).Round(time.Millisecond))
				}
			}
		}
		if newLead >= 0 && newLead != via && metric(rs[via].url(), forwarded) > before {
			break // forwarding to the new leader
		}
		if newLead == via {
			break // the survivor leads: it places itself
		}
	}
	switch {
	case newLead < 0:
		t.Fatal("no replica leads 15 s after the leader was killed")
	case time.Since(killed) > 15*time.Second:
		t.Fatalf("replica %d never forwarded to the new leader %d", via, newLead)
	}
	if err := cycle(via); err != nil {
		t.Fatal(err)
	}
}

// TestClientsFollowPlacementLeader: a client that knows all three
// `rialto server` replicas learns the placement leader from the first
// forwarded answer and sends its later creations and releases to it
// directly (no replica forwards any more); when the leader is SIGKILLed,
// its calls keep succeeding (failover through the list) and it learns the
// new leader.
func TestClientsFollowPlacementLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	_, rs := startReplicas(t, 3)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	lenders(t, ctx, addrList(rs))
	lead := leaderOf(t, rs, -1, 15*time.Second)
	via := (lead + 1) % len(rs)
	// The client's list starts with a replica that does not lead.
	list := rs[via].url()
	for i, r := range rs {
		if i != via {
			list += "," + r.url()
		}
	}
	c := api.NewClient(list, tokens["tenant-a"], nil)
	cycle := func() error {
		l, err := c.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: leaseSz})
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		if _, err := c.ReleaseLease(ctx, l.ID); err != nil {
			return fmt.Errorf("release %s: %w", l.ID, err)
		}
		return nil
	}
	forwards := func(skip int) float64 {
		n := 0.0
		for i, r := range rs {
			if i != skip {
				n += max(metric(r.url(), forwarded), 0)
			}
		}
		return n
	}
	for range 4 {
		if err := cycle(); err != nil {
			t.Fatal(err)
		}
	}
	if fw := forwards(-1); fw != 1 {
		t.Errorf("%v calls forwarded, want 1 (the first creation)", fw)
	}

	rs[lead].kill()
	killed := time.Now()
	if err := cycle(); err != nil {
		t.Fatalf("%v after the leader was killed: %v", time.Since(killed).Round(time.Millisecond), err)
	}
	newLead := leaderOf(t, rs, lead, 15*time.Second)
	const activated = `rialto_lease_transitions_total{state="active"}`
	// Cycles until one goes to the new leader without a forward.
	for {
		before, placed := forwards(lead), metric(rs[newLead].url(), activated)
		if err := cycle(); err != nil {
			t.Fatalf("%v after the leader was killed: %v", time.Since(killed).Round(time.Millisecond), err)
		}
		if forwards(lead) == before && metric(rs[newLead].url(), activated) > placed {
			break
		}
		if time.Since(killed) > 20*time.Second {
			t.Fatal("calls still forwarded 20 s after the leader was killed")
		}
	}
	before := forwards(lead)
	for range 3 {
		if err := cycle(); err != nil {
			t.Fatal(err)
		}
	}
	if fw := forwards(lead); fw != before {
		t.Errorf("%v calls forwarded after the client learnt the new leader", fw-before)
	}
}
