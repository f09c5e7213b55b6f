package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// TestBroadcast: what one replica broadcasts reaches every replica
// listening, its own listener too, in the order it was sent; a listener
// whose session the server ends returns an unavailable error.
func TestBroadcast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.DB(t)
	open := func() *Store {
		s, err := Open(ctx, url, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open(), open()
	type listener struct {
		got   chan string
		ready chan struct{}
		done  chan error
	}
	listen := func(s *Store) *listener {
		l := &listener{got: make(chan string, 100), ready: make(chan struct{}), done: make(chan error, 1)}
		go func() { // ends with ctx (or the session); the test waits for done
			l.done <- s.Listen(ctx, func() { close(l.ready) }, func(m string) { l.got <- m })
		}()
		select {
		case <-l.ready:
		case err := <-l.done:
			t.Fatalf("listen: %v", err)
		}
		return l
	}
	la, lb := listen(a), listen(b)
	const n = 20
	for i := 0; i < n; i++ {
		if err := a.Broadcast(ctx, fmt.Sprintf("m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []*listener{la, lb} {
		for i := 0; i < n; i++ {
			select {
			case m := <-l.got:
				if want := fmt.Sprintf("m%d", i); m != want {
					t.Fatalf("message %d is %q, want %q", i, m, want)
				}
			case <-ctx.Done():
				t.Fatalf("message %d did not arrive", i)
			}
		}
	}
	// The database ends the listeners' sessions.
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'rialto-listen' AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*listener{la, lb} {
		select {
		case err := <-l.done:
			if !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("a listener whose session ended: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("a listener whose session ended did not return")
		}
	}
}
