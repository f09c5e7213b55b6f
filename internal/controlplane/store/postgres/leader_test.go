package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestLeaderURL: no address before anyone advertised; the elected
// replica's address while its session holds the leader lock; none as soon
// as that session dies (before the next leader overwrites the row); then
// the next leader's.
func TestLeaderURL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, a, b := twoReplicas(ctx, t)
	want := func(st *Store, w string) {
		t.Helper()
		got, err := st.LeaderURL(ctx)
		if err != nil || got != w {
			t.Fatalf("LeaderURL = %q, %v; want %q", got, err, w)
		}
	}
	want(b, "") // no table yet

	leadA, resignA, err := a.CampaignAdvertising(ctx, "https://a.example:7070")
	if err != nil {
		t.Fatal(err)
	}
	defer resignA()
	want(b, "https://a.example:7070")
	want(a, "https://a.example:7070")

	// A's session dies (its process was killed): its address is gone at
	// once, though the row still names it.
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'rialto-leader' AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := b.LeaderURL(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("LeaderURL still %q after the leader's session ended", got)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	var rows int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM rialto_leader`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("rialto_leader rows = %d, %v; want the dead leader's row", rows, err)
	}
	select {
	case <-leadA.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the old leader still believes it leads")
	}

	_, resignB, err := b.CampaignAdvertising(ctx, "https://b.example:7070")
	if err != nil {
		t.Fatal(err)
	}
	want(a, "https://b.example:7070")
	resignB()
	want(a, "")
}
