package controlplane

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
)

// TestForcedRemovalTeardownsBounded: a forced removal of a node whose
// real agent lends many leases tells the agent to tear every one of them
// down, maxRemovedTeardowns calls at a time: with every wipe held at the
// agent, maxRemovedTeardowns teardowns are under way there and the others
// wait in the control plane for a slot; once the wipes go on, every lease
// is torn down (and wiped) before the removal answers. The removal sent
// them all at once, one call (and connection) each.
func TestForcedRemovalTeardownsBounded(t *testing.T) {
	t.Parallel()
	const leases = 3 * maxRemovedTeardowns
	e := newLostRangeEnv(t, false)
	ctx := e.ctx()

	var mu sync.Mutex
	held, most := 0, 0
	wiped := map[string]int{}
	release := make(chan struct{})
	e.launch(func(a *agent.Agent) {
		f := func(ctx context.Context, lease string) {
			mu.Lock()
			held++
			most = max(most, held)
			wiped[lease]++
			mu.Unlock()
			select {
			case <-release:
			case <-ctx.Done():
			}
			mu.Lock()
			held--
			mu.Unlock()
		}
		a.Faults.BeforeWipe.Store(&f)
	})
	e.waitReady()
	alice := api.NewClient(e.url, aliceTok, nil)
	var ids []string
	for range leases {
		l, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, l.ID)
	}
	node := e.agent.NodeID()
	// Its heartbeats, refused (404) once the node is removed, would have
	// it join again, as the same node with a new agent key, which the
	// teardowns still to come would not present: those leases would be
	// torn down by the answers to its heartbeats then, not by the
	// removal's calls this test counts.
	e.agent.PauseHeartbeats(true)

	type result struct {
		r   api.NodeRemoval
		err error
	}
	removed := make(chan result, 1)
	go func() { // waited for below
		r, err := api.NewClient(e.url, adminTok, nil).RemoveNode(ctx, node, true)
		removed <- result{r, err}
	}()
	// Every teardown either under way at the agent (its wipe held) or
	// waiting for a slot: none beyond the bound reaches the agent.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		mu.Lock()
		h := held
		mu.Unlock()
		w := e.srv.removed.waiting(node)
		if h > maxRemovedTeardowns {
			close(release)
			t.Fatalf("%d teardowns under way at the removed node's agent at once, want at most %d", h, maxRemovedTeardowns)
		}
		if h == maxRemovedTeardowns && w == leases-maxRemovedTeardowns {
			break
		}
		select {
		case r := <-removed:
			t.Fatalf("the removal returned (%v) with %d teardowns held at the agent and %d waiting", r.err, h, w)
		case <-ctx.Done():
			t.Fatalf("%d teardowns under way at the agent, %d waiting, want %d and %d", h, w, maxRemovedTeardowns, leases-maxRemovedTeardowns)
		case <-tick.C:
		}
	}
	close(release)
	var r result
	select {
	case r = <-removed:
	case <-ctx.Done():
		t.Fatal("the removal did not return once the wipes went on")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := slices.Sorted(slices.Values(r.r.Lost)); !slices.Equal(got, slices.Sorted(slices.Values(ids))) {
		t.Fatalf("the removal lost %d leases, want the %d on the node", len(got), len(ids))
	}
	mu.Lock()
	defer mu.Unlock()
	if most > maxRemovedTeardowns {
		t.Errorf("%d teardowns under way at the agent at once, want at most %d", most, maxRemovedTeardowns)
	}
	for _, id := range ids {
		if wiped[id] != 1 {
			t.Errorf("lease %s wiped %d times by the removal's teardowns, want once", id, wiped[id])
		}
	}
	if served := e.agent.Leases(); len(served) > 0 {
		t.Errorf("the removed node's agent still serves %d leases lost with it", len(served))
	}
	e.srv.removed.mu.Lock()
	kept := len(e.srv.removed.nodes)
	e.srv.removed.mu.Unlock()
	if w := e.srv.removed.waiting(node); w != 0 || kept != 0 {
		t.Errorf("after the removal: %d calls waiting, slots kept for %d nodes", w, kept)
	}
}
