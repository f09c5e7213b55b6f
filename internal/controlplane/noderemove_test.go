package controlplane

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// TestRemovalIsFinal: a forced removal that lands between a flush taking
// a node's heartbeat kept in memory and writing it, or while a heartbeat
// that had already been authenticated is in flight (on this replica or
// another), leaves the node removed: no node.ready event, not among the
// ready peers, and the late heartbeat is answered not found (the agent
// joins again, as a new incarnation with a new credential).
func TestRemovalIsFinal(t *testing.T) {
	e := newEnv(t)
	j, c := e.join("n1", 1<<30)
	j2, c2 := e.join("n2", 1<<30)
	// Another replica on the same store, which has heard n1 before.
	srv2, err := New(e.ctx(), Config{Store: e.srv.st, Clock: e.clock, Lender: e.lender, BootstrapToken: bootTok, Tokens: e.srv.cfg.Tokens})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(500 * time.Millisecond)
	if _, err := srv2.heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"}); err != nil {
		t.Fatal(err)
	}
	// n1's on-time heartbeat is kept in memory on the first replica.
	e.clock.Advance(500 * time.Millisecond)
	if _, err := c.Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.srv.live.lastSeen(j.NodeID); !ok {
		t.Fatal("the on-time heartbeat was not kept in memory")
	}
	// The removal lands after the flush took it, before it is written.
	removed := false
	e.srv.live.taken = func() {
		if removed {
			return
		}
		removed = true
		if _, err := e.admin.RemoveNode(e.ctx(), j.NodeID, true); err != nil {
			t.Errorf("remove: %v", err)
		}
	}
	e.srv.flushBeats(e.ctx())
	e.srv.live.taken = nil
	if !removed {
		t.Fatal("the flush hook did not run")
	}
	assertRemoved := func(when string) {
		t.Helper()
		n, err := e.srv.st.Node(e.ctx(), j.NodeID)
		if err != nil || n.State != api.NodeRemoved {
			t.Fatalf("%s: node %v %+v, want removed", when, err, n.State)
		}
		evs, err := e.srv.st.Events(e.ctx(), 0, 1000, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Subject == j.NodeID && ev.Type == "node.ready" {
				t.Fatalf("%s: %+v", when, ev)
			}
		}
		for _, p := range e.srv.peers.peersOf("") {
			if p.ID == j.NodeID {
				t.Fatalf("%s: the removed node is among the ready peers", when)
			}
		}
	}
	assertRemoved("after the flush")

	// Heartbeats that were in flight (authenticated before the removal)
	// reach the record now. On the remover's replica it is written at
	// once and refused.
	e.clock.Advance(200 * time.Millisecond)
	if _, err := e.srv.heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an in-flight heartbeat of the removed node: %v, want not found", err)
	}
	assertRemoved("after an in-flight heartbeat")
	// The other replica has not heard of the removal (no revocation bus
	// on SQLite) and still knows n1 as ready: it keeps the heartbeat in
	// memory, and its flush is refused and forgets the node.
	e.clock.Advance(200 * time.Millisecond)
	if _, err := srv2.heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"}); err != nil {
		t.Fatalf("an in-flight heartbeat to another replica: %v", err)
	}
	if _, ok := srv2.live.lastSeen(j.NodeID); !ok {
		t.Fatal("the other replica did not keep the heartbeat in memory")
	}
	srv2.flushBeats(e.ctx())
	assertRemoved("after the other replica's flush")
	e.clock.Advance(200 * time.Millisecond)
	if _, err := srv2.heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the other replica's next heartbeat of the removed node: %v, want not found", err)
	}
	assertRemoved("after the other replica's next heartbeat")
	// A replica that hears of the removal on the revocation bus
	// (applyRevocation: PostgreSQL replicas) forgets the node's liveness
	// too: its next heartbeat there is written before the answer, and
	// refused.
	j3, _ := e.join("n3", 1<<30)
	e.clock.Advance(200 * time.Millisecond)
	if _, err := srv2.heartbeat(e.ctx(), j3.NodeID, api.Heartbeat{Health: "ok"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.RemoveNode(e.ctx(), j3.NodeID, true); err != nil {
		t.Fatal(err)
	}
	srv2.applyRevocation(e.ctx(), j3.NodeID, nil)
	e.clock.Advance(200 * time.Millisecond)
	if _, err := srv2.heartbeat(e.ctx(), j3.NodeID, api.Heartbeat{Health: "ok"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a heartbeat in flight to a replica that heard of the removal: %v, want not found", err)
	}

	// The old credential opens nothing; the other node is unaffected.
	e.clock.Advance(time.Second)
	if _, err := c.Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"}); err == nil {
		t.Fatal("the removed node's credential still heartbeats")
	}
	if _, err := c2.Heartbeat(e.ctx(), j2.NodeID, api.Heartbeat{Health: "ok"}); err != nil {
		t.Fatal(err)
	}
	e.srv.flushBeats(e.ctx())
	if n, err := e.srv.st.Node(e.ctx(), j2.NodeID); err != nil || n.State != api.NodeReady {
		t.Fatalf("the other node: %v %+v", err, n.State)
	}
}

// TestRemoveRefusalSaysWhen: an operator who stopped a node's agent and
// runs `rialto node remove` at once finds the node still ready, then
// suspect; the refusal says how long the node has been silent and after
// how much silence it is down and can be removed, and it then can.
func TestRemoveRefusalSaysWhen(t *testing.T) {
	e := newEnv(t)
	j, c := e.join("n1", 1<<30)
	if _, err := c.Heartbeat(e.ctx(), j.NodeID, api.Heartbeat{Health: "ok"}); err != nil {
		t.Fatal(err)
	}
	// The agent stops; the operator removes the node a second later.
	e.clock.Advance(time.Second)
	refused := func(want ...string) {
		t.Helper()
		_, err := e.admin.RemoveNode(e.ctx(), j.NodeID, false)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != "conflict" {
			t.Fatalf("remove: %v, want conflict", err)
		}
		for _, w := range want {
			if !strings.Contains(ae.Message, w) {
				t.Errorf("refusal %q does not say %q", ae.Message, w)
			}
		}
	}
	refused("n1 (", "is ready", "heartbeated 1s ago", "once it is down (after 10s without a heartbeat)", "force the removal")
	e.clock.Advance(4 * time.Second)
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	refused("is suspect", "no heartbeat for 5s", "can be removed, after 10s without one", "force the removal")
	e.clock.Advance(6 * time.Second)
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.RemoveNode(e.ctx(), j.NodeID, false); err != nil {
		t.Fatalf("remove once down: %v", err)
	}
}

// TestMetricsTargetsLeaveRemovedNodesOut: a removed node's agent is no
// longer a scrape target (Prometheus would report it down for ever),
// while a node that is down still is.
func TestMetricsTargetsLeaveRemovedNodesOut(t *testing.T) {
	e := newEnv(t)
	j1, _ := e.join("n1", 1<<30)
	e.join("n2", 1<<30)
	if _, err := e.admin.RemoveNode(e.ctx(), j1.NodeID, true); err != nil {
		t.Fatal(err)
	}
	groups, err := e.alice.MetricsTargets(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, g := range groups {
		if g.Labels["component"] == "agent" {
			nodes = append(nodes, g.Labels["node"])
		}
	}
	if !slices.Equal(nodes, []string{"n2"}) {
		t.Fatalf("agent targets of nodes %v, want [n2] (n1 was removed)", nodes)
	}
}
