package controlplane

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/lifecycle"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// TestStateMachineStore drives leases into each state and checks that the
// store's compare-and-set allows exactly the lifecycle's transitions out
// of it (lifecycle.Allowed).
func TestStateMachineStore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 64<<30)
	alice := principal{role: roleTenant, tenant: "alice"}
	// reach returns a fresh lease in state st, driven there by the
	// lifecycle's events.
	reach := func(t *testing.T, st api.LeaseState) string {
		t.Helper()
		l, _, err := e.srv.createLease(e.ctx(), alice, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		path := map[api.LeaseState][]lifecycle.Event{
			api.LeaseActive: nil, api.LeaseReleasing: {lifecycle.Release{By: "alice"}},
			api.LeaseReleased: {lifecycle.Release{By: "alice"}, lifecycle.TornDown{}},
			api.LeaseLost:     {lifecycle.NodeDown{NodeID: l.NodeID, Name: "n1"}},
		}
		for _, ev := range path[st] {
			if l, _, err = e.srv.apply(e.ctx(), l, ev); err != nil {
				t.Fatal(err)
			}
		}
		if st == api.LeaseExpired {
			e.clock.Advance(2 * time.Hour)
			if l, _, err = e.srv.apply(e.ctx(), l, lifecycle.Expire{}); err != nil {
				t.Fatal(err)
			}
		}
		if l.State != st {
			t.Fatalf("reached %s, not %s", l.State, st)
		}
		return l.ID
	}
	for _, from := range []api.LeaseState{api.LeaseActive, api.LeaseReleasing, api.LeaseReleased, api.LeaseLost, api.LeaseExpired} {
		for _, to := range lifecycle.States {
			t.Run(string(from)+"→"+string(to), func(t *testing.T) {
				id := reach(t, from)
				_, err := e.srv.st.TransitionLease(e.ctx(), id, store.LeaseChange{From: lifecycle.Sources(to), To: to, At: e.clock.Now()}, api.Event{})
				want := lifecycle.Allowed(from, to)
				if want && err != nil {
					t.Fatalf("refused: %v", err)
				}
				if !want && !errors.Is(err, store.ErrConflict) {
					t.Fatalf("allowed or wrong error: %v", err)
				}
			})
		}
	}
}

func TestModesAndPartitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	e.join("n2", 1<<30)
	// Shared partitions on one device never overlap.
	var ls []api.Lease
	for i := 0; i < 4; i++ {
		l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 256 << 20, Mode: api.ModeShared})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	seen := map[int64]bool{}
	for _, l := range ls {
		if l.DeviceID != ls[0].DeviceID || seen[l.Parts[0].Offset] {
			t.Fatalf("unexpected placement %+v", l.Parts)
		}
		seen[l.Parts[0].Offset] = true
	}
	// The first device is full; dedicated takes the other one whole.
	d, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated})
	if err != nil {
		t.Fatal(err)
	}
	if d.Parts[0].Length != 1<<30 || d.DeviceID == ls[0].DeviceID {
		t.Fatalf("dedicated %+v", d.Parts)
	}
	// Nothing left.
	_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 4096})
	if !api.IsCode(err, api.CodeInfeasible) {
		t.Fatalf("want infeasible, got %v", err)
	}
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusUnprocessableEntity {
		t.Fatalf("status: %v", err)
	}
	// Free everything, then a composed lease spans both nodes.
	for _, l := range append(ls, d) {
		if _, err := e.alice.ReleaseLease(e.ctx(), l.ID); err != nil {
			t.Fatal(err)
		}
	}
	c, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 512 << 20, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != api.ModeComposed || len(c.Parts) != 2 || c.Parts[0].NodeID == c.Parts[1].NodeID || c.URI != "" || c.StripeUnit == 0 {
		t.Fatalf("composed %+v", c)
	}
	for i, p := range c.Parts {
		if !strings.HasSuffix(p.URI, "/"+partExport(c.Credential, i, 1)) {
			t.Fatalf("part %d URI does not carry the part's export name", i)
		}
	}
}

func TestExplainReservesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	p, err := e.alice.Explain(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 256 << 20})
	if err != nil || p.State != "feasible" || len(p.Parts) != 1 || p.ID != "" || len(p.Explanation) == 0 {
		t.Fatalf("%v %+v", err, p)
	}
	p, err = e.alice.Explain(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 2 << 30})
	if err != nil || p.State != "infeasible" || len(p.Explanation) == 0 {
		t.Fatalf("%v %+v", err, p)
	}
	ls, _ := e.admin.Leases(e.ctx())
	devs, _ := e.admin.Devices(e.ctx())
	if len(ls) != 0 || devs[0].Allocated != 0 {
		t.Fatalf("explain reserved something: %v %v", ls, devs)
	}
}

func TestLenderSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	e.join("n2", 1<<30)
	req := api.LeaseRequest{Kind: api.KindBlock, Size: 256 << 20}
	p, err := e.alice.Explain(e.ctx(), req)
	if err != nil {
		t.Fatal(err)
	}
	first := p.Parts[0].NodeID // placement's choice; make it refuse
	devs, _ := e.admin.Devices(e.ctx())
	other := devs[0].NodeID
	if other == first {
		other = devs[1].NodeID
	}
	e.lender.set(e.lender.refuse, first, true)
	l, err := e.alice.CreateLease(e.ctx(), req)
	if err != nil {
		t.Fatal(err)
	}
	if l.State != api.LeaseActive || l.NodeID != other {
		t.Fatalf("not re-placed: %+v", l)
	}
	// The refused placement was torn down as placement 1, and the lease
	// prepared again as placement 2: a late teardown leaves the new
	// exports (api.TeardownRequest.Placement).
	e.lender.mu.Lock()
	var tornAs []int
	for _, r := range e.lender.tornReqs {
		if r.LeaseID == l.ID {
			tornAs = append(tornAs, r.Placement)
		}
	}
	var preparedAs []int
	for _, r := range e.lender.exports {
		if r.LeaseID == l.ID {
			preparedAs = append(preparedAs, r.Placement)
		}
	}
	e.lender.mu.Unlock()
	if !slices.Equal(tornAs, []int{1}) || !slices.Equal(preparedAs, []int{2}) {
		t.Fatalf("torn down as placements %v (want [1]), prepared as %v (want [2])", tornAs, preparedAs)
	}
	// The answer carries the plan without its explanation; lease show
	// (and ?explain=1) has it.
	if l.Plan == nil || len(l.Plan.Explanation) != 0 || len(l.Plan.Parts) == 0 {
		t.Fatalf("create answered with the explanation: %+v", l.Plan)
	}
	if l, err = e.alice.Lease(e.ctx(), l.ID); err != nil || l.Plan == nil || !strings.Contains(strings.Join(l.Plan.Explanation, "\n"), "skipped node n") ||
		!strings.Contains(strings.Join(l.Plan.Explanation, "\n"), " ("+first+"): lender n") {
		t.Fatalf("plan does not explain the skip: %v %+v", err, l.Plan)
	}
	// A lender that never answers is skipped after PrepareTimeout (binpack
	// prefers the node that already carries a lease).
	e.lender.set(e.lender.refuse, first, false)
	e.lender.set(e.lender.hang, other, true)
	var l2 api.Lease
	err = e.alice.Do(e.ctx(), http.MethodPost, "/v1/leases?explain=1", req, &l2)
	if err != nil || l2.NodeID != first || l2.Plan == nil {
		t.Fatalf("%v %+v", err, l2)
	}
	if x := strings.Join(l2.Plan.Explanation, "\n"); !strings.Contains(x, " ("+other+"): lender ") || !strings.Contains(x, " gave no confirmation within") {
		t.Fatalf("plan does not explain the timeout: %s", x)
	}
	// Nobody confirms: the lease fails with the reasons, capacity is freed.
	e.lender.set(e.lender.refuse, first, true)
	_, err = e.alice.CreateLease(e.ctx(), req)
	if !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "did not confirm") {
		t.Fatalf("want unavailable, got %v", err)
	}
	ls, _ := e.alice.AllLeases(e.ctx())
	var failed int
	for _, x := range ls {
		if x.State == api.LeaseFailed {
			failed++
			if x.Reason == "" {
				t.Fatalf("failed lease without reason")
			}
		}
	}
	devs, _ = e.admin.Devices(e.ctx())
	var alloc int64
	for _, d := range devs {
		alloc += d.Allocated
	}
	if failed != 1 || alloc != 512<<20 {
		t.Fatalf("failed=%d allocated=%d", failed, alloc)
	}
}

