package controlplane

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// lookupCounter is the test's store, counting the credential lookups
// that reach it.
type lookupCounter struct {
	store.Store
	n atomic.Int64
}

func (c *lookupCounter) NodeByCredential(ctx context.Context, hash string) (api.Node, error) {
	c.n.Add(1)
	return c.Store.NodeByCredential(ctx, hash)
}

// TestAuthCacheFollowsStretchedInterval: a node that joined while the
// heartbeat interval was 1 s, and was then told a stretched one (a join
// storm: 10,000 nodes, 100 s), finds its cached credential at its next
// heartbeat 100 s later: the entry's lifetime, max(10 s, twice the
// interval), is the current interval's, not the one at join. The entry
// still lapses that long after its lookup (and sooner once the interval
// shrinks), and a drop (rejoin, removal, revocation) still forgets it at
// once.
func TestAuthCacheFollowsStretchedInterval(t *testing.T) {
	var st *lookupCounter
	e := newEnv(t, func(c *Config) {
		st = &lookupCounter{Store: c.Store}
		c.Store = st
	})
	j, c := e.join("n1", 1<<30) // caches its credential: the interval is 1 s
	joined := e.clock.Now()
	e.srv.setNodeCount(10000) // the join storm's other nodes
	beat := func(after time.Duration, lookups int64, why string) {
		t.Helper()
		e.clock.Advance(joined.Add(after).Sub(e.clock.Now()))
		before := st.n.Load()
		r, err := c.Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"})
		if err != nil {
			t.Fatalf("%s: %v", why, err)
		}
		if got := st.n.Load() - before; got != lookups {
			t.Fatalf("%s: %d credential lookup(s), want %d", why, got, lookups)
		}
		if r.HeartbeatSeconds != e.srv.heartbeatInterval().Seconds() {
			t.Fatalf("%s: told %v s", why, r.HeartbeatSeconds)
		}
	}
	beat(time.Second, 0, "the first heartbeat, told 100 s")
	beat(101*time.Second, 0, "the heartbeat 100 s later")
	beat(200*time.Second, 0, "twice the interval after the join")
	beat(201*time.Second, 1, "more than twice the interval after the join")
	beat(250*time.Second, 0, "within twice the interval after that lookup")
	// The cluster shrinks: the interval is 1 s again, and an entry is
	// used for 10 s after its lookup.
	e.srv.rep.nodeCount.Store(1)
	beat(260*time.Second, 1, "more than 10 s after the lookup, at a 1 s interval")
	beat(265*time.Second, 0, "within 10 s of that lookup")
	// A drop forgets the entry at once, whatever its lifetime.
	e.srv.setNodeCount(10000)
	e.srv.auth.dropNode(j.NodeID)
	beat(266*time.Second, 1, "after the node's entries were dropped")
}
