package controlplane

import (
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestHeartbeatSpreading: past MaxHeartbeatsPerSecond × HeartbeatInterval
// nodes, join and heartbeat answers stretch the interval so that the
// heartbeats of all agents stay under the cap, and the sweep judges
// silence on the stretched scale (suspect after SuspectAfter × stretch).
func TestHeartbeatSpreading(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) {
		c.MaxHeartbeatsPerSecond = 2 // 2 nodes at the base interval of 1 s
		c.SuspectAfter, c.DownAfter = 3*time.Second, 10*time.Second
	})
	j1, n1 := e.join("n1", 1<<30)
	if j1.HeartbeatSeconds != 1 {
		t.Fatalf("first node told %v s", j1.HeartbeatSeconds)
	}
	e.join("n2", 1<<30)
	e.join("n3", 1<<30)
	j4, _ := e.join("n4", 1<<30)
	// 4 nodes at ≤ 2 heartbeats/s: every 2 s each.
	if j4.HeartbeatSeconds != 2 {
		t.Fatalf("fourth node told %v s, want 2", j4.HeartbeatSeconds)
	}
	r, err := n1.Heartbeat(e.ctx(), j1.NodeID, api.Heartbeat{Health: "ok"})
	if err != nil || r.HeartbeatSeconds != 2 {
		t.Fatalf("heartbeat answer %v s (%v), want 2", r.HeartbeatSeconds, err)
	}
	state := func(id string) api.NodeState {
		n, err := e.alice.Node(e.ctx(), id)
		if err != nil {
			t.Fatal(err)
		}
		return n.State
	}
	// 5 s of silence: past SuspectAfter (3 s), within its stretch (6 s).
	e.clock.Advance(5 * time.Second)
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if s := state(j1.NodeID); s != api.NodeReady {
		t.Fatalf("n1 %s after 5 s with a 6 s stretched threshold", s)
	}
	e.clock.Advance(2 * time.Second) // 7 s
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if s := state(j1.NodeID); s != api.NodeSuspect {
		t.Fatalf("n1 %s after 7 s", s)
	}
	e.clock.Advance(12 * time.Second) // 19 s: under the stretched grace period (20 s)
	e.srv.Sweep(e.ctx())
	if s := state(j1.NodeID); s != api.NodeSuspect {
		t.Fatalf("n1 %s after 19 s", s)
	}
	e.clock.Advance(2 * time.Second)
	e.srv.Sweep(e.ctx())
	if s := state(j1.NodeID); s != api.NodeDown {
		t.Fatalf("n1 %s after 21 s", s)
	}
}