func TestRenewAndExpire(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j, _ := e.join("n1", 1<<30)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, TTLSeconds: 10})
	if err != nil {
		t.Fatal(err)
	}
	keep, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, TTLSeconds: 10})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(8 * time.Second)
	r, err := e.alice.RenewLease(e.ctx(), keep.ID, 30)
	if err != nil || !r.ExpiresAt.Equal(e.clock.Now().Add(30*time.Second)) || r.State != api.LeaseActive {
		t.Fatalf("renew: %v %+v", err, r)
	}
	e.clock.Advance(3 * time.Second)
	// Keep the node alive across the jump.
	if _, err := e.boot.WithToken(j.Credential).Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"}); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	got, _ := e.alice.Lease(e.ctx(), l.ID)
	if got.State != api.LeaseExpired || !strings.Contains(got.Reason, "TTL") {
		t.Fatalf("not expired: %+v", got)
	}
	if !strings.Contains(strings.Join(e.lender.tornDown(), " "), l.ID) {
		t.Fatalf("expired lease not torn down: %v", e.lender.tornDown())
	}
	got, _ = e.alice.Lease(e.ctx(), keep.ID)
	if got.State != api.LeaseActive {
		t.Fatalf("renewed lease: %+v", got)
	}
	if _, err := e.alice.RenewLease(e.ctx(), l.ID, 10); !api.IsCode(err, api.CodeConflict) {
		t.Fatalf("renewing an expired lease: %v", err)
	}
	if _, err := e.alice.ReleaseLease(e.ctx(), l.ID); !api.IsCode(err, api.CodeConflict) {
		t.Fatalf("releasing an expired lease: %v", err)
	}
	if _, err := e.alice.RenewLease(e.ctx(), keep.ID, 1<<40); !api.IsCode(err, api.CodeInvalid) {
		t.Fatalf("huge ttl: %v", err)
	}
	r1, err := e.alice.ReleaseLease(e.ctx(), keep.ID)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := e.alice.ReleaseLease(e.ctx(), keep.ID)
	if err != nil || r1.State != api.LeaseReleased || r2.State != api.LeaseReleased {
		t.Fatalf("release twice: %v %+v %+v", err, r1, r2)
	}
}

