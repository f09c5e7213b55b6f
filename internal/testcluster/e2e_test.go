package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestNodesJoinReady(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{})
	ctx := ctxT(t)
	nodes, err := c.Client().Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 3 {
		t.Fatalf("%d nodes", len(nodes))
	}
	for _, n := range nodes {
		if n.State != api.NodeReady || n.AgentURL == "" || n.Fingerprint.Cores == 0 || n.Fingerprint.MachineID == "" {
			t.Errorf("node %+v", n)
		}
	}
	devs, err := c.Client().Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 6 {
		t.Fatalf("%d devices", len(devs))
	}
	// Agents probe each other: links appear in the topology.
	c.Eventually("peer links", func() bool {
		c.Heartbeat()
		top, err := c.Client().Topology(ctx)
		if err != nil {
			t.Fatal(err)
		}
		peer := 0
		for _, l := range top.Links {
			if l.To != "controlplane" && l.RTTMicros > 0 {
				peer++
			}
		}
		return peer >= 6
	})
}

// createBlock creates a block lease and checks it is active.
func createBlock(t *testing.T, cl *api.Client, size int64, mode api.Mode) api.Lease {
	t.Helper()
	l, err := cl.CreateLease(ctxT(t), api.LeaseRequest{Kind: api.KindBlock, Size: size, Mode: mode})
	if err != nil {
		t.Fatalf("create lease: %v", err)
	}
	if l.State != api.LeaseActive || l.NodeID == "" || l.DeviceID == "" {
		t.Fatalf("lease %+v", l)
	}
	return l
}

func TestLeaseLifecycleServesBytes(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{})
	ctx := ctxT(t)
	l := createBlock(t, c.Client(), 16<<20, api.ModeShared)
	if l.URI == "" || l.Credential == "" {
		t.Fatalf("lease without URI or credential: %+v", l)
	}
	lender := c.NodeByID(l.NodeID)
	if lender == nil || !lender.Serves(l.ID) {
		t.Fatal("the lender does not serve the lease")
	}

	nc, err := nbd.DialURI(ctx, l.URI)
	if err != nil {
		t.Fatal(err)
	}
	if nc.Size() != 16<<20 {
		t.Errorf("export size %d", nc.Size())
	}
	want := bytes.Repeat([]byte("rialto!\n"), 512)
	if _, err := nc.WriteAt(want, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := nc.ReadAt(got, 1<<20); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back: %v", err)
	}
	nc.Close()

	// A wrong export name gets nothing.
	u, err := nbd.ParseURI(l.URI)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "guess", l.Credential + ".1", l.Credential} {
		if bad, err := nbd.Dial(ctx, u.Network, u.Address, name); err == nil {
			bad.Close()
			t.Errorf("export %q was served", name)
		}
	}

	rel, err := c.Client().ReleaseLease(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rel.State != api.LeaseReleased {
		t.Fatalf("released lease is %s", rel.State)
	}
	c.Eventually("export torn down", func() bool { return !lender.Serves(l.ID) })
	if nc, err := nbd.DialURI(ctx, l.URI); err == nil {
		nc.Close()
		t.Fatal("released export still served")
	}
	devs, _ := c.Client().Devices(ctx)
	for _, d := range devs {
		if d.Allocated != 0 {
			t.Errorf("device %s still has %d allocated", d.Name, d.Allocated)
		}
	}
	if _, err := c.Client().ReleaseLease(ctx, l.ID); err != nil && !api.IsCode(err, api.CodeConflict) {
		t.Errorf("second release: %v", err)
	}
}

func TestUnauthenticated(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1})
	ctx := ctxT(t)
	for _, tok := range []string{"", "nope", BootstrapToken} {
		_, err := c.ClientWithToken(tok).CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
		if !api.IsCode(err, api.CodeUnauthorized) && !api.IsCode(err, api.CodeForbidden) {
			t.Errorf("token %q: %v", tok, err)
		}
	}
	// Not even a failed lease on record (Leases lists only live ones).
	ls, err := c.Client().AllLeases(ctx)
	if err != nil {
		t.Fatalf("list leases: %v", err)
	}
	if len(ls) != 0 {
		t.Fatalf("rejected requests created leases: %v", leaseStates(ls))
	}
	// Agents answer only the control plane.
	a := c.Nodes[0].Agent()
	req, _ := http.NewRequest(http.MethodPost, a.AgentURL()+"/agent/v1/prepare", bytes.NewReader([]byte(`{}`)))
	req.Header.Set("Authorization", "Bearer "+AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("agent accepted a tenant token: %d", resp.StatusCode)
	}
}

