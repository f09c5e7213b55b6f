package controlplane

import (
	"context"
	"math/big"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestReplicaRevocationBus: two Servers on one PostgreSQL database. Once
// both hear themselves on the broadcast channel they trust their token
// caches; a revocation broadcast by one returns once the other
// acknowledged, and the other has forgotten the node's cached credential
// by then. When the database ends their listening sessions they stop
// trusting their caches, and trust them again once they listen anew (with
// the caches emptied).
func TestReplicaRevocationBus(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.DB(t)
	replica := func() *Server {
		return runServer(ctx, t, Config{Store: openPG(ctx, t, url, 4), BootstrapToken: bootTok})
	}
	a, b := replica(), replica()
	// Each has heard the other's hello (the remover waits for those it heard).
	awaitReplicasMeet(ctx, t, a, b)

	node := principal{role: roleNode, nodeID: "n-gone"}
	keep := principal{role: roleNode, nodeID: "n-kept"}
	b.auth.put("h-gone", node, time.Now().Add(time.Hour), b.auth.generation())
	b.auth.put("h-kept", keep, time.Now().Add(time.Hour), b.auth.generation())
	start := time.Now()
	if late := a.broadcastRevocation(ctx, "n-gone", []*big.Int{big.NewInt(0x1234)}); len(late) != 0 {
		t.Fatalf("replicas %v did not acknowledge", late)
	}
	if d := time.Since(start); d >= busStale {
		t.Fatalf("the revocation took %v: it waited for its deadline, not for the acknowledgement", d)
	}
	if _, ok := b.auth.get("h-gone", time.Now()); ok {
		t.Fatal("the other replica still has the removed node's credential cached")
	}
	if _, ok := b.auth.get("h-kept", time.Now()); !ok {
		t.Fatal("the other replica forgot another node's credential")
	}
	// A lookup that began before the revocation does not put its (stale)
	// answer into the cache.
	gen := b.auth.generation()
	b.applyRevocation(ctx, "n-gone", nil)
	b.auth.put("h-gone", node, time.Now().Add(time.Hour), gen)
	if _, ok := b.auth.get("h-gone", time.Now()); ok {
		t.Fatal("a lookup older than the revocation was cached")
	}

	// The database ends the listening sessions: neither trusts its cache
	// until it listens again.
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	killed := time.Now()
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'rialto-listen' AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	pollUntil(ctx, t, "both listen again", func() bool {
		return a.bus.freshAt.Load() > killed.UnixNano() && b.bus.freshAt.Load() > killed.UnixNano()
	})
	if _, ok := b.auth.get("h-kept", time.Now()); ok {
		t.Fatal("a replica that listens anew kept its cache (it may have missed revocations)")
	}
	if !a.cacheTrusted() || !b.cacheTrusted() {
		t.Fatal("replicas that hear themselves again do not trust their caches")
	}
}

// TestCacheUntrustedWithoutBus: a Server on a shared store that is not
// running (so not listening) never answers from its token cache.
func TestCacheUntrustedWithoutBus(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := New(ctx, Config{Store: openPG(ctx, t, pgtest.DB(t), 2), BootstrapToken: bootTok})
	if err != nil {
		t.Fatal(err)
	}
	if s.cacheTrusted() {
		t.Fatal("a replica that does not listen trusts its cache")
	}
}

// pollUntil polls cond until it holds, failing the test once ctx ends.
func pollUntil(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("%s: not within the test's deadline", what)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}

// awaitReplicasMeet waits until every replica of rs trusts its cache
// and has heard every other's hello (a removal waits for the replicas it
// heard).
func awaitReplicasMeet(ctx context.Context, t *testing.T, rs ...*Server) {
	t.Helper()
	heard := func(s, other *Server) bool {
		s.bus.mu.Lock()
		defer s.bus.mu.Unlock()
		_, ok := s.bus.seen[other.bus.id]
		return ok
	}
	pollUntil(ctx, t, "the replicas trust their caches and hear each other", func() bool {
		for _, s := range rs {
			if !s.cacheTrusted() { // then its bus.id is set
				return false
			}
		}
		for _, s := range rs {
			for _, o := range rs {
				if o != s && !heard(s, o) {
					return false
				}
			}
		}
		return true
	})
}
