package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// testJoinTakeover: a join of a known machine ID takes its node over
// (same ID, the new credential) when it presents the node's credential
// hash or names the node by its certificate (JoinedProven), or when the
// node is down or removed (JoinedTakeover); while the node is ready or
// suspect a join without either is refused with a *NodeLive (an
// ErrConflict) and writes nothing: the node keeps its credential, name
// and agent key.
func testJoinTakeover(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	now := time.Now()
	join := func(name, cred, proof, proofNode string) (api.Node, store.Joined, error) {
		return s.JoinNode(ctx, store.JoinNode{Node: api.Node{ID: "node-" + name, Name: name, State: api.NodeReady,
			Fingerprint: api.Fingerprint{MachineID: "m1"}, LastHeartbeat: now, JoinedAt: now}, CredentialHash: cred, AgentKey: "k-" + cred,
			ProofHash: proof, ProofNodeID: proofNode,
			Devices: []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 100}}}, api.Event{Type: "node.joined"})
	}
	n, how, err := join("n1", "h1", "", "")
	if err != nil || how != store.JoinedNew {
		t.Fatalf("first join: %v %v", how, err)
	}
	refused := func(what string, state api.NodeState, proof, proofNode string) {
		t.Helper()
		_, _, err := join("impostor", "h-bad", proof, proofNode)
		var live *store.NodeLive
		if !errors.As(err, &live) || !errors.Is(err, store.ErrConflict) || live.Node.ID != n.ID || live.Node.State != state || live.Node.Name != "n1" {
			t.Fatalf("%s: %v", what, err)
		}
		if got, err := s.NodeByCredential(ctx, "h1"); err != nil || got.ID != n.ID || got.Name != "n1" {
			t.Fatalf("%s: the node's credential after the refusal: %v %+v", what, err, got)
		}
		if rec, _ := s.Node(ctx, n.ID); rec.AgentKey != "k-h1" {
			t.Fatalf("%s: the refusal changed the agent key", what)
		}
	}
	refused("a join without proof of a ready node", api.NodeReady, "", "")
	refused("a join with another credential", api.NodeReady, "h-other", "")
	refused("a join with another node's certificate", api.NodeReady, "", "node-other")
	if err := s.SetNodeState(ctx, n.ID, api.NodeReady, api.NodeSuspect, api.Event{Type: "node.suspect"}); err != nil {
		t.Fatal(err)
	}
	refused("a join without proof of a suspect node", api.NodeSuspect, "", "")

	// Its agent, with its credential: the same node, the new credential.
	got, how, err := join("n1", "h2", "h1", "")
	if err != nil || how != store.JoinedProven || got.ID != n.ID {
		t.Fatalf("a join with the credential: %v %v %+v", how, err, got)
	}
	if _, err := s.NodeByCredential(ctx, "h1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the old credential after a rejoin: %v", err)
	}
	// With its certificate.
	if got, how, err = join("n1", "h3", "", n.ID); err != nil || how != store.JoinedProven || got.ID != n.ID {
		t.Fatalf("a join with the certificate: %v %v %+v", how, err, got)
	}

	// Down: taken over without proof.
	if err := s.SetNodeState(ctx, n.ID, api.NodeReady, api.NodeDown, api.Event{Type: "node.down"}); err != nil {
		t.Fatal(err)
	}
	got, how, err = join("n1", "h4", "", "")
	if err != nil || how != store.JoinedTakeover || got.ID != n.ID || got.State != api.NodeReady {
		t.Fatalf("a join without proof of a down node: %v %v %+v", how, err, got)
	}
	if bc, err := s.NodeByCredential(ctx, "h4"); err != nil || bc.ID != n.ID {
		t.Fatalf("the new credential after a takeover: %v %+v", err, bc)
	}
	evs, _ := s.Events(ctx, 0, 100, "")
	if last := evs[len(evs)-1]; last.Type != "node.joined" || last.Subject != n.ID {
		t.Fatalf("last event %+v", last)
	}

	// Removed: taken over without proof too.
	if rm, ok := s.(store.NodeRemover); ok {
		if _, _, err := rm.RemoveNode(ctx, n.ID, nil, api.Event{Type: "node.removed", Subject: n.ID}); err != nil {
			t.Fatal(err)
		}
		if got, how, err = join("n1", "h5", "h4", ""); err != nil || how != store.JoinedTakeover || got.ID != n.ID {
			t.Fatalf("a join of a removed node (its old credential forgotten): %v %v %+v", how, err, got)
		}
		// A certificate of a removed node proves nothing: its removal
		// revoked them all, and one it missed is the removed machine's.
		if _, _, err := rm.RemoveNode(ctx, n.ID, nil, api.Event{Type: "node.removed", Subject: n.ID}); err != nil {
			t.Fatal(err)
		}
		if got, how, err = join("n1", "h6", "", n.ID); err != nil || how != store.JoinedTakeover || got.ID != n.ID {
			t.Fatalf("a join of a removed node presenting a certificate of it: %v %v %+v", how, err, got)
		}
	}
}

