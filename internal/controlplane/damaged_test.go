package controlplane

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite/sqlitetest"
	"github.com/rialto-project/rialto/internal/logtest"
)

// TestDamagedDatabaseLoggedOnce: a database found damaged while the
// server runs (every sweep failing with SQLite's "database disk image is
// malformed") is logged at ERROR once, with the restore advice, not at
// WARN on every sweep; sweeps go on (a silent node still becomes suspect).
func TestDamagedDatabaseLoggedOnce(t *testing.T) {
	t.Parallel()
	log, logs := logtest.Logger(nil)
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e := newEnv(t, func(c *Config) {
		c.Clock, c.HeartbeatInterval, c.Logger = fake, time.Second, log
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
	poll(t, "an ERROR logged", func() bool { return strings.Contains(logs.String(), "level=ERROR") }, logs)
	for range 3 {
		fake.Advance(time.Second)
	}
	// Sweeps after the first ran (the node API reads the damaged table).
	poll(t, "the node suspect", func() bool {
		n, err := e.srv.st.Node(e.ctx(), j.NodeID)
		return err == nil && n.State == api.NodeSuspect
	}, logs)
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

// TestDamagedDatabaseLoggedAgainAfterRepair: the ERROR is logged once
// per damage, not once per run: once the database is repaired (as a
// restored file would be) and a sweep succeeds again, which is logged at
// INFO, damage found later is logged at ERROR again. The line itself
// says to see err for what to do, which says it (restore the file), not
// advice of its own. Before, the server logged the first damage only, and
// its line told to restore a backup whatever the error advised (REINDEX,
// for a damaged PostgreSQL index).
func TestDamagedDatabaseLoggedAgainAfterRepair(t *testing.T) {
	t.Parallel()
	log, logs := logtest.Logger(nil)
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e := newEnv(t, func(c *Config) {
		c.Clock, c.HeartbeatInterval, c.Logger = fake, time.Second, log
		// The node, silent, stays ready: it takes the second lease,
		// and no lease is lost with it.
		c.SuspectAfter, c.DownAfter = 24*time.Hour, 24*time.Hour
	})
	e.join("n1", 1<<30)
	// A lease for the sweeps to read once it expired, each time the
	// table is damaged.
	lease := func() {
		t.Helper()
		if _, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, TTLSeconds: 1}); err != nil {
			t.Fatal(err)
		}
	}
	lease()
	errors := func() int { return len(logs.Lines("level=ERROR")) }
	const again = "the database answers again"
	ctx, cancel := context.WithCancel(e.ctx())
	done := make(chan error, 1)
	go func() { done <- e.srv.Run(ctx) }()
	if err := fake.BlockUntil(ctx, 2); err != nil { // Run's sweep ticker and its liveness flush ticker
		t.Fatal(err)
	}
	// What every sweep reads once the lease's TTL ran out (its expiry).
	repair := sqlitetest.DamageTable(t, e.dbPath, "leases")
	fake.Advance(time.Second)
	fake.Advance(time.Second)
	poll(t, "an ERROR logged", func() bool { return errors() == 1 }, logs)
	// Repaired: a sweep succeeds (and expires the lease).
	repair()
	poll(t, "a sweep succeeding after the repair", func() bool {
		fake.Advance(time.Second)
		return strings.Contains(logs.String(), again)
	}, logs)
	// Damaged again, with a lease to expire (not before the time moves
	// on: no sweep reads it before the damage).
	lease()
	sqlitetest.DamageTable(t, e.dbPath, "leases")
	poll(t, "a second ERROR logged", func() bool {
		fake.Advance(time.Second)
		return errors() == 2
	}, logs)
	cancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("Run: %v", err)
	}
	out := logs.String()
	if n := errors(); n != 2 {
		t.Fatalf("%d ERROR lines, want 2:\n%s", n, out)
	}
	if n := strings.Count(out, again); n != 1 {
		t.Fatalf("%d lines saying the database answers again, want 1:\n%s", n, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "level=ERROR") {
			continue
		}
		// What to do is err's to say: the line neither contradicts
		// it nor repeats it.
		if i := strings.Index(line, " err="); i < 0 || strings.Contains(line[:i], "restore") || !strings.Contains(line[i:], "Backups and restore") {
			t.Fatalf("want a neutral headline and err saying what to do:\n%s", line)
		}
	}
}

// poll waits (with a deadline) until cond holds; the log is shown if not.
func poll(t *testing.T, what string, cond func() bool, logs *logtest.Buffer) {
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
