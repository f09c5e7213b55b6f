package robustness

import (
	"context"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// duration is how long the clients run: RIALTO_ROBUSTNESS_DURATION (a Go
// duration), else def.
func duration(t *testing.T, def time.Duration) time.Duration {
	if v := os.Getenv("RIALTO_ROBUSTNESS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("RIALTO_ROBUSTNESS_DURATION: %v", err)
		}
		return d
	}
	return def
}

// TestRobustness: six clients of two tenants create, read, renew and
// release leases through three `rialto server` replicas sharing a real
// PostgreSQL, while replicas are SIGKILLed and restarted and PostgreSQL
// itself is restarted (an immediate shutdown: a crash, recovered at the
// next start). The recorded history must be linearizable against the
// lease table's model: no acknowledged create disappears, no released
// lease comes back, no device range is held twice, no tenant exceeds its
// quota.
func TestRobustness(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	robustness(t, duration(t, 20*time.Second))
}

// TestSoakRobustness is TestRobustness for 5 minutes (or
// RIALTO_ROBUSTNESS_DURATION), under `make soak` (RIALTO_SOAK=1).
func TestSoakRobustness(t *testing.T) {
	if os.Getenv("RIALTO_SOAK") == "" {
		t.Skip("a soak test: make soak")
	}
	robustness(t, duration(t, 5*time.Minute))
}

func robustness(t *testing.T, run time.Duration) {
	_, rs := startReplicas(t, 3)
	pg := pgtest.Server(t)
	addrs := addrList(rs)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	lenders(t, ctx, addrs)

	wctx, wcancel := context.WithTimeout(ctx, run)
	defer wcancel()
	faultsDone := make(chan struct{})
	var kills, pgRestarts int
	go func() { // the fault injector; the test waits for it below
		defer close(faultsDone)
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
		next := time.Now().Add(run / 3)
		for wctx.Err() == nil {
			select {
			case <-wctx.Done():
				return
			case <-time.After(time.Duration(1500+rng.IntN(1500)) * time.Millisecond):
			}
			if wctx.Err() != nil {
				return
			}
			if time.Now().After(next) {
				// PostgreSQL crashes and comes back.
				sctx, c := context.WithTimeout(context.Background(), time.Minute)
				if err := pg.Stop(sctx, "immediate"); err != nil {
					t.Errorf("stop PostgreSQL: %v", err)
				}
				time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond) // the outage's length
				if err := pg.Restart(sctx); err != nil {
					t.Errorf("restart PostgreSQL: %v", err)
				}
				c()
				pgRestarts++
				next = time.Now().Add(run / 3)
				continue
			}
			r := rs[rng.IntN(len(rs))]
			r.kill()
			kills++
			time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond) // the replica stays dead a while
			r.start()
		}
	}()
	w := &Workload{Addrs: addrs, Tokens: tokens, ClientsPerTenant: 3, Size: leaseSz, RetryFor: 15 * time.Second,
		HTTP: &http.Client{Timeout: 10 * time.Second}}
	h := w.Run(wctx)
	<-faultsDone
	for _, r := range rs {
		waitHealthy(t, r.url(), 30*time.Second)
	}
	creates, releases := h.Count(OpCreate, Ok), h.Count(OpRelease, Ok)
	t.Logf("%d operations in %v: %d creates acknowledged (%d refused, %d unknown), %d releases; %d replica kills, %d PostgreSQL restarts",
		len(h.Operations()), run, creates, h.Count(OpCreate, Refused), h.Count(OpCreate, Unknown), releases, kills, pgRestarts)
	if creates < 20 || releases < 10 {
		t.Errorf("too little work done to mean anything: %d creates, %d releases", creates, releases)
	}
	if kills < 2 || pgRestarts < 1 {
		t.Errorf("too few faults: %d kills, %d PostgreSQL restarts", kills, pgRestarts)
	}
	viz := filepath.Join(t.TempDir(), "history.html")
	if res := Check(model(), h, 2*time.Minute, viz); res != porcupine.Ok {
		b, _ := os.ReadFile(viz)
		os.WriteFile(filepath.Join(os.TempDir(), "rialto-robustness-history.html"), b, 0o644)
		t.Fatalf("the history is not linearizable against the lease table's model (%s); visualization in %s", res,
			filepath.Join(os.TempDir(), "rialto-robustness-history.html"))
	}
}
