package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/pgserver"
)

var (
	mu     sync.Mutex
	srv    *pgserver.Server
	srvErr error
	seq    atomic.Int64
)

// Main runs the tests and then stops and removes the server, if one was
// started.
func Main(m *testing.M) {
	code := m.Run()
	mu.Lock()
	if srv != nil {
		srv.Close()
		srv.Remove()
	}
	mu.Unlock()
	os.Exit(code)
}

// Server returns the test binary's server, starting it on first use; it
// skips t when PostgreSQL is not installed.
func Server(t testing.TB) *pgserver.Server {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if srv == nil && srvErr == nil {
		dir, err := os.MkdirTemp("", "rialto-pgtest-")
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			srv, err = pgserver.Start(ctx, dir, pgserver.Options{})
			cancel()
			if err != nil {
				os.RemoveAll(dir)
			}
		}
		srvErr = err
	}
	if errors.Is(srvErr, pgserver.ErrNotInstalled) {
		t.Skip(srvErr)
	}
	if srvErr != nil {
		t.Fatal(srvErr)
	}
	return srv
}

// DB creates a fresh database for t and returns its URL.
func DB(t testing.TB) string {
	t.Helper()
	s := Server(t)
	name := fmt.Sprintf("t%d_%s", seq.Add(1), strings.ToLower(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, t.Name())))
	if len(name) > 60 {
		name = name[:60]
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.CreateDatabase(ctx, name); err != nil {
		t.Fatal(err)
	}
	return s.URL(name)
}
