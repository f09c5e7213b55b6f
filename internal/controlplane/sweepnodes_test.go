package controlplane

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// leaseReads is a PostgreSQL store that counts the lease listings asked
// of it.
type leaseReads struct {
	*postgres.Store
	n atomic.Int64
}

func (s *leaseReads) Leases(ctx context.Context, f store.LeaseFilter) ([]api.Lease, error) {
	s.n.Add(1)
	return s.Store.Leases(ctx, f)
}

// TestSweepReadsGoneNodesLeasesOnce: the sweep reads the leases of the
// down and removed nodes in one listing, not one for each such node.
// Removed nodes are kept for good, so a cluster that has retired many
// nodes made each sweep (every heartbeat interval, on the elected
// replica) as many queries as it ever removed nodes.
func TestSweepReadsGoneNodesLeasesOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := &leaseReads{Store: openPG(ctx, t, pgtest.DB(t), 4)}
	clk := clock.NewFakeNow(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	srv, err := New(ctx, Config{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Clock: clk, BootstrapToken: bootTok,
		Tokens: []Token{{Token: adminTok, Tenant: "admin", Admin: true}}, HeartbeatInterval: time.Second, SuspectAfter: time.Minute, DownAfter: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	boot := api.NewClient(ts.URL, bootTok, nil)
	const nodes = 12
	var ids []string
	for i := range nodes {
		name := fmt.Sprintf("gone%d", i)
		jr, err := boot.Join(ctx, api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1",
			Fingerprint: api.Fingerprint{MachineID: "sw-" + name, Hostname: name, Cores: 2, MemoryBytes: 1 << 30},
			Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"}}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, jr.NodeID)
	}
	clk.Advance(3 * time.Minute)
	if err := srv.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	admin := api.NewClient(ts.URL, adminTok, nil)
	for _, id := range ids[:nodes/2] {
		if _, err := admin.RemoveNode(ctx, id, false); err != nil {
			t.Fatal(err)
		}
	}
	st.n.Store(0)
	if err := srv.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	// TTL expiry, interrupted work, and the down and removed nodes' leases.
	if n := st.n.Load(); n > 3 {
		t.Fatalf("a sweep listed leases %d times with %d nodes down and %d removed", n, nodes-nodes/2, nodes/2)
	}
}
