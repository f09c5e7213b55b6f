package controlplane

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestLivenessInMemory: a ready node's on-time heartbeats are kept in
// memory and written in batches (flushBeats, and the sweep before it
// judges silence); its first heartbeat, one after a long silence, one
// that changes its health, and one of a node the store took for suspect
// are written before the answer.
func TestLivenessInMemory(t *testing.T) {
	e := newEnv(t) // 1 s heartbeats, suspect after 3 s, down after 10 s
	j, c := e.join("n1", 1<<30)
	stored := func() (time.Time, api.NodeState, string) {
		t.Helper()
		n, err := e.srv.st.Node(e.ctx(), j.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		return n.LastHeartbeat, n.State, n.Health
	}
	beat := func(health string) {
		t.Helper()
		if _, err := c.Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: health}); err != nil {
			t.Fatal(err)
		}
	}
	sweep := func() {
		t.Helper()
		if err := e.srv.Sweep(e.ctx()); err != nil {
			t.Fatal(err)
		}
	}

	// A joined node is ready: its first heartbeat, on time, is kept in
	// memory until a flush.
	joined, _, _ := stored()
	e.clock.Advance(time.Second)
	t1 := e.clock.Now()
	beat("ok")
	if at, _, _ := stored(); !at.Equal(joined) {
		t.Fatalf("on-time heartbeat written at once: stored %v, want %v until the flush", at, joined)
	}
	if at, ok := e.srv.live.lastSeen(j.NodeID); !ok || !at.Equal(t1) {
		t.Fatalf("in memory: %v %v, want %v", at, ok, t1)
	}
	e.srv.flushBeats(e.ctx())
	if at, _, _ := stored(); !at.Equal(t1) {
		t.Fatalf("after the flush: stored %v, want %v", at, t1)
	}
	// The first heartbeat to another replica (here: a second server on
	// the same store) is written at once.
	srv2, err := New(e.ctx(), Config{Store: e.srv.st, Clock: e.clock, Lender: e.lender, BootstrapToken: bootTok})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	t2 := e.clock.Now()
	if _, err := srv2.heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"}); err != nil {
		t.Fatal(err)
	}
	if at, _, _ := stored(); !at.Equal(t2) {
		t.Fatalf("first heartbeat to another replica: stored %v, want %v", at, t2)
	}

	// The sweep writes what is kept in memory before judging silence: 2.5 s
	// after a heartbeat kept in memory the node is ready, 3.5 s after it
	// suspect.
	e.clock.Advance(time.Second)
	t3 := e.clock.Now()
	beat("ok")
	e.clock.Advance(2500 * time.Millisecond)
	sweep()
	if at, st, _ := stored(); st != api.NodeReady || !at.Equal(t3) {
		t.Fatalf("2.5 s after a heartbeat kept in memory: %s, last %v (want ready, %v)", st, at, t3)
	}
	e.clock.Advance(time.Second)
	sweep()
	if _, st, _ := stored(); st != api.NodeSuspect {
		t.Fatalf("3.5 s of silence: %s, want suspect", st)
	}
	// After that silence the heartbeat is written at once: ready again.
	beat("ok")
	if _, st, _ := stored(); st != api.NodeReady {
		t.Fatalf("heartbeat after suspect: %s, want ready at once", st)
	}
	// A change of health is written at once.
	e.clock.Advance(time.Second)
	beat("degraded")
	if _, _, h := stored(); h != "degraded" {
		t.Fatalf("health %q, want degraded at once", h)
	}

	// Another replica's sweep took the node for suspect while its
	// heartbeats here were kept in memory: the flush makes it ready again,
	// with its event.
	e.clock.Advance(time.Second)
	beat("degraded")
	if _, ok := e.srv.live.lastSeen(j.NodeID); !ok {
		t.Fatal("on-time heartbeat not kept in memory")
	}
	if err := e.srv.st.SetNodeState(e.ctx(), j.NodeID, api.NodeReady, api.NodeSuspect,
		api.Event{At: e.clock.Now(), Type: "node.suspect", Subject: j.NodeID, State: string(api.NodeSuspect)}); err != nil {
		t.Fatal(err)
	}
	e.srv.flushBeats(e.ctx())
	if _, st, _ := stored(); st != api.NodeReady {
		t.Fatalf("after the flush: %s, want ready", st)
	}
	evs, err := e.srv.st.Events(e.ctx(), 0, 1000, "")
	if err != nil {
		t.Fatal(err)
	}
	if last := evs[len(evs)-1]; last.Type != "node.ready" || last.Subject != j.NodeID {
		t.Fatalf("last event %+v, want node.ready of %s", last, j.NodeID)
	}

	// A heartbeat kept in memory, then one written at once after a
	// silence: the flush does not write the older over the newer.
	e.clock.Advance(time.Second)
	beat("degraded")
	e.clock.Advance(5 * time.Second)
	t4 := e.clock.Now()
	beat("degraded")
	e.srv.flushBeats(e.ctx())
	if at, _, _ := stored(); !at.Equal(t4) {
		t.Fatalf("after a flush: stored %v, want the newer %v", at, t4)
	}

	// A rejoin (its agent restarted, with its credential) forgets what
	// was kept in memory: the old credential's heartbeats cannot revive
	// anything later.
	e.clock.Advance(time.Second)
	beat("degraded")
	e.rejoin("n1", j.Credential, 1<<30)
	if _, ok := e.srv.live.lastSeen(j.NodeID); ok {
		t.Fatal("a rejoined node's heartbeat still kept in memory")
	}
}