// testJoinPrevCredential: the credential a proven join presented still
// proves a join of the node (its agent may have lost that join's answer)
// until a heartbeat of the node after that join is recorded; a takeover
// and a removal forget it. A credential older than that proves nothing.
func testJoinPrevCredential(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	now := time.Now()
	join := func(cred, proof string) (api.Node, store.Joined, error) {
		return s.JoinNode(ctx, store.JoinNode{Node: api.Node{ID: "node-n1", Name: "n1", State: api.NodeReady,
			Fingerprint: api.Fingerprint{MachineID: "m1"}, LastHeartbeat: now, JoinedAt: now}, CredentialHash: cred, AgentKey: "k-" + cred,
			ProofHash: proof, Devices: []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 100}}}, api.Event{Type: "node.joined"})
	}
	proven := func(what, cred, proof string) {
		t.Helper()
		if _, how, err := join(cred, proof); err != nil || how != store.JoinedProven {
			t.Fatalf("%s: %v %v", what, how, err)
		}
	}
	refused := func(what, proof string) {
		t.Helper()
		if _, _, err := join("h-bad", proof); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("%s: %v", what, err)
		}
	}
	n, _, err := join("h1", "")
	if err != nil {
		t.Fatal(err)
	}
	proven("a join with the current credential", "h2", "h1")
	// Its answer (h2) lost: h1 proves the node's again, and again.
	proven("a join with the credential the last join presented", "h3", "h1")
	proven("the same, once more", "h4", "h1")
	refused("a join with a credential the agent never presented", "h2")
	// A heartbeat of its agent from before that join, written late,
	// leaves h1 a proof.
	if _, err := s.Heartbeat(ctx, n.ID, now.Add(-time.Second), "ok", nil); err != nil {
		t.Fatal(err)
	}
	proven("a join with the credential the last join presented, after an earlier heartbeat", "h4", "h1")
	// Its agent heard with the answer (h4): h1 proves nothing any more.
	if _, err := s.Heartbeat(ctx, n.ID, now.Add(time.Second), "ok", nil); err != nil {
		t.Fatal(err)
	}
	refused("a join with the credential presented before the heartbeat", "h1")
	proven("a join with the current credential after the heartbeat", "h5", "h4")

	// A takeover forgets it.
	if err := s.SetNodeState(ctx, n.ID, api.NodeReady, api.NodeDown, api.Event{Type: "node.down"}); err != nil {
		t.Fatal(err)
	}
	if _, how, err := join("h6", ""); err != nil || how != store.JoinedTakeover {
		t.Fatalf("a takeover: %v %v", how, err)
	}
	refused("a join with the credential the last proven join presented, after a takeover", "h4")

	// So does a removal.
	rm, ok := s.(store.NodeRemover)
	if !ok {
		return
	}
	proven("a join with the current credential after the takeover", "h7", "h6")
	if _, _, err := rm.RemoveNode(ctx, n.ID, nil, api.Event{Type: "node.removed", Subject: n.ID}); err != nil {
		t.Fatal(err)
	}
	if _, how, err := join("h8", "h6"); err != nil || how != store.JoinedTakeover {
		t.Fatalf("a join of a removed node with the credential its last join presented: %v %v", how, err)
	}
}

