package storetest

import (
	"context"
	"errors"
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
	s := open(t, o)
	rm, ok := s.(store.NodeRemover)
	if !ok {
		t.Fatalf("%T does not implement store.NodeRemover", s)
	}
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
	if _, err := rm.RemoveNode(ctx, "nope", api.Event{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("removing an unknown node: %v", err)
	}
	got, err := rm.RemoveNode(ctx, n.ID, api.Event{At: now, Type: "node.removed", Subject: n.ID, State: string(api.NodeRemoved)})
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