// TestNoOverCommit races many borrowers for few devices.
func TestNoOverCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30, 1<<30)
	e.join("n2", 1<<30)
	const workers, per = 24, 6 // 144 requests for 12 slots of 256 MiB
	var mu sync.Mutex
	active := map[string]api.Lease{}
	var wg sync.WaitGroup
	errs := make(chan error, workers*per)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 256 << 20, Mode: api.ModeShared})
				switch {
				case err == nil:
					mu.Lock()
					active[l.ID] = l
					mu.Unlock()
				case api.IsCode(err, api.CodeInfeasible), api.IsCode(err, api.CodeUnavailable):
				default:
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(active) != 12 {
		t.Fatalf("%d leases active, want exactly 12", len(active))
	}
	type rng struct{ off, end int64 }
	byDev := map[string][]rng{}
	for _, l := range active {
		for _, p := range l.Parts {
			for _, r := range byDev[p.DeviceID] {
				if p.Offset < r.end && r.off < p.Offset+p.Length {
					t.Fatalf("overlap on %s", p.DeviceID)
				}
			}
			byDev[p.DeviceID] = append(byDev[p.DeviceID], rng{p.Offset, p.Offset + p.Length})
		}
	}
	devs, _ := e.admin.Devices(e.ctx())
	for _, d := range devs {
		if d.Allocated != d.Capacity {
			t.Fatalf("device %s allocated %d of %d", d.Name, d.Allocated, d.Capacity)
		}
	}
	// Release and create concurrently: still never over the capacity.
	var wg2 sync.WaitGroup
	for _, l := range active {
		wg2.Add(2)
		go func() {
			defer wg2.Done()
			if _, err := e.alice.ReleaseLease(e.ctx(), l.ID); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg2.Done()
			e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 512 << 20, Mode: api.ModeShared})
		}()
	}
	wg2.Wait()
	devs, _ = e.admin.Devices(e.ctx())
	for _, d := range devs {
		if d.Allocated > d.Capacity || d.Allocated < 0 {
			t.Fatalf("device %s allocated %d of %d", d.Name, d.Allocated, d.Capacity)
		}
	}
}

func TestIdempotency(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	req := api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, IdempotencyKey: "job-42"}
	a, err := e.alice.CreateLease(e.ctx(), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.alice.CreateLease(e.ctx(), req)
	if err != nil || b.ID != a.ID || b.Credential != a.Credential {
		t.Fatalf("replay: %v %s %s", err, a.ID, b.ID)
	}
	// Concurrent replays all get the same lease.
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 2 << 20, IdempotencyKey: "job-43"})
			if err != nil {
				t.Error(err)
			}
			ids[i] = l.ID
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent replays got different leases: %v", ids)
		}
	}
	req.Size = 2 << 20
	if _, err := e.alice.CreateLease(e.ctx(), req); !api.IsCode(err, api.CodeConflict) {
		t.Fatalf("different body, same key: %v", err)
	}
	// Another tenant's key space is separate.
	req.Size = 1 << 20
	c, err := e.bob.CreateLease(e.ctx(), req)
	if err != nil || c.ID == a.ID {
		t.Fatalf("bob: %v %s", err, c.ID)
	}
	// Header and body keys must agree.
	var out api.Lease
	err = e.alice.Do(e.ctx(), "POST", "/v1/leases", api.LeaseRequest{Kind: api.KindBlock, Size: 1, IdempotencyKey: "x"}, &out, "Idempotency-Key", "y")
	if !api.IsCode(err, api.CodeInvalid) {
		t.Fatalf("mismatched keys: %v", err)
	}
	// A retry of a creation that took the last of the capacity gets its
	// lease, not "no room".
	full := api.LeaseRequest{Kind: api.KindBlock, Size: 1<<30 - 4<<20, IdempotencyKey: "job-44"}
	d, err := e.alice.CreateLease(e.ctx(), full)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := e.alice.CreateLease(e.ctx(), full); err != nil || r.ID != d.ID {
		t.Fatalf("replay of the creation that filled the device: %v %s %s", err, d.ID, r.ID)
	}
	ls, _ := e.admin.Leases(e.ctx())
	if len(ls) != 4 {
		t.Fatalf("%d leases, want 4", len(ls))
	}
}