// leaseStates is "ID state" per lease: what a failure message may show
// of leases (never their credentials).
func leaseStates(ls []api.Lease) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.ID + " " + string(l.State)
	}
	return out
}

func TestLenderRefusesPlacedElsewhere(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{})
	good := c.Nodes[2]
	c.Nodes[0].Faults().RefusePrepare.Store(true)
	c.Nodes[1].Faults().RefusePrepare.Store(true)
	for range 3 {
		l := createBlock(t, c.Client(), 8<<20, api.ModeShared)
		if l.NodeID != good.ID() {
			t.Fatalf("lease placed on %s, a refusing lender", l.NodeID)
		}
	}
}

func TestLenderIgnoresSkippedAfterTimeout(t *testing.T) {
	t.Parallel()
	// Short, as every silent lender is waited out; the good one prepares
	// a block lease, which takes microseconds.
	c := Start(t, Options{PrepareTimeout: 2 * time.Second})
	good := c.Nodes[1]
	c.Nodes[0].Faults().IgnorePrepare.Store(true)
	c.Nodes[2].Faults().IgnorePrepare.Store(true)
	start := time.Now()
	l := createBlock(t, c.Client(), 8<<20, api.ModeShared)
	if l.NodeID != good.ID() {
		t.Fatalf("lease placed on %s, a silent lender", l.NodeID)
	}
	t.Logf("placed after %v", time.Since(start))
}

func TestAllLendersRefuseFailsCleanly(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2})
	ctx := ctxT(t)
	for _, n := range c.Nodes {
		n.Faults().RefusePrepare.Store(true)
	}
	_, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code == api.CodeInternal {
		t.Fatalf("create with no willing lender: %v", err)
	}
	t.Logf("error: %v", err)
	devs, err := c.Client().Devices(ctx)
	if err != nil || len(devs) != 4 { // 2 nodes, 2 disks each
		t.Fatalf("devices: %d, %v", len(devs), err)
	}
	for _, d := range devs {
		if d.Allocated != 0 {
			t.Errorf("device %s left with %d allocated", d.Name, d.Allocated)
		}
	}
	// The refused request's lease is on record, and over (Leases would
	// list only live leases: use the whole history).
	ls, err := c.Client().AllLeases(ctx)
	if err != nil || len(ls) != 1 {
		t.Fatalf("leases: %v, %v", leaseStates(ls), err)
	}
	if !ls[0].State.Terminal() {
		t.Errorf("lease %s left %s", ls[0].ID, ls[0].State)
	}
	// Once a lender is willing again, the same request succeeds.
	c.Nodes[0].Faults().RefusePrepare.Store(false)
	createBlock(t, c.Client(), 8<<20, "")
}

func TestTTLExpiry(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{})
	ctx := ctxT(t)
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20, TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := c.Client().RenewLease(ctx, l.ID, 120)
	if err != nil {
		t.Fatal(err)
	}
	if !renewed.ExpiresAt.After(l.ExpiresAt) {
		t.Errorf("renew did not extend: %v -> %v", l.ExpiresAt, renewed.ExpiresAt)
	}
	c.Advance(90 * time.Second)
	c.Heartbeat()
	c.Sweep()
	if s := c.Lease(l.ID).State; s != api.LeaseActive {
		t.Fatalf("renewed lease is %s before its new expiry", s)
	}
	c.Advance(60 * time.Second)
	c.Heartbeat()
	c.Sweep()
	got := c.Lease(l.ID)
	if got.State != api.LeaseExpired || got.Reason == "" {
		t.Fatalf("lease after TTL: %s (%s)", got.State, got.Reason)
	}
	lender := c.NodeByID(l.NodeID)
	c.Eventually("expired export torn down", func() bool {
		c.Heartbeat()
		return !lender.Serves(l.ID)
	})
	if _, err := c.Client().RenewLease(ctx, l.ID, 60); !api.IsCode(err, api.CodeConflict) {
		t.Errorf("renewing an expired lease: %v", err)
	}
}

