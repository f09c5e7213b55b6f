package controlplane

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// TestReloadedQuotaBindsTheStore: on a shared store (replicas on
// PostgreSQL), where the store re-checks a tenant's quota in the lease's
// own write, a reload's quotas are the ones that write checks. A quota
// raised by a reload let placement choose a lease that the store then
// refused (429 quota_exceeded) under the quota the control plane started
// with, until a restart; one lowered was bound only by placement. A real
// agent lends the device.
func TestReloadedQuotaBindsTheStore(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := openPG(ctx, t, pgtest.DB(t), 4)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tokens := []Token{{Token: aliceTok, Tenant: "alice"}}
	srv := runServer(ctx, t, Config{Store: st, Logger: log, BootstrapToken: bootTok, Tokens: tokens, PrepareTimeout: 10 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond, Quotas: Quotas{Tenants: map[string]Quota{"alice": {Leases: 1}}}})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	a := newTestAgent(t, diskAgentConfig(t, ts.URL, log))
	a.launch(nil)
	a.waitReady()

	alice := api.NewClient(ts.URL, aliceTok, nil)
	small := api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20}
	if _, err := alice.CreateLease(ctx, small); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.CreateLease(ctx, small); !api.IsCode(err, api.CodeQuota) {
		t.Fatalf("a second lease under leases=1: %v", err)
	}
	if err := srv.Reload(ctx, Settings{BootstrapToken: bootTok, Tokens: tokens, Quotas: Quotas{Tenants: map[string]Quota{"alice": {Leases: 3}}}}); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 3; i++ {
		if l, err := alice.CreateLease(ctx, small); err != nil || l.State != api.LeaseActive {
			t.Fatalf("lease %d under the reloaded leases=3: %+v %v", i, l, err)
		}
	}
	if _, err := alice.CreateLease(ctx, small); !api.IsCode(err, api.CodeQuota) {
		t.Fatalf("a fourth lease under the reloaded leases=3: %v", err)
	}
}
