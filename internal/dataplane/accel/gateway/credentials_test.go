package gateway

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
)

// TestSharedTarget: a gateway served to several credentials over TCP;
// revoking one closes its connection and refuses it, the other goes on.
func TestSharedTarget(t *testing.T) {
	echo, _ := roles.New(context.Background(), roles.Spec{Name: "echo"})
	g := run(t, Config{Name: "shared", Role: "echo", Entries: []string{"echo"}}, Local(echo))
	var cs Credentials
	if err := cs.Add(nil); !errors.Is(err, accel.ErrAuth) {
		t.Fatalf("empty credential: %v", err)
	}
	for _, c := range []string{"alice", "bob", "alice"} {
		if err := cs.Add([]byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	if cs.Len() != 2 {
		t.Fatalf("%d credentials", cs.Len())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&accel.Server{Target: g.SharedTarget(&cs)}).Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })

	dial := func(c string) (*accel.Conn, error) { return accel.Dial(ctx, ln.Addr().String(), []byte(c)) }
	if c, err := dial("mallory"); !errors.Is(err, accel.ErrAuth) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("unknown credential: %v", err)
	}
	alice, err := dial("alice")
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	bob, err := dial("bob")
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	if info := alice.Info(); info.Role != "echo" || len(info.Entries) != 1 {
		t.Fatalf("info %+v", info)
	}
	for _, c := range []*accel.Conn{alice, bob} {
		if out, err := c.Call(ctx, "echo", []byte("hi")); err != nil || !bytes.Equal(out, []byte("hi")) {
			t.Fatalf("call: %q %v", out, err)
		}
	}
	if !cs.Revoke([]byte("alice")) || cs.Revoke([]byte("alice")) {
		t.Fatal("Revoke reported wrongly")
	}
	if _, err := alice.Call(ctx, "echo", []byte("hi")); err == nil {
		t.Fatal("a revoked credential's connection still calls")
	}
	if c, err := dial("alice"); err == nil {
		c.Close()
		t.Fatal("a revoked credential was accepted")
	}
	if out, err := bob.Call(ctx, "echo", []byte("still")); err != nil || string(out) != "still" {
		t.Fatalf("the other credential: %q %v", out, err)
	}
	if err := cs.Check([]byte("bob")); err != nil {
		t.Fatal(err)
	}
}

// TestSetInstances: the backends can be replaced while the gateway runs;
// with none, executions fail as unavailable.
func TestSetInstances(t *testing.T) {
	echo, _ := roles.New(context.Background(), roles.Spec{Name: "echo"})
	sha, _ := roles.New(context.Background(), roles.Spec{Name: "sha256"})
	g := run(t, Config{}, Local(echo))
	ctx := context.Background()
	if out, err := g.Call(ctx, "echo", []byte("x")); err != nil || string(out) != "x" {
		t.Fatalf("%q %v", out, err)
	}
	g.SetInstances([]Backend{Local(sha), Local(sha)})
	if g.Instances() != 2 {
		t.Fatalf("%d instances", g.Instances())
	}
	if out, err := g.Call(ctx, "sum", []byte("x")); err != nil || len(out) != 32 {
		t.Fatalf("%x %v", out, err)
	}
	g.SetInstances(nil)
	if _, err := g.Call(ctx, "sum", []byte("x")); !errors.Is(err, accel.ErrUnavailable) {
		t.Fatalf("no instances: %v", err)
	}
}

// blockBackend holds every execution until release is closed.
type blockBackend struct {
	started chan struct{}
	release chan struct{}
}

func (b blockBackend) CallBatch(ctx context.Context, _ string, ins [][]byte) ([][]byte, error) {
	b.started <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return ins, nil
}

// TestLeaseQueueLimit: one credential cannot hold more than its share of
// the queue; another credential is still admitted.
func TestLeaseQueueLimit(t *testing.T) {
	b := blockBackend{started: make(chan struct{}, 16), release: make(chan struct{})}
	g := run(t, Config{Workers: 4, MaxBatch: 1}, b)
	cs := Credentials{Limit: 2}
	cs.Add([]byte("alice"))
	cs.Add([]byte("bob"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&accel.Server{Target: g.SharedTarget(&cs)}).Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	alice, err := accel.Dial(ctx, ln.Addr().String(), []byte("alice"))
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	bob, err := accel.Dial(ctx, ln.Addr().String(), []byte("bob"))
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	errs := make(chan error, 3)
	for range 2 {
		go func() { _, err := alice.Call(ctx, "x", []byte("a")); errs <- err }()
	}
	<-b.started
	<-b.started
	if _, err := alice.Call(ctx, "x", []byte("a")); !errors.Is(err, accel.ErrBusy) || !strings.Contains(err.Error(), "share of the queue") {
		t.Fatalf("third call of a full lease: %v", err)
	}
	go func() { _, err := bob.Call(ctx, "x", []byte("b")); errs <- err }()
	<-b.started
	close(b.release)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if out, err := alice.Call(ctx, "x", []byte("again")); err != nil || string(out) != "again" {
		t.Fatalf("after the queue drained: %q %v", out, err)
	}
}

// TestLeaseQueueShareFollowsWeights: with no Limit, a lease may hold its
// weighted part of the queue (not half of it whatever the number of
// leases): all of it alone, a third of it among three equal leases; Limit
// caps it further.
func TestLeaseQueueShareFollowsWeights(t *testing.T) {
	var cs Credentials
	_ = cs.AddWeighted([]byte("a"), "a", 1)
	ca := cs.m[key([]byte("a"))]
	if got := cs.limit(ca, 120, 4); got != 120 {
		t.Fatalf("alone: %d, want the whole queue", got)
	}
	_ = cs.AddWeighted([]byte("b"), "b", 1)
	_ = cs.AddWeighted([]byte("c"), "c", 2)
	if got := cs.limit(ca, 120, 4); got != 30 {
		t.Fatalf("weight 1 of 4: %d, want 30", got)
	}
	if got := cs.limit(cs.m[key([]byte("c"))], 120, 4); got != 60 {
		t.Fatalf("weight 2 of 4: %d, want 60", got)
	}
	if got := cs.limit(ca, 8, 4); got != 4 {
		t.Fatalf("at least one batch: %d", got)
	}
	cs.Revoke([]byte("c"))
	if got := cs.limit(ca, 120, 4); got != 60 {
		t.Fatalf("after a revoke: %d, want 60", got)
	}
	cs.Limit = 10
	if got := cs.limit(ca, 120, 4); got != 10 {
		t.Fatalf("with Limit: %d", got)
	}
}