// TestStretchedTimersAtTenThousand: with the default cap (100 heartbeats/s)
// and 10,000 nodes, agents are told 100 s, and a node that stops
// heartbeating becomes suspect after 300 s of silence and down after
// 1,000 s (SuspectAfter and DownAfter × 100), judged once per stretched
// interval, as docs/operations.md says. The clock is the test's; the
// sweep runs every second as Run would.
func TestStretchedTimersAtTenThousand(t *testing.T) {
	e := newEnv(t) // defaults: 1 s, 3 s, 10 s, cap 100/s
	j, c := e.join("n1", 1<<30)
	e.srv.setNodeCount(10000) // the other 9,999 nodes, as counted by the sweep
	r, err := c.Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"})
	if err != nil {
		t.Fatal(err)
	}
	if r.HeartbeatSeconds != 100 {
		t.Fatalf("told %v s, want 100", r.HeartbeatSeconds)
	}
	start := e.clock.Now()
	var suspectAt, downAt time.Duration
	for i := 0; i < 1100 && downAt == 0; i++ {
		e.clock.Advance(time.Second)
		if err := e.srv.Sweep(e.ctx()); err != nil {
			t.Fatal(err)
		}
		n, err := e.srv.st.Node(e.ctx(), j.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		silent := e.clock.Now().Sub(start)
		switch {
		case n.State == api.NodeSuspect && suspectAt == 0:
			suspectAt = silent
		case n.State == api.NodeDown:
			downAt = silent
		}
	}
	// Liveness is judged at the first sweep (1 s) and then every 100 s.
	if suspectAt != 301*time.Second || downAt != 1001*time.Second {
		t.Fatalf("suspect after %v, down after %v of silence; want 301 s and 1001 s", suspectAt, downAt)
	}
}

// TestElectedReplicaCounts: the elected replica counts the nodes other
// replicas took joins for (followLoop), so that the interval it tells
// agents is stretched for all of them, not only for its own joins.
func TestElectedReplicaCounts(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxHeartbeatsPerSecond = 2 }) // 2 nodes at 1 s
	// Another replica on the same store takes the joins.
	other, err := New(e.ctx(), Config{Store: e.srv.st, Clock: e.clock, Lender: e.lender, BootstrapToken: bootTok, MaxHeartbeatsPerSecond: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := other.join(e.ctx(), api.JoinRequest{Name: fmt.Sprintf("n%d", i), Fingerprint: api.Fingerprint{MachineID: fmt.Sprintf("mid-%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.srv.heartbeatInterval(); got != time.Second {
		t.Fatalf("before counting: %v", got)
	}
	e.srv.rep.leading.Store(true)
	ctx, cancel := context.WithCancel(e.ctx())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.srv.followLoop(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	for deadline := time.Now().Add(20 * time.Second); e.srv.heartbeatInterval() != 2500*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatalf("the elected replica tells %v with 5 nodes at 2 heartbeats/s, want 2.5 s", e.srv.heartbeatInterval())
		}
		runtime.Gosched()
	}
}
