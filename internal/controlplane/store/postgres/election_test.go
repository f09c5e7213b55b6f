package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// TestElection: one replica leads at a time; when the leader's database
// session dies (terminated by the server, as when its process is
// killed), another replica leads within 5 s.
func TestElection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, a, b := twoReplicas(ctx, t)
	leadA, resignA, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer resignA()
	type won struct {
		lost   <-chan struct{} // the leadership's Done
		resign func()
		at     time.Time
	}
	bWon := make(chan won, 1)
	go func() {
		lead, resign, err := b.Campaign(ctx)
		if err == nil {
			bWon <- won{lead.Done(), resign, time.Now()}
		}
	}()
	select {
	case <-bWon:
		t.Fatal("two leaders at once")
	case <-time.After(2 * campaignEvery):
	}
	// The leader's session dies.
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	killed := time.Now()
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'rialto-leader' AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	var w won
	select {
	case w = <-bWon:
	case <-time.After(10 * time.Second):
		t.Fatal("no other replica took over within 10 s")
	}
	defer w.resign()
	if d := w.at.Sub(killed); d > 5*time.Second {
		t.Errorf("takeover took %v, more than 5 s", d)
	}
	// The old leader learns that it lost.
	select {
	case <-leadA.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the old leader still believes it leads")
	}
}

// TestUnavailable: with PostgreSQL down, calls fail with
// store.ErrUnavailable, and work again once it is back.
func TestUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := openStore(ctx, t)
	pg := pgtest.Server(t)
	if err := pg.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			pg.Restart(context.Background())
		}
	}()
	_, err := s.AppendEvent(ctx, api.Event{Type: "x", Subject: "y"})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("write with the database down: %v", err)
	}
	if _, err := s.Nodes(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("read with the database down: %v", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("ping: %v", err)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err = s.AppendEvent(ctx, api.Event{Type: "x", Subject: "y"}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // polling with a deadline
	}
}

// TestMigrationsMatchSQLite: the PostgreSQL migrations are the SQLite
// store's, version for version, by name.
func TestMigrationsMatchSQLite(t *testing.T) {
	pg, err := MigrationNames()
	if err != nil {
		t.Fatal(err)
	}
	lite, err := sqliteMigrationNames()
	if err != nil {
		t.Fatal(err)
	}
	if len(pg) != len(lite) {
		t.Fatalf("PostgreSQL %v, SQLite %v", pg, lite)
	}
	for i := range pg {
		if pg[i] != lite[i] {
			t.Fatalf("migration %d: PostgreSQL %s, SQLite %s", i+1, pg[i], lite[i])
		}
	}
	ctx := context.Background()
	s := openStore(ctx, t)
	if v, err := s.SchemaVersion(ctx); err != nil || v != len(pg) {
		t.Fatalf("schema version %d %v", v, err)
	}
}

// twoReplicas opens two stores of one fresh database (at url), as two
// replicas would; they close when the test ends.
// openStore opens a store on a fresh database of the test's PostgreSQL,
// closed when the test ends.
func openStore(ctx context.Context, t *testing.T) *Store {
	t.Helper()
	s, err := Open(ctx, pgtest.DB(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func twoReplicas(ctx context.Context, t *testing.T) (url string, a, b *Store) {
	t.Helper()
	url = pgtest.DB(t)
	var out [2]*Store
	for i := range out {
		st, err := Open(ctx, url, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		out[i] = st
	}
	return url, out[0], out[1]
}
