package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// testRemoveNode: a removed node (rialto node remove) reads back removed,
// with its cordon; its credential finds nothing any more, its devices are
// unavailable and its removal is an event; unknown nodes are not found.
func testRemoveNode(t *testing.T, o Options) {
	ctx := context.Background()
	s, rm := openRemover(t, o)
	now := time.Now()
	n, _, err := s.JoinNode(ctx, store.JoinNode{Node: api.Node{ID: "node-1", Name: "n1", State: api.NodeReady,
		Fingerprint: api.Fingerprint{MachineID: "m1"}, LastHeartbeat: now, JoinedAt: now}, CredentialHash: "h1", AgentKey: "k1",
		Devices: []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 100}}}, api.Event{})
	if err != nil {
		t.Fatal(err)
	}
	if mv, ok := s.(store.Mover); ok {
		if _, err := mv.SetNodeCordon(ctx, n.ID, true, api.Event{At: now, Type: "node.cordoned"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := rm.RemoveNode(ctx, "nope", nil, api.Event{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("removing an unknown node: %v", err)
	}
	got, _, err := rm.RemoveNode(ctx, n.ID, nil, api.Event{At: now, Type: "node.removed", Subject: n.ID, State: string(api.NodeRemoved)})
	if err != nil || got.State != api.NodeRemoved || got.ID != n.ID {
		t.Fatalf("remove: %v %+v", err, got)
	}
	if _, ok := s.(store.Mover); ok && !got.Cordoned {
		t.Error("the removed node lost its cordon")
	}
	if rn, err := s.Node(ctx, n.ID); err != nil || rn.State != api.NodeRemoved {
		t.Fatalf("the removed node reads back: %v %+v", err, rn)
	}
	if _, err := s.NodeByCredential(ctx, "h1"); err == nil {
		t.Fatal("the removed node's credential still finds it")
	}
	devs, err := s.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.NodeID == n.ID && d.State != "unavailable" {
			t.Fatalf("a removed node's device is %s", d.State)
		}
	}
	evs, _ := s.Events(ctx, 0, 100, "")
	found := false
	for _, e := range evs {
		found = found || (e.Type == "node.removed" && e.Subject == n.ID)
	}
	if !found {
		t.Error("no node.removed event")
	}
}

// testRemovalRevoked: the serials of the certificates a node's removal
// revoked are kept with the removed node, through this store and another
// replica on the same database: those RemoveNode recorded, with those
// added after its commit (each once); none for a node that is not
// removed, nor for one that joined again since (its join, a takeover,
// forgets them, so that its next removal's are the only ones); added to
// a node not removed, nothing; added for an earlier removal record (its
// generation, which RemoveNode returns and every join raises), nothing;
// an unknown node is not found.
func testRemovalRevoked(t *testing.T, o Options) {
	ctx := context.Background()
	s, rm := openRemover(t, o)
	now := time.Now()
	join := func() {
		t.Helper()
		if _, _, err := s.JoinNode(ctx, store.JoinNode{Node: api.Node{ID: "node-1", Name: "n1", State: api.NodeReady,
			Fingerprint: api.Fingerprint{MachineID: "m1"}, LastHeartbeat: now, JoinedAt: now}, CredentialHash: "h-" + now.String(), AgentKey: "k1"},
			api.Event{At: now, Type: "node.joined"}); err != nil {
			t.Fatal(err)
		}
	}
	join()
	readers := withReplica(t, o, s)
	want := func(what string, gen int64, serials ...string) {
		t.Helper()
		for i, r := range readers {
			got, err := r.(store.NodeRemover).RemovalRevoked(ctx, "node-1")
			if err != nil || !slices.Equal(got.Revoked, serials) || got.Gen != gen {
				t.Fatalf("%s (reader %d): %+v %v, want %v of generation %d", what, i, got, err, serials, gen)
			}
		}
	}
	rec, err := rm.RemovalRevoked(ctx, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	gen := rec.Gen
	want("a node not removed", gen)
	if err := rm.AddRemovalRevoked(ctx, "node-1", gen, []string{"ab"}); err != nil {
		t.Fatal(err)
	}
	want("serials added to a node not removed", gen)
	_, g, err := rm.RemoveNode(ctx, "node-1", []string{"a1", "b2"}, api.Event{At: now, Type: "node.removed", Subject: "node-1"})
	if err != nil || g != gen {
		t.Fatalf("removing: generation %d %v, want %d", g, err, gen)
	}
	want("the removal's", gen, "a1", "b2")
	if err := rm.AddRemovalRevoked(ctx, "node-1", gen, []string{"b2", "c3"}); err != nil {
		t.Fatal(err)
	}
	want("with those revoked after the removal", gen, "a1", "b2", "c3")
	now = now.Add(time.Second)
	join()
	want("a node that joined again", gen+1)
	if _, g, err = rm.RemoveNode(ctx, "node-1", []string{"d4"}, api.Event{At: now, Type: "node.removed", Subject: "node-1"}); err != nil || g != gen+1 {
		t.Fatalf("removing again: generation %d %v, want %d", g, err, gen+1)
	}
	want("its next removal's", gen+1, "d4")
	// The first removal's late serials go to its record only.
	if err := rm.AddRemovalRevoked(ctx, "node-1", gen, []string{"e0"}); err != nil {
		t.Fatal(err)
	}
	want("added for the earlier removal", gen+1, "d4")
	if _, err := rm.RemovalRevoked(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an unknown node's: %v", err)
	}
	if err := rm.AddRemovalRevoked(ctx, "nope", 0, []string{"e5"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("added to an unknown node: %v", err)
	}
}

// testUnrecordedRemovalRevoked: the certificates recorded as issued to
// a removed node that are revoked and that its removal record lacks are
// found again (a removal's late serials whose write failed, forgotten by
// a restart), with the record's generation, through this store and
// another replica on the same database: not those the record names, nor
// those not revoked, nor those expired off the list, nor another node's
// that is not removed; none once they are added to the record, nor once
// the node joined again.
func testUnrecordedRemovalRevoked(t *testing.T, o Options) {
	ctx := context.Background()
	s, rm := openRemover(t, o)
	rv := revocationsOrSkip(t, s)
	now := time.Now().UTC().Truncate(time.Second)
	joinMachine(ctx, t, s, "node-1", "h1", now)
	joinMachine(ctx, t, s, "node-2", "h2", now)
	for _, c := range []struct {
		serial, cn string
		notAfter   time.Time
	}{
		{"a1", "node-1", now.Add(time.Hour)},       // named by the removal
		{"a2", "node-1", now.Add(time.Hour)},       // revoked after it, not recorded
		{"a3", "node-1", now.Add(time.Hour)},       // not revoked
		{"a4", "node-1", now.Add(2 * time.Minute)}, // revoked, expired off the list
		{"b1", "node-2", now.Add(time.Hour)},       // revoked, its node not removed
	} {
		if err := rv.RecordIssued(ctx, c.serial, c.cn, c.notAfter, now); err != nil {
			t.Fatal(err)
		}
	}
	readers := withReplica(t, o, s)
	want := func(what string, exp map[string]store.RemovalRecord) {
		t.Helper()
		for i, r := range readers {
			got, err := r.(store.NodeRemover).UnrecordedRemovalRevoked(ctx)
			if err != nil || len(got) != len(exp) {
				t.Fatalf("%s (reader %d): %+v %v, want %+v", what, i, got, err, exp)
			}
			for id, e := range exp {
				if g := got[id]; g.Gen != e.Gen || !slices.Equal(g.Revoked, e.Revoked) {
					t.Fatalf("%s (reader %d): %+v, want %+v", what, i, got, exp)
				}
			}
		}
	}
	if _, _, err := rv.Revoke(ctx, []store.RevokedCert{{Serial: "a1"}}, "", time.Time{}, now, 0); err != nil {
		t.Fatal(err)
	}
	want("a node not removed", nil)
	_, gen, err := rm.RemoveNode(ctx, "node-1", []string{"a1"}, api.Event{At: now, Type: "node.removed", Subject: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rv.Revoke(ctx, []store.RevokedCert{{Serial: "a2"}, {Serial: "a4"}, {Serial: "b1"}}, "", time.Time{}, now, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := rv.ExpireRevoked(ctx, now.Add(time.Minute*3)); err != nil {
		t.Fatal(err)
	}
	want("revoked after the removal", map[string]store.RemovalRecord{"node-1": {Gen: gen, Revoked: []string{"a2"}}})
	if err := rm.AddRemovalRevoked(ctx, "node-1", gen, []string{"a2"}); err != nil {
		t.Fatal(err)
	}
	want("recorded", nil)
	if _, _, err := rv.Revoke(ctx, []store.RevokedCert{{Serial: "a5"}}, "", time.Time{}, now, 0); err != nil {
		t.Fatal(err)
	}
	if err := rv.RecordIssued(ctx, "a5", "node-1", now.Add(time.Hour), now); err != nil {
		t.Fatal(err)
	}
	want("one more", map[string]store.RemovalRecord{"node-1": {Gen: gen, Revoked: []string{"a5"}}})
	now = now.Add(time.Second)
	joinMachine(ctx, t, s, "node-1", "h1-again", now)
	want("joined again", nil)
}

// testUnrevokedRemoved: the certificates recorded as issued to a removed
// node that no revocation names (a renewal's during the removal, which
// its second pass did not revoke: the replica removing the node stopped
// first) are found, with the removal record's generation, through this
// store and another replica on the same database: not those revoked, nor
// those expired off the list, nor those expired, nor another node's that
// is not removed; none once they are revoked, nor once the node joined
// again, whose certificates issued then are not found either.
func testUnrevokedRemoved(t *testing.T, o Options) {
	ctx := context.Background()
	s, rm := openRemover(t, o)
	rv := revocationsOrSkip(t, s)
	now := time.Now().UTC().Truncate(time.Second)
	issue := func(serial, cn string, notAfter time.Time) {
		t.Helper()
		if err := rv.RecordIssued(ctx, serial, cn, notAfter, now); err != nil {
			t.Fatal(err)
		}
	}
	joinMachine(ctx, t, s, "node-1", "h1", now)
	joinMachine(ctx, t, s, "node-2", "h2", now)
	issue("a1", "node-1", now.Add(time.Hour))      // revoked by the removal
	issue("a4", "node-1", now.Add(2*time.Minute))  // revoked, expired off the list
	issue("a5", "node-1", now.Add(90*time.Second)) // not revoked, expired at the look
	issue("b1", "node-2", now.Add(time.Hour))      // not revoked, its node not removed
	readers := withReplica(t, o, s)
	at := now.Add(100 * time.Second)
	want := func(what string, exp map[string]store.UnrevokedCerts) {
		t.Helper()
		for i, r := range readers {
			got, err := r.(store.NodeRemover).UnrevokedRemoved(ctx, at)
			if err != nil || len(got) != len(exp) {
				t.Fatalf("%s (reader %d): %+v %v, want %+v", what, i, got, err, exp)
			}
			for id, e := range exp {
				if g := got[id]; g.Gen != e.Gen || !slices.Equal(g.Serials, e.Serials) {
					t.Fatalf("%s (reader %d): %+v, want %+v", what, i, got, exp)
				}
			}
		}
	}
	want("no node removed", nil)
	if _, _, err := rv.Revoke(ctx, []store.RevokedCert{{Serial: "a4"}}, "node-1", now, now, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := rv.ExpireRevoked(ctx, now.Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	// Signed during the removal, after its first pass.
	issue("a2", "node-1", now.Add(time.Hour))
	issue("a3", "node-1", now.Add(2*time.Hour))
	_, gen, err := rm.RemoveNode(ctx, "node-1", []string{"a1", "a4"}, api.Event{At: now, Type: "node.removed", Subject: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	want("removed", map[string]store.UnrevokedCerts{"node-1": {Gen: gen, Serials: []string{"a2", "a3"}}})
	if _, _, err := rv.Revoke(ctx, []store.RevokedCert{{Serial: "a2"}}, "", time.Time{}, now, 0); err != nil {
		t.Fatal(err)
	}
	want("one revoked", map[string]store.UnrevokedCerts{"node-1": {Gen: gen, Serials: []string{"a3"}}})
	// The node joins again before a3 is revoked: its new certificate, and
	// a3, are no removed node's.
	now = now.Add(time.Second)
	joinMachine(ctx, t, s, "node-1", "h1-again", now)
	issue("c1", "node-1", now.Add(time.Hour))
	want("joined again", nil)
	// Removed again: what no revocation names is found, with the new
	// record's generation.
	_, gen2, err := rm.RemoveNode(ctx, "node-1", nil, api.Event{At: now, Type: "node.removed", Subject: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	if gen2 == gen {
		t.Fatalf("the second removal's record has the first's generation %d", gen)
	}
	want("removed again", map[string]store.UnrevokedCerts{"node-1": {Gen: gen2, Serials: []string{"a3", "c1"}}})
	if _, _, err := rv.Revoke(ctx, nil, "node-1", now, now, 0); err != nil {
		t.Fatal(err)
	}
	want("all revoked", nil)
}

// testHeartbeatAfterRemove: removal is final for heartbeats. A heartbeat
// of a removed node, alone or in a batch with others, written through this
// store or another replica on the same database, is refused (not found)
// and writes nothing: the node stays removed, with its old last-seen time,
// no links and no node.ready event, while the batch's other heartbeats
// are written. Only a join brings the machine back.
func testHeartbeatAfterRemove(t *testing.T, o Options) {
	ctx := context.Background()
	s, rm := openRemover(t, o)
	joined := time.Now().UTC().Truncate(time.Microsecond)
	join := func(id, machine, cred string) {
		t.Helper()
		if _, _, err := s.JoinNode(ctx, store.JoinNode{Node: api.Node{ID: id, Name: id, State: api.NodeReady,
			Fingerprint: api.Fingerprint{MachineID: machine}, LastHeartbeat: joined, JoinedAt: joined}, CredentialHash: cred, AgentKey: "k-" + id},
			api.Event{At: joined, Type: "node.joined", Subject: id}); err != nil {
			t.Fatal(err)
		}
	}
	join("node-1", "m1", "h1")
	join("node-2", "m2", "h2")
	// node-2 is suspect: its heartbeat takes the same path as a removed
	// node's (the node is not ready) and must still make it ready.
	if err := s.SetNodeState(ctx, "node-2", api.NodeReady, api.NodeSuspect, api.Event{At: joined, Type: "node.suspect", Subject: "node-2"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rm.RemoveNode(ctx, "node-1", nil, api.Event{At: joined, Type: "node.removed", Subject: "node-1", State: string(api.NodeRemoved)}); err != nil {
		t.Fatal(err)
	}
	writers := []struct {
		name string
		st   store.Store
	}{{"same store", s}}
	if o.Reopen != nil {
		r := o.Reopen(t, s)
		t.Cleanup(func() { r.Close() })
		writers = append(writers, struct {
			name string
			st   store.Store
		}{"another replica", r})
	}
	at := joined.Add(time.Second)
	link := func(from, to string) []api.Link {
		return []api.Link{{From: from, To: to, Kind: "ethernet", RTTMicros: 5, Status: "up", MeasuredAt: at}}
	}
	for _, w := range writers {
		at = at.Add(time.Second)
		if _, err := w.st.Heartbeat(ctx, "node-1", at, "ok", link("node-1", "controlplane")); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s: a removed node's heartbeat: %v, want not found", w.name, err)
		}
		prev, errs, err := w.st.Heartbeats(ctx, []store.Beat{
			{NodeID: "node-1", At: at, Health: "ok", Links: link("node-1", "node-2")},
			{NodeID: "node-2", At: at, Health: "ok", Links: link("node-2", "controlplane")},
			{NodeID: "node-1", At: at, Health: "late", Links: link("node-1", "controlplane")},
		})
		if err != nil || !errors.Is(errs[0], store.ErrNotFound) || errs[1] != nil || !errors.Is(errs[2], store.ErrNotFound) {
			t.Fatalf("%s: batch with a removed node: %v %v", w.name, errs, err)
		}
		if prev[1] != api.NodeSuspect && prev[1] != api.NodeReady {
			t.Fatalf("%s: node-2 was %s", w.name, prev[1])
		}
		n, err := s.Node(ctx, "node-1")
		if err != nil || n.State != api.NodeRemoved || !n.LastHeartbeat.Equal(joined) || n.Health == "late" {
			t.Fatalf("%s: the removed node after heartbeats: %v %+v", w.name, err, n)
		}
		if n2, err := s.Node(ctx, "node-2"); err != nil || n2.State != api.NodeReady || !n2.LastHeartbeat.Equal(at) {
			t.Fatalf("%s: node-2 after the batch: %v %+v", w.name, err, n2)
		}
	}
	ls, err := s.Links(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.From == "node-1" || l.To == "node-1" {
			t.Fatalf("a removed node's heartbeat wrote link %+v", l)
		}
	}
	evs, err := s.Events(ctx, 0, 1000, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Subject == "node-1" && e.Type == "node.ready" {
			t.Fatalf("a removed node's heartbeat emitted %+v", e)
		}
	}
	if _, err := s.NodeByCredential(ctx, "h1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the removed node's credential: %v", err)
	}
	// A join of the same machine brings it back, and its heartbeats count.
	join("node-x", "m1", "h1b")
	if n, err := s.NodeByCredential(ctx, "h1b"); err != nil || n.ID != "node-1" || n.State != api.NodeReady {
		t.Fatalf("rejoin: %v %+v", err, n)
	}
	at = at.Add(time.Second)
	if prev, err := s.Heartbeat(ctx, "node-1", at, "ok", nil); err != nil || prev != api.NodeReady {
		t.Fatalf("heartbeat after the rejoin: %v %v", prev, err)
	}
}

// openRemover opens a store of o that must implement store.NodeRemover.
func openRemover(t *testing.T, o Options) (store.Store, store.NodeRemover) {
	t.Helper()
	s := open(t, o)
	rm, ok := s.(store.NodeRemover)
	if !ok {
		t.Fatalf("%T does not implement store.NodeRemover", s)
	}
	return s, rm
}

// withReplica is s and, when o can reopen its database, another replica
// on it (closed when the test ends).
func withReplica(t *testing.T, o Options, s store.Store) []store.Store {
	t.Helper()
	out := []store.Store{s}
	if o.Reopen != nil {
		r := o.Reopen(t, s)
		t.Cleanup(func() { r.Close() })
		out = append(out, r)
	}
	return out
}

// joinMachine joins node id, ready, of machine "m-"+id with credential
// hash cred (agent key "k-"+id) at at.
func joinMachine(ctx context.Context, t *testing.T, s store.Store, id, cred string, at time.Time) {
	t.Helper()
	if _, _, err := s.JoinNode(ctx, store.JoinNode{Node: api.Node{ID: id, Name: id, State: api.NodeReady,
		Fingerprint: api.Fingerprint{MachineID: "m-" + id}, LastHeartbeat: at, JoinedAt: at}, CredentialHash: cred, AgentKey: "k-" + id},
		api.Event{At: at, Type: "node.joined", Subject: id}); err != nil {
		t.Fatal(err)
	}
}

// revocationsOrSkip is s's revocation list; it skips t for a store that
// keeps none.
func revocationsOrSkip(t *testing.T, s store.Store) store.Revocations {
	t.Helper()
	rv, ok := s.(store.Revocations)
	if !ok {
		t.Skipf("%T does not keep the revocation list", s)
	}
	return rv
}