func TestNodeSuspectDownLeasesLostThenRejoin(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{})
	l := createBlock(t, c.Client(), 8<<20, api.ModeShared)
	victim := c.NodeByID(l.NodeID)
	victim.PauseHeartbeats(true)

	c.Advance(4 * time.Second) // past SuspectAfter
	c.Heartbeat()              // the others stay ready
	c.Sweep()
	if s := c.NodeState(victim.ID()); s != api.NodeSuspect {
		t.Fatalf("silent node is %s, want suspect", s)
	}
	if s := c.Lease(l.ID).State; s != api.LeaseActive {
		t.Fatalf("lease on a suspect node is %s", s)
	}
	for _, n := range c.Nodes {
		if n != victim && c.NodeState(n.ID()) != api.NodeReady {
			t.Fatalf("heartbeating node %s is not ready", n.Name)
		}
	}

	c.Advance(7 * time.Second) // past DownAfter
	c.Heartbeat()
	c.Sweep()
	if s := c.NodeState(victim.ID()); s != api.NodeDown {
		t.Fatalf("silent node is %s, want down", s)
	}
	got := c.Lease(l.ID)
	if got.State != api.LeaseLost || got.Reason == "" {
		t.Fatalf("lease on a down node: %s (%s)", got.State, got.Reason)
	}
	if !victim.Serves(l.ID) {
		t.Fatal("the partitioned agent stopped serving on its own")
	}

	// The node comes back: it reports the lease it still serves, the
	// control plane answers with a teardown, the node is ready again.
	victim.PauseHeartbeats(false)
	c.Eventually("stale export torn down on rejoin", func() bool {
		c.Heartbeat()
		return !victim.Serves(l.ID)
	})
	if s := c.NodeState(victim.ID()); s != api.NodeReady {
		t.Fatalf("rejoined node is %s", s)
	}
	if s := c.Lease(l.ID).State; s != api.LeaseLost {
		t.Fatalf("lost lease became %s", s)
	}
	// Its devices lend again.
	for range 4 {
		createBlock(t, c.Client(), 8<<20, api.ModeShared)
	}
}

func TestKilledAgentRestartsWithSameIdentity(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{})
	ctx := ctxT(t)
	l := createBlock(t, c.Client(), 8<<20, api.ModeShared)
	lender := c.NodeByID(l.NodeID)
	id := lender.ID()

	// A quick restart keeps the lease: the export is restored from the
	// state dir and the URI stays valid.
	lender.Restart()
	if lender.ID() != id {
		t.Fatalf("node ID changed across restart: %s -> %s", id, lender.ID())
	}
	if !lender.Serves(l.ID) {
		t.Fatal("export not restored after restart")
	}
	nc, err := nbd.DialURI(ctx, l.URI)
	if err != nil {
		t.Fatalf("URI dead after restart: %v", err)
	}
	nc.Close()
	nodes, _ := c.Client().Nodes(ctx)
	if len(nodes) != 3 {
		t.Fatalf("restart created a node: %d nodes", len(nodes))
	}

	// A long death loses the lease; the restarted agent is told to drop it.
	lender.Kill()
	// A heartbeat the killed agent sent just before it stopped may still be
	// in the server's hands and be stamped after the clock moves; so move
	// it past the grace period again until the sweep sees the silence. Each
	// round is a whole grace period without a beat from the lender.
	rounds := 0
	c.Eventually("lease of a killed lender lost", func() bool {
		rounds++
		c.Advance(11 * time.Second)
		c.Heartbeat()
		c.Sweep()
		return c.Lease(l.ID).State == api.LeaseLost
	})
	if rounds > 2 {
		t.Fatalf("lease of a killed lender lost only after %d grace periods", rounds)
	}
	lender.Restart()
	c.Eventually("lost lease torn down after restart", func() bool {
		c.Heartbeat()
		return !lender.Serves(l.ID)
	})
	if s := c.NodeState(id); s != api.NodeReady {
		t.Fatalf("restarted node is %s", s)
	}
}

