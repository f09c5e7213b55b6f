package robustness

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// lossyStore is a deliberately broken store: it forgets every fifth lease
// it acknowledged creating (reads no longer find it), as a store that
// acknowledged a write before it was durable would after a crash.
type lossyStore struct {
	*postgres.Store
	mu   sync.Mutex
	n    int
	lost map[string]bool
}

func (s *lossyStore) LeaseOps(ctx context.Context, ops []store.LeaseOp) ([]api.Lease, []error, error) {
	out, errs, err := s.Store.LeaseOps(ctx, ops)
	if err == nil {
		s.mu.Lock()
		for i, op := range ops {
			if op.Create != nil && errs[i] == nil {
				if s.n++; s.n%5 == 0 {
					s.lost[out[i].ID] = true
				}
			}
		}
		s.mu.Unlock()
	}
	return out, errs, err
}

func (s *lossyStore) Lease(ctx context.Context, id string) (api.Lease, error) {
	s.mu.Lock()
	lost := s.lost[id]
	s.mu.Unlock()
	if lost {
		return api.Lease{}, fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
	}
	return s.Store.Lease(ctx, id)
}

// inProcess runs two control-plane replicas in this process on one new
// database, each store wrapped by wrap, and returns their addresses.
func inProcess(t *testing.T, ctx context.Context, wrap func(*postgres.Store) store.Store) string {
	return inProcessOn(t, ctx, pgtest.DB(t), wrap)
}

// inProcessOn is inProcess on the database at url.
func inProcessOn(t *testing.T, ctx context.Context, url string, wrap func(*postgres.Store) store.Store) string {
	var addrs []string
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	for range 2 {
		st, err := postgres.Open(ctx, url, postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		var tks []controlplane.Token
		for tenant, tok := range tokens {
			tks = append(tks, controlplane.Token{Token: tok, Tenant: tenant})
		}
		q := controlplane.Quotas{Tenants: map[string]controlplane.Quota{}}
		for tenant := range tokens {
			q.Tenants[tenant] = controlplane.Quota{Leases: quota}
		}
		srv, err := controlplane.New(ctx, controlplane.Config{Store: wrap(st), BootstrapToken: bootTok, Tokens: tks, Quotas: q,
			HeartbeatInterval: 500 * time.Millisecond, SuspectAfter: time.Minute, DownAfter: 2 * time.Minute, PrepareTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(srv.Handler())
		t.Cleanup(ts.Close)
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv.Run(ctx)
		}()
		addrs = append(addrs, ts.URL)
	}
	return strings.Join(addrs, ",")
}

// runShort runs the workload for d against in-process replicas.
func runShort(t *testing.T, wrap func(*postgres.Store) store.Store, d time.Duration) *History {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addrs := inProcess(t, ctx, wrap)
	lenders(t, ctx, addrs)
	wctx, wcancel := context.WithTimeout(ctx, d)
	defer wcancel()
	w := &Workload{Addrs: addrs, Tokens: tokens, ClientsPerTenant: 3, Size: leaseSz, RetryFor: 5 * time.Second,
		HTTP: &http.Client{Timeout: 10 * time.Second}}
	h := w.Run(wctx)
	if n := h.Count(OpCreate, Ok); n < 10 {
		t.Fatalf("only %d creates acknowledged", n)
	}
	return h
}

// TestCheckerCatchesLostWrites: with a store that loses acknowledged
// creates, the checker finds the history not linearizable.
func TestCheckerCatchesLostWrites(t *testing.T) {
	h := runShort(t, func(s *postgres.Store) store.Store { return &lossyStore{Store: s, lost: map[string]bool{}} }, 3*time.Second)
	if res := Check(model(), h, time.Minute, ""); res != porcupine.Illegal {
		t.Fatalf("the checker says %s of a store that loses acknowledged creates", res)
	}
}

// TestBrokenModelFails: a history of the real store is linearizable
// against the model, and not against a deliberately broken model (one
// that never ends a lease, so the tenants' later creates break its
// quota).
func TestBrokenModelFails(t *testing.T) {
	h := runShort(t, func(s *postgres.Store) store.Store { return s }, 3*time.Second)
	if res := Check(model(), h, time.Minute, ""); res != porcupine.Ok {
		t.Fatalf("the real store's history: %s", res)
	}
	broken := model()
	broken.ForgetReleases = true
	if res := Check(broken, h, time.Minute, ""); res != porcupine.Illegal {
		t.Fatalf("the broken model says %s", res)
	}
}
