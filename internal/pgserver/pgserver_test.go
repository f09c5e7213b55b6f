package pgserver

import (
	"context"
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
