package controlplane

import (
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestUnservedLeaseLost: a lender's heartbeats with complete lists
// (LeasesComplete) that do not list an active lease with a part on the
// node make the lease lost, but only once a heartbeat made after reading
// the answer to one that did not list it either (it sends that answer's
// check back) does not list it: a heartbeat whose lists may predate the
// lease's prepare (the agent's first, or one sending back an older
// check) and a heartbeat that lists the lease do not. The lease's range
// stays marked as being wiped until a heartbeat lists it neither as
// served nor as being wiped. Heartbeats without complete lists (an older
// agent) never lose a lease, and get no check.
func TestUnservedLeaseLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j, node := e.join("n1", 1<<30)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	beat := func(h api.Heartbeat) api.HeartbeatResponse {
		t.Helper()
		h.Health = "ok"
		r, err := node.Heartbeat(e.ctx(), j.NodeID, h)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	state := func() api.Lease {
		t.Helper()
		got, err := e.alice.Lease(e.ctx(), l.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	active := func(when string) {
		t.Helper()
		if got := state(); got.State != api.LeaseActive {
			t.Fatalf("%s: the lease is %s (%q)", when, got.State, got.Reason)
		}
	}

	// An older agent's heartbeats, listing nothing.
	for range 3 {
		if r := beat(api.Heartbeat{}); r.Check != "" {
			t.Fatalf("a heartbeat without complete lists answered with check %q", r.Check)
		}
	}
	active("after heartbeats without complete lists")

	r := beat(api.Heartbeat{LeasesComplete: true})
	if r.Check == "" {
		t.Fatal("the first heartbeat with complete lists got no check")
	}
	active("after one heartbeat that does not list it")
	r = beat(api.Heartbeat{LeasesComplete: true, Check: "an older answer's"})
	active("after a heartbeat made before the answer that suspected it")
	r = beat(api.Heartbeat{LeasesComplete: true, Check: r.Check, Leases: []string{l.ID}})
	active("after a heartbeat that lists it")
	// Checks are not read on every heartbeat: until the next, those
	// not listing it change nothing.
	last := r.Check
	for r = beat(api.Heartbeat{LeasesComplete: true, Check: last}); r.Check == ""; r = beat(api.Heartbeat{LeasesComplete: true, Check: last}) {
		active("after a heartbeat not checked")
	}
	active("after one heartbeat that does not list it since it listed it")

	// The lender wipes the range: the next heartbeat, made after that
	// answer, lists the lease as being wiped only.
	beat(api.Heartbeat{LeasesComplete: true, Check: r.Check, Wiping: []string{l.ID}})
	got := state()
	if got.State != api.LeaseLost || !strings.Contains(got.Reason, "does not serve the lease") || !strings.Contains(got.Reason, j.NodeID) {
		t.Fatalf("the lease its lender does not serve: %s (%q)", got.State, got.Reason)
	}
	if !e.srv.res.marked(l.ID, j.NodeID) {
		t.Fatal("the lost lease's range is not marked as being wiped")
	}
	beat(api.Heartbeat{LeasesComplete: true, Wiping: []string{l.ID}})
	if !e.srv.res.marked(l.ID, j.NodeID) {
		t.Fatal("the lost lease's range unmarked while its lender wipes it")
	}
	beat(api.Heartbeat{LeasesComplete: true})
	if e.srv.res.marked(l.ID, j.NodeID) {
		t.Fatal("the lost lease's range still marked once its lender wiped it")
	}
}

// TestUnservedWatchForgetsNode: the watch of the leases a node does not
// serve forgets the node when the node is removed (its entry was kept
// for good), and when a join takes the node over or says its agent lost
// its exports: the node's leases are lost then, and its new agent's first
// heartbeat with complete lists is checked, as a node's first is, not
// counted on from the run before (unservedEvery).
func TestUnservedWatchForgetsNode(t *testing.T) {
	t.Parallel()
	tracked := func(e *env, node string) bool {
		e.srv.unserved.mu.Lock()
		defer e.srv.unserved.mu.Unlock()
		_, ok := e.srv.unserved.nodes[node]
		return ok
	}
	// run joins n1 and sends two heartbeats with complete lists, the
	// first checked, the second not; then again removes the node or
	// joins it again, and the next heartbeat, sent with the client again
	// returns (none: nothing more to send), is to be checked.
	run := func(t *testing.T, again func(e *env, j api.JoinResponse) *api.Client) {
		e := newEnv(t)
		j, node := e.join("n1", 1<<30)
		beat := func(c *api.Client) api.HeartbeatResponse {
			t.Helper()
			r, err := c.Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok", LeasesComplete: true})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		if r := beat(node); r.Check == "" {
			t.Fatal("the node's first heartbeat with complete lists was not checked")
		}
		if r := beat(node); r.Check != "" {
			t.Fatal("the node's second heartbeat was checked: the test expects one in unservedEvery")
		}
		if !tracked(e, j.NodeID) {
			t.Fatal("the watch has no entry for a node it checked")
		}
		c := again(e, j)
		if c == nil {
			return
		}
		if r := beat(c); r.Check == "" {
			t.Fatal("the first heartbeat after the join was not checked: the watch counted on from the node's run before")
		}
	}
	down := func(t *testing.T, e *env, id string) {
		t.Helper()
		if err := e.srv.st.SetNodeState(e.ctx(), id, api.NodeReady, api.NodeDown, api.Event{At: e.clock.Now(), Type: "node.down", Subject: id}); err != nil {
			t.Fatal(err)
		}
		e.srv.live.forget(id)
	}
	t.Run("removed", func(t *testing.T) {
		t.Parallel()
		run(t, func(e *env, j api.JoinResponse) *api.Client {
			if _, err := e.admin.RemoveNode(e.ctx(), j.NodeID, true); err != nil {
				t.Fatal(err)
			}
			if tracked(e, j.NodeID) {
				t.Fatal("the watch kept its entry for a removed node")
			}
			return nil
		})
	})
	t.Run("taken over", func(t *testing.T) {
		t.Parallel()
		run(t, func(e *env, j api.JoinResponse) *api.Client {
			down(t, e, j.NodeID)
			j2, c := e.join("n1", 1<<30)
			if j2.NodeID != j.NodeID {
				t.Fatalf("the takeover joined as %s", j2.NodeID)
			}
			return c
		})
	})
	t.Run("lost exports", func(t *testing.T) {
		t.Parallel()
		run(t, func(e *env, j api.JoinResponse) *api.Client {
			req := joinRequest("n1", j.Credential, 1<<30)
			req.LostExports = true
			j2, err := e.boot.Join(e.ctx(), req)
			if err != nil || j2.NodeID != j.NodeID {
				t.Fatalf("the lost-state join: %v %+v", err, j2)
			}
			return e.boot.WithToken(j2.Credential)
		})
	})
}
