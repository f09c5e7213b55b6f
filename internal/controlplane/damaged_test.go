package controlplane

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite/sqlitetest"
)

// lockedBuffer is a bytes.Buffer that a logger and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDamagedDatabaseLoggedOnce: a database found damaged while the
// server runs (every sweep failing with SQLite's "database disk image is
// malformed") is logged at ERROR once, with the restore advice, not at
// WARN on every sweep; sweeps go on (a silent node still becomes suspect).
func TestDamagedDatabaseLoggedOnce(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e := newEnv(t, func(c *Config) {
		c.Clock, c.HeartbeatInterval = fake, time.Second
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	j, _ := e.join("n1", 1<<30)
	if _, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, TTLSeconds: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx())
	done := make(chan error, 1)
	go func() { done <- e.srv.Run(ctx) }()
	if err := fake.BlockUntil(ctx, 2); err != nil { // Run's sweep ticker and its liveness flush ticker
		t.Fatal(err)
	}
	// What every sweep reads once the lease's TTL ran out (its expiry).
	sqlitetest.DamageTable(t, e.dbPath, "leases")
	fake.Advance(time.Second)
	fake.Advance(time.Second)
	poll(t, "an ERROR logged", func() bool { return strings.Contains(logs.String(), "level=ERROR") }, &logs)
	for range 3 {
		fake.Advance(time.Second)
	}
	// Sweeps after the first ran (the node API reads the damaged table).
	poll(t, "the node suspect", func() bool {
		n, err := e.srv.st.Node(e.ctx(), j.NodeID)
		return err == nil && n.State == api.NodeSuspect
	}, &logs)
	cancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("Run: %v", err)
	}
	out := logs.String()
	if n := strings.Count(out, "level=ERROR"); n != 1 {
		t.Fatalf("%d ERROR lines, want 1:\n%s", n, out)
	}
	if strings.Contains(out, "level=WARN msg=sweep") {
		t.Fatalf("failed sweeps logged at WARN:\n%s", out)
	}
	for _, want := range []string{"malformed", "Backups and restore", "database damaged"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the log does not say %q:\n%s", want, out)
		}
	}
}

// poll waits (with a deadline) until cond holds; the log is shown if not.
func poll(t *testing.T, what string, cond func() bool, logs *lockedBuffer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited in vain for %s; log:\n%s", what, logs)
		}
		<-tick.C
	}
}