func TestIdempotentCreate(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Tenants: []string{"alice", "bob"}})
	ctx := ctxT(t)
	alice := c.ClientWithToken(TenantToken("alice"))
	req := api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20, IdempotencyKey: "job-42"}
	a, err := alice.CreateLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := alice.CreateLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != b.ID {
		t.Fatalf("same key gave two leases: %s %s", a.ID, b.ID)
	}
	other := req
	other.Size = 16 << 20
	if _, err := alice.CreateLease(ctx, other); !api.IsCode(err, api.CodeConflict) {
		t.Errorf("same key, different request: %v", err)
	}
	// Keys are per tenant.
	bob := c.ClientWithToken(TenantToken("bob"))
	cb, err := bob.CreateLease(ctx, req)
	if err != nil || cb.ID == a.ID {
		t.Fatalf("bob's lease with alice's key: %v %v", cb.ID, err)
	}
	// Tenants do not see each other's leases.
	if _, err := bob.Lease(ctx, a.ID); err == nil {
		t.Error("bob sees alice's lease")
	}
	// Concurrent retries with one key give one lease.
	req.IdempotencyKey = "job-43"
	ids := make([]string, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l, err := alice.CreateLease(ctx, req); err == nil {
				ids[i] = l.ID
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != "" && id != ids[0] && ids[0] != "" {
			t.Fatalf("concurrent retries gave different leases: %v", ids)
		}
	}
}

func TestConcurrentCreatesNeverOverCommit(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{})
	ctx := ctxT(t)
	const workers = 20
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		leases []api.Lease
		fails  = map[string]int{}
	)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mode := api.ModeShared
			if i%5 == 0 {
				mode = api.ModeDedicated
			}
			l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 24 << 20, Mode: mode})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				var ae *api.Error
				if !errors.As(err, &ae) {
					t.Errorf("create: %v", err)
					return
				}
				fails[ae.Code]++
				return
			}
			leases = append(leases, l)
		}()
	}
	wg.Wait()
	t.Logf("%d leases granted, failures by code: %v", len(leases), fails)
	if len(leases) == 0 {
		t.Fatal("no lease granted")
	}
	if fails[api.CodeInternal] > 0 {
		t.Errorf("internal errors under concurrency: %d", fails[api.CodeInternal])
	}
	devs, err := c.Client().Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	capOf := map[string]int64{}
	for _, d := range devs {
		capOf[d.ID] = d.Capacity
		if d.Allocated > d.Capacity {
			t.Errorf("device %s over-committed: %d of %d", d.ID, d.Allocated, d.Capacity)
		}
	}
	type span struct{ off, end int64 }
	byDev := map[string][]span{}
	for _, l := range leases {
		if l.State != api.LeaseActive {
			t.Errorf("granted lease %s is %s", l.ID, l.State)
		}
		for _, p := range l.Parts {
			if p.Offset < 0 || p.Offset+p.Length > capOf[p.DeviceID] {
				t.Errorf("part outside its device: %+v", p)
			}
			byDev[p.DeviceID] = append(byDev[p.DeviceID], span{p.Offset, p.Offset + p.Length})
		}
	}
	for dev, spans := range byDev {
		sort.Slice(spans, func(i, j int) bool { return spans[i].off < spans[j].off })
		for i := 1; i < len(spans); i++ {
			if spans[i].off < spans[i-1].end {
				t.Errorf("device %s: overlapping parts %v and %v", dev, spans[i-1], spans[i])
			}
		}
	}
	// Every granted lease's export is served by its lender.
	for _, l := range leases {
		if n := c.NodeByID(l.NodeID); n == nil || !n.Serves(l.ID) {
			t.Errorf("lease %s not served", l.ID)
		}
	}
}

// countingLender counts prepares per node, to show the control plane asks
// the lender before activating.
type countingLender struct {
	controlplane.Lender
	mu sync.Mutex
	n  map[string]int
}

func (c *countingLender) Prepare(ctx context.Context, node api.Node, key string, req api.PrepareRequest) (api.PrepareResponse, error) {
	c.mu.Lock()
	c.n[node.ID]++
	c.mu.Unlock()
	return c.Lender.Prepare(ctx, node, key, req)
}

func TestTwoPhaseReservationAsksTheLender(t *testing.T) {
	t.Parallel()
	var cl *countingLender
	c := Start(t, Options{Lender: func(l controlplane.Lender) controlplane.Lender {
		cl = &countingLender{Lender: l, n: map[string]int{}}
		return cl
	}})
	l := createBlock(t, c.Client(), 4<<20, "")
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.n[l.NodeID] != 1 {
		t.Fatalf("prepares: %v", cl.n)
	}
	if fmt.Sprint(l.Parts[0].URI) != l.URI {
		t.Errorf("part URI %q vs lease URI %q", l.Parts[0].URI, l.URI)
	}
}
