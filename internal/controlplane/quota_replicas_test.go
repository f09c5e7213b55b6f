package controlplane

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// TestReloadedQuotaHoldsAcrossReplicas: two replicas share a PostgreSQL
// store, where each one's placement view may be stale (it has not seen
// the other's leases), and the store re-checks the tenant's quota
// atomically with each creation. A quota set by a reload is the one the
// store re-checks: a tenant at its quota through one replica is refused
// through the other, as with a quota configured at start.
func TestReloadedQuotaHoldsAcrossReplicas(t *testing.T) {
	t.Parallel()
	for _, reload := range []bool{false, true} {
		name := "configured at start"
		if reload {
			name = "set by a reload"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			url := pgtest.DB(t)
			lender := newFakeLender()
			quota := Quotas{Default: Quota{Leases: 1}}
			tokens := []Token{{Token: aliceTok, Tenant: "alice"}, {Token: bobTok, Tenant: "bob"}}
			replica := func() (*api.Client, *Server) {
				cfg := Config{Store: openPG(ctx, t, url, 4), Lender: lender, BootstrapToken: bootTok, Tokens: tokens}
				if !reload {
					cfg.Quotas = quota
				}
				s, err := New(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if reload {
					if err := s.Reload(ctx, Settings{BootstrapToken: bootTok, Tokens: tokens, Quotas: quota}); err != nil {
						t.Fatal(err)
					}
				}
				ts := httptest.NewServer(s.Handler())
				t.Cleanup(ts.Close)
				return api.NewClient(ts.URL, "", ts.Client()), s
			}
			a, _ := replica()
			b, _ := replica()
			for _, name := range []string{"n1", "n2"} {
				req := api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1",
					Fingerprint: api.Fingerprint{MachineID: "mid-" + name, Hostname: name, Cores: 2, MemoryBytes: 1 << 30},
					Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"}}}
				if _, err := a.WithToken(bootTok).Join(ctx, req); err != nil {
					t.Fatal(err)
				}
			}
			on := func(node string) api.LeaseRequest {
				return api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Affinity: []string{node}}
			}
			// b's placement view is loaded now, before alice's lease
			// (which a places on another node than b will).
			if _, err := b.WithToken(bobTok).CreateLease(ctx, on("n2")); err != nil {
				t.Fatal(err)
			}
			if _, err := a.WithToken(aliceTok).CreateLease(ctx, on("n1")); err != nil {
				t.Fatal(err)
			}
			_, err := b.WithToken(aliceTok).CreateLease(ctx, on("n2"))
			wantCode(t, err, http.StatusTooManyRequests)
			ls, err := a.WithToken(aliceTok).Leases(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(ls) != 1 {
				t.Fatalf("alice holds %d leases; her quota is 1", len(ls))
			}
		})
	}
}
