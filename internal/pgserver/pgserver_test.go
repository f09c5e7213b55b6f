package pgserver

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestStartRestartKill(t *testing.T) {
	if _, err := FindBin(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateDatabase(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateDatabase(ctx, "t1"); err != nil {
		t.Fatalf("second create: %v", err)
	}
	c, err := pgx.Connect(ctx, s.URL("t1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `CREATE TABLE x (v int); INSERT INTO x VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	// The killed server comes back with what was committed.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err = s.Restart(ctx)
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	c, err = pgx.Connect(ctx, s.URL("t1"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var v int
	if err := c.QueryRow(ctx, `SELECT v FROM x`).Scan(&v); err != nil || v != 42 {
		t.Fatalf("after kill and restart: %v %v", v, err)
	}
	// A second Start on the directory of a running server uses it.
	again, err := Start(ctx, s.Dir, Options{})
	if err != nil || again.Port != s.Port {
		t.Fatalf("start again: %v (port %d, was %d)", err, again.Port, s.Port)
	}
	att, err := Attach(s.Dir)
	if err != nil || att.URL("t1") != s.URL("t1") {
		t.Fatalf("attach: %v", err)
	}
	bad := *s
	bad.password = "wrong"
	if c, err := pgx.Connect(ctx, bad.URL("t1")); err == nil {
		c.Close(ctx)
		t.Fatal("a wrong password was accepted")
	}
}

// TestChecksums: Checksums says what the server says (SHOW
// data_checksums), and SetChecksums turns them the other way while the
// server is stopped, and leaves a cluster already so as it is.
func TestChecksums(t *testing.T) {
	if _, err := FindBin(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	show := func() bool {
		t.Helper()
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var v string
		if err := c.QueryRow(ctx, `SHOW data_checksums`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v == "on"
	}
	orig, err := s.Checksums(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if on := show(); on != orig {
		t.Fatalf("Checksums: %v, the server says %v", orig, on)
	}
	if err := s.Stop(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.SetChecksums(ctx, !orig); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.Checksums(ctx); err != nil || got != !orig {
		t.Fatalf("Checksums after SetChecksums(%v): %v, %v", !orig, got, err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if on := show(); on != !orig {
		t.Fatalf("the server says data_checksums %v after SetChecksums(%v)", on, !orig)
	}
}

// TestProgPath: a program missing from the directory found on PATH (links
// to initdb and pg_ctl only) is taken from beside the program pg_ctl
// links to.
func TestProgPath(t *testing.T) {
	real, onPath := t.TempDir(), t.TempDir()
	for _, p := range []string{"pg_ctl", "initdb", "pg_checksums"} {
		if err := os.WriteFile(filepath.Join(real, p), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"pg_ctl", "initdb"} {
		if err := os.Symlink(filepath.Join(real, p), filepath.Join(onPath, p)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ bin, prog, want string }{
		{onPath, "initdb", filepath.Join(onPath, "initdb")},
		{onPath, "pg_checksums", filepath.Join(real, "pg_checksums")},
		{onPath, "pg_none", filepath.Join(onPath, "pg_none")},
		{real, "pg_checksums", filepath.Join(real, "pg_checksums")},
	} {
		if got := progPath(tc.bin, tc.prog); got != tc.want {
			t.Errorf("progPath(%s, %s) = %s, want %s", tc.bin, tc.prog, got, tc.want)
		}
	}
}