// TestLeasesLive: GET /v1/leases lists history by default; live=1 only
// the leases holding devices, and a state filter narrows either.
func TestLeasesLive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	req := api.LeaseRequest{Kind: api.KindBlock, Size: 64 << 20}
	a, err := e.alice.CreateLease(e.ctx(), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.alice.CreateLease(e.ctx(), req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.alice.ReleaseLease(e.ctx(), a.ID); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", []string{a.ID, b.ID}},
		{"?live=1", []string{b.ID}},
		{"?live=true&state=active", []string{b.ID}},
		{"?live=1&state=released", nil},
		{"?live=0", []string{a.ID, b.ID}},
		{"?state=released", []string{a.ID}},
	} {
		var ls []api.Lease
		if err := e.alice.Do(e.ctx(), "GET", "/v1/leases"+c.query, nil, &ls); err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		var got []string
		for _, l := range ls {
			got = append(got, l.ID)
		}
		slices.Sort(got)
		slices.Sort(c.want)
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Fatalf("%s: %v, want %v", c.query, got, c.want)
		}
	}
	var ls []api.Lease
	if err := e.alice.Do(e.ctx(), "GET", "/v1/leases?live=maybe", nil, &ls); !api.IsCode(err, api.CodeInvalid) {
		t.Fatalf("live=maybe: %v", err)
	}
}

// An expiry decided on a lease read before its renewal does not end the
// renewed lease: the sweep reads the leases whose TTL ran out, the tenant
// renews one (a renewal of a lease the sweep has not expired yet is
// taken), then the sweep's write lands. The write's compare-and-set
// checks the expiry as well as the state.
func TestExpiryAfterRenewalLoses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j, _ := e.join("n1", 1<<30)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, TTLSeconds: 10})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(11 * time.Second)
	if _, err := e.boot.WithToken(j.Credential).Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"}); err != nil {
		t.Fatal(err)
	}
	read, err := e.srv.st.Leases(e.ctx(), store.LeaseFilter{States: []api.LeaseState{api.LeaseActive}, ExpiresBefore: e.clock.Now()})
	if err != nil || len(read) != 1 {
		t.Fatalf("the sweep's read: %v %v", read, err)
	}
	r, err := e.alice.RenewLease(e.ctx(), l.ID, 60)
	if err != nil || r.State != api.LeaseActive {
		t.Fatalf("renew: %v %+v", err, r)
	}
	if _, _, err := e.srv.apply(e.ctx(), read[0], lifecycle.Expire{}); err == nil {
		t.Error("an expiry read before the renewal was written")
	}
	got, _ := e.alice.Lease(e.ctx(), l.ID)
	if got.State != api.LeaseActive {
		t.Fatalf("renewed lease is %s (%s)", got.State, got.Reason)
	}
	if td := e.lender.tornDown(); len(td) > 0 {
		t.Fatalf("renewed lease torn down: %v", td)
	}
}

// A reservation the sweep takes for interrupted is torn down only once
// the sweep's write has failed it: the pipeline preparing it (slow, or on
// another replica) may confirm it in the meantime, and a teardown before
// the write left an active lease whose lenders had torn it down and wiped
// it.
func TestInterruptedTornDownAfterItsWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j, _ := e.join("n1", 1<<30)
	r := &reservation{tenant: "alice", req: api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20}, now: e.srv.now(), skip: map[string]string{}, ttl: time.Hour}
	l, _, err := e.srv.reserve(e.ctx(), r, nil) // reserved; its prepare still under way
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Duration(prepareStaleFactor+1) * e.srv.cfg.PrepareTimeout)
	if _, err := e.boot.WithToken(j.Credential).Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"}); err != nil {
		t.Fatal(err)
	}
	var confirmed atomic.Bool
	e.lender.mu.Lock()
	e.lender.onTeardown = func(id string) {
		if confirmed.Swap(true) {
			return
		}
		// The pipeline's confirmation lands while the sweep tears down
		// (refused once the sweep's write is in: it tears down again).
		if cur, err := e.srv.st.Lease(e.ctx(), id); err == nil {
			e.srv.apply(e.ctx(), cur, lifecycle.Confirm{URIs: []string{"nbd://127.0.0.1/x"}})
		}
	}
	e.lender.mu.Unlock()
	e.srv.Sweep(e.ctx())
	got, err := e.srv.st.Lease(e.ctx(), l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if torn := strings.Join(e.lender.tornDown(), " "); got.State == api.LeaseActive && strings.Contains(torn, l.ID) {
		t.Fatalf("the lease is active and its lenders tore it down: %s", torn)
	}
}
