package robustness

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// TestReplicaWithoutDatabase: a replica that cannot reach PostgreSQL
// answers 503 (code unavailable) with a message that says so, rather than
// answering from its caches, and serves again once the database is back.
func TestReplicaWithoutDatabase(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addrs := inProcess(t, ctx, func(s *postgres.Store) store.Store { return s })
	lenders(t, ctx, addrs)
	c := api.NewClient(strings.Split(addrs, ",")[0], tokens["tenant-a"], nil)
	l, err := c.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: leaseSz})
	if err != nil {
		t.Fatal(err)
	}
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
	for _, call := range []func() error{
		func() error {
			_, err := c.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: leaseSz})
			return err
		},
		func() error { _, err := c.Lease(ctx, l.ID); return err },
		func() error { _, err := c.ReleaseLease(ctx, l.ID); return err },
	} {
		err := call()
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || ae.Code != api.CodeUnavailable ||
			!strings.Contains(ae.Message, "cannot reach its database") {
			t.Fatalf("with the database down: %v", err)
		}
	}
	resp, err := http.Get(strings.Split(addrs, ",")[0] + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/healthz: %d", resp.StatusCode)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := c.Lease(ctx, l.ID)
		if err == nil {
			if got.State != api.LeaseActive {
				t.Fatalf("after the outage the lease is %s", got.State)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not serving after the database came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // polling with a deadline
	}
}