// testJoinEarlierCredential: a join presents, with its credential, those
// earlier joins issued to its agent (EarlierProofHashes). One that is the
// node's stored credential proves the join (a database restored from a
// backup knows a credential its agent has replaced since), and so does
// one the node's last proven join presented, until a heartbeat after that
// join; neither proves anything once a takeover or a removal replaced the
// node's credential.
func testJoinEarlierCredential(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	now := time.Now()
	join := func(cred, proof string, earlier ...string) (api.Node, store.Joined, error) {
		return s.JoinNode(ctx, store.JoinNode{Node: api.Node{ID: "node-n1", Name: "n1", State: api.NodeReady,
			Fingerprint: api.Fingerprint{MachineID: "m1"}, LastHeartbeat: now, JoinedAt: now}, CredentialHash: cred, AgentKey: "k-" + cred,
			ProofHash: proof, EarlierProofHashes: earlier, Devices: []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 100}}}, api.Event{Type: "node.joined"})
	}
	proven := func(what, cred, proof string, earlier ...string) {
		t.Helper()
		if _, how, err := join(cred, proof, earlier...); err != nil || how != store.JoinedProven {
			t.Fatalf("%s: %v %v", what, how, err)
		}
		if got, err := s.NodeByCredential(ctx, cred); err != nil || got.ID != "node-n1" {
			t.Fatalf("%s: the new credential: %v %+v", what, err, got)
		}
	}
	refused := func(what, proof string, earlier ...string) {
		t.Helper()
		var live *store.NodeLive
		if _, _, err := join("h-bad", proof, earlier...); !errors.As(err, &live) || !errors.Is(err, store.ErrConflict) {
			t.Fatalf("%s: %v", what, err)
		}
	}
	n, _, err := join("h1", "")
	if err != nil {
		t.Fatal(err)
	}
	// The database knows h1; the agent holds hA since (a join the
	// restored database never saw), and h1 before it.
	refused("a join with a credential the node does not have, and none earlier", "hA")
	refused("a join with credentials the node does not have", "hA", "hB", "hC")
	proven("a join with an earlier credential that is the node's", "h2", "hA", "hB", "h1")
	// Its answer (h2) lost: the agent presents what it did, which proves
	// the node's again.
	proven("the same join again, its answer lost", "h3", "hA", "hB", "h1")
	// Heard with the answer (h3): h1 is no proof any more, h3 is.
	if _, err := s.Heartbeat(ctx, n.ID, now.Add(time.Second), "ok", nil); err != nil {
		t.Fatal(err)
	}
	refused("an earlier credential no longer the node's", "hA", "hB", "h1")
	proven("a join with the node's credential among the earlier ones", "h4", "hA", "h3", "h1")

	// Taken over (down, a join without proof): none of the credentials
	// the node had before proves anything, current or earlier.
	if err := s.SetNodeState(ctx, n.ID, api.NodeReady, api.NodeDown, api.Event{Type: "node.down"}); err != nil {
		t.Fatal(err)
	}
	if _, how, err := join("h5", "hZ"); err != nil || how != store.JoinedTakeover {
		t.Fatalf("a takeover: %v %v", how, err)
	}
	refused("the old agent's credentials after a takeover", "h4", "h3", "h2", "h1", "hA")
	refused("the old agent's credentials after a takeover, without a current one", "", "h4", "h3")

	// Removed: its credential forgotten, the earlier ones prove nothing.
	rm, ok := s.(store.NodeRemover)
	if !ok {
		return
	}
	if _, _, err := rm.RemoveNode(ctx, n.ID, nil, api.Event{Type: "node.removed", Subject: n.ID}); err != nil {
		t.Fatal(err)
	}
	if _, how, err := join("h6", "hY", "h5"); err != nil || how != store.JoinedTakeover {
		t.Fatalf("a join of a removed node with its credential among the earlier ones: %v %v", how, err)
	}
}
