package sqlite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// TestMoves walks a part's moves through the store: the destination is
// reserved while the move is open (and refused to others), a finished
// move makes it the part (the source range freed, the lease's URI
// updated), a failed one frees it; a lease that is not active, a part that
// is no longer where the move starts, a part already moving are refused.
func TestMoves(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	var nodes []api.Node
	for _, name := range []string{"n1", "n2"} {
		n, _, err := s.JoinNode(ctx, store.JoinNode{
			Node:           api.Node{ID: "node-" + name, Name: name, State: api.NodeReady, Fingerprint: api.Fingerprint{MachineID: "m-" + name}, LastHeartbeat: now, JoinedAt: now},
			CredentialHash: "h-" + name, AgentKey: "k", Devices: []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 100}},
		}, api.Event{})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	devs, _ := s.Devices(ctx)
	devOf := map[string]string{}
	for _, d := range devs {
		devOf[d.NodeID] = d.ID
	}
	from := api.Part{NodeID: nodes[0].ID, DeviceID: devOf[nodes[0].ID], Offset: 0, Length: 40}
	if _, err := s.CreateLease(ctx, api.Lease{ID: "l1", State: api.LeaseReserved, Kind: api.KindBlock, Tenant: "t", Parts: []api.Part{from}},
		store.Demand{}, nil, api.Event{}); err != nil {
		t.Fatal(err)
	}
	to := api.Part{NodeID: nodes[1].ID, DeviceID: devOf[nodes[1].ID], Offset: 20, Length: 40}
	m := api.Move{ID: "mv1", LeaseID: "l1", Part: 0, Kind: api.KindBlock, State: api.MoveCopying, From: from, To: to, Size: 40, StartedAt: now}
	if err := s.BeginMove(ctx, m, api.Event{At: now, Type: "lease.move.started"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a move of a reserved lease: %v", err)
	}
	if _, err := s.TransitionLease(ctx, "l1", store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseActive,
		URIs: []string{"nbd://a/x"}, URI: "nbd://a/x", At: now}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	stale := m
	stale.From.Offset = 4
	if err := s.BeginMove(ctx, stale, api.Event{At: now}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a move from where the part is not: %v", err)
	}
	if err := s.BeginMove(ctx, m, api.Event{At: now, Type: "lease.move.started"}); err != nil {
		t.Fatal(err)
	}
	if err := s.BeginMove(ctx, api.Move{ID: "mv2", LeaseID: "l1", Part: 0, Kind: api.KindBlock, State: api.MoveCopying, From: from,
		To: api.Part{NodeID: nodes[1].ID, DeviceID: devOf[nodes[1].ID], Offset: 60, Length: 40}, StartedAt: now}, api.Event{At: now}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second move of a moving part: %v", err)
	}
	// The destination is taken while the move is open.
	if _, err := s.CreateLease(ctx, api.Lease{ID: "l2", State: api.LeaseReserved, Kind: api.KindBlock, Tenant: "t",
		Parts: []api.Part{{NodeID: nodes[1].ID, DeviceID: devOf[nodes[1].ID], Offset: 50, Length: 20}}}, store.Demand{}, nil, api.Event{}); !errors.Is(err, store.ErrCapacity) {
		t.Fatalf("a lease over a move's destination: %v", err)
	}
	if inv, _ := s.Inventory(ctx); len(inv.Parts) != 2 {
		t.Fatalf("placement sees %d live parts, want the part and its destination", len(inv.Parts))
	}
	if err := s.SetMoveState(ctx, "mv1", api.MoveSwitching, 40, now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	l, err := s.FinishMove(ctx, "mv1", "nbd://b/y", now.Add(2*time.Second), api.Event{At: now, Type: "lease.moved"})
	if err != nil {
		t.Fatal(err)
	}
	want := to
	want.URI = "nbd://b/y"
	if l.URI != "nbd://b/y" || len(l.Parts) != 1 || l.Parts[0] != want || l.NodeID != nodes[1].ID {
		t.Fatalf("lease after the move: %+v", l)
	}
	if l2, _ := s.Lease(ctx, "l1"); l2.Parts[0] != want {
		t.Fatalf("lease read back: %+v", l2.Parts)
	}
	if _, err := s.FinishMove(ctx, "mv1", "nbd://b/y", now, api.Event{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("finishing a move twice: %v", err)
	}
	ms, _ := s.Moves(ctx, store.MoveFilter{Open: true})
	if len(ms) != 1 || !ms[0].Committed || ms[0].State != api.MoveSwitching || ms[0].Copied != 40 {
		t.Fatalf("open moves: %+v", ms)
	}
	if err := s.EndMove(ctx, "mv1", api.MoveDone, "", 40, now.Add(3*time.Second), &api.Event{At: now, Type: "lease.move.done"}); err != nil {
		t.Fatal(err)
	}
	devs, _ = s.Devices(ctx)
	for _, d := range devs {
		if want := map[string]int64{nodes[0].ID: 0, nodes[1].ID: 40}[d.NodeID]; d.Allocated != want {
			t.Errorf("device on %s holds %d, want %d", d.NodeID, d.Allocated, want)
		}
	}

	// A failed move frees its destination and leaves the part.
	back := api.Move{ID: "mv3", LeaseID: "l1", Part: 0, Kind: api.KindBlock, State: api.MoveCopying, From: to, To: from, StartedAt: now}
	if err := s.BeginMove(ctx, back, api.Event{At: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.EndMove(ctx, "mv3", api.MoveFailed, "the destination did not answer", 0, now, nil); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.Lease(ctx, "l1"); l.Parts[0] != want {
		t.Fatalf("the part after a failed move: %+v", l.Parts)
	}
	devs, _ = s.Devices(ctx)
	for _, d := range devs {
		if d.NodeID == nodes[0].ID && d.Allocated != 0 {
			t.Errorf("a failed move's destination is still held: %d", d.Allocated)
		}
	}
	all, _ := s.Moves(ctx, store.MoveFilter{LeaseID: "l1"})
	if len(all) != 2 || all[0].State != api.MoveDone || all[1].State != api.MoveFailed || all[1].Error == "" {
		t.Fatalf("moves: %+v", all)
	}
	if open, _ := s.Moves(ctx, store.MoveFilter{Open: true}); len(open) != 0 {
		t.Fatalf("open moves left: %+v", open)
	}
}

func TestCordon(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	join := func() api.Node {
		n, _, err := s.JoinNode(ctx, store.JoinNode{Node: api.Node{ID: "node-1", Name: "n1", State: api.NodeReady,
			Fingerprint: api.Fingerprint{MachineID: "m1"}, LastHeartbeat: now, JoinedAt: now}, CredentialHash: "h1", AgentKey: "k1"}, api.Event{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := join()
	if _, err := s.SetNodeCordon(ctx, "nope", true, api.Event{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("cordon of an unknown node: %v", err)
	}
	got, err := s.SetNodeCordon(ctx, n.ID, true, api.Event{At: now, Type: "node.cordoned"})
	if err != nil || !got.Cordoned {
		t.Fatalf("cordon: %v %+v", err, got)
	}
	join()
	if rn, _ := s.Node(ctx, n.ID); !rn.Cordoned {
		t.Error("a rejoin uncordoned the node")
	}
	if ns, _ := s.Nodes(ctx); len(ns) != 1 || !ns[0].Cordoned {
		t.Fatalf("nodes: %+v", ns)
	}
	if inv, _ := s.Inventory(ctx); !inv.Nodes[0].Cordoned {
		t.Fatal("the inventory does not say the node is cordoned")
	}
	if got, err := s.SetNodeCordon(ctx, n.ID, false, api.Event{At: now, Type: "node.uncordoned"}); err != nil || got.Cordoned {
		t.Fatalf("uncordon: %v %+v", err, got)
	}
	// A removed node (rialto node remove) reads back with its cordon.
	if _, err := s.SetNodeCordon(ctx, n.ID, true, api.Event{At: now, Type: "node.cordoned"}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.RemoveNode(ctx, n.ID, api.Event{At: now, Type: "node.removed"}); err != nil || got.State != api.NodeRemoved || !got.Cordoned {
		t.Fatalf("remove: %v %+v", err, got)
	}
}
