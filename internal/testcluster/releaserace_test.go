package testcluster

import (
	"context"
	"sync"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/metrics"
)

// teardownCounter counts the control plane's full teardowns (placement 0:
// every export of the lease, its block ranges wiped) per lease, on the
// real lender.
type teardownCounter struct {
	controlplane.Lender
	mu sync.Mutex
	n  map[string]int
}

func (c *teardownCounter) Teardown(ctx context.Context, node api.Node, key string, req api.TeardownRequest) error {
	if req.Placement == 0 {
		c.mu.Lock()
		c.n[req.LeaseID]++
		c.mu.Unlock()
	}
	return c.Lender.Teardown(ctx, node, key, req)
}

func (c *teardownCounter) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// TestConcurrentReleases: releases of one lease sent at once all succeed
// (a release of a releasing or released lease returns it), all answer
// the same final state, and the lease is torn down, and its range wiped,
// once.
func TestConcurrentReleases(t *testing.T) {
	t.Parallel()
	var tc *teardownCounter
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 32 << 20},
	}, Lender: func(l controlplane.Lender) controlplane.Lender {
		tc = &teardownCounter{Lender: l, n: map[string]int{}}
		return tc
	}})
	cl := c.Client()
	ctx := ctxT(t)
	for round := range 4 {
		l := createBlock(t, cl, 32<<20, api.ModeDedicated)
		const n = 12
		var wg sync.WaitGroup
		start := make(chan struct{})
		got := make([]api.Lease, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				got[i], errs[i] = cl.ReleaseLease(ctx, l.ID)
			}()
		}
		close(start)
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("round %d: release %d of %d sent at once: %v", round, i, n, errs[i])
			}
			if got[i].State != api.LeaseReleased || got[i].ID != l.ID {
				t.Errorf("round %d: release %d answered lease %s %s, want %s released", round, i, got[i].ID, got[i].State, l.ID)
			}
		}
		if s := c.Lease(l.ID).State; s != api.LeaseReleased {
			t.Fatalf("round %d: the lease after the releases: %s", round, s)
		}
		if k := tc.count(l.ID); k != 1 {
			t.Errorf("round %d: the lenders were told to tear the lease down (and wipe it) %d times, want once", round, k)
		}
	}
	if v, _ := metrics.Value(c.Nodes[0].Agent().Metrics(), "rialto_agent_wipes_total", "result", "ok"); v != 4 {
		t.Errorf("wipes: %v, want 4 (one per lease)", v)
	}
}
