package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// mover returns s as a store.Mover; every store implements it.
func mover(t *testing.T, s store.Store) store.Mover {
	t.Helper()
	m, ok := s.(store.Mover)
	if !ok {
		t.Fatalf("%T does not implement store.Mover", s)
	}
	return m
}

// twoNodes joins nodes n1 and n2 with one block device of capacity bytes
// each; it returns their IDs and their devices' IDs.
func twoNodes(t *testing.T, s store.Store, capacity int64) (nodes, devs [2]string) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	for i, name := range []string{"n1", "n2"} {
		n, _, err := s.JoinNode(ctx, store.JoinNode{
			Node: api.Node{ID: "node-" + name, Name: name, State: api.NodeReady, Fingerprint: api.Fingerprint{MachineID: "m-" + name},
				LastHeartbeat: now, JoinedAt: now},
			CredentialHash: "h-" + name, AgentKey: "k", Devices: []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: capacity}},
		}, api.Event{})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = n.ID
	}
	ds, err := s.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		for i := range nodes {
			if d.NodeID == nodes[i] {
				devs[i] = d.ID
			}
		}
	}
	return nodes, devs
}

// activeLease creates lease id on part p and activates it.
func activeLease(t *testing.T, s store.Store, id string, p api.Part) {
	t.Helper()
	ctx := context.Background()
	l := lease(id, "t", p.NodeID, p.DeviceID, p.Offset, p.Length)
	if _, err := s.CreateLease(ctx, l, store.Demand{}, nil, api.Event{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TransitionLease(ctx, id, store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseActive,
		URIs: []string{"nbd://a/" + id}, URI: "nbd://a/" + id, At: time.Now()}, api.Event{}); err != nil {
		t.Fatal(err)
	}
}

// allocated returns what each device holds.
func allocated(t *testing.T, s store.Store) map[string]int64 {
	t.Helper()
	ds, err := s.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, d := range ds {
		out[d.ID] = d.Allocated
	}
	return out
}

// testMoves walks a part's moves through the store: the destination is
// reserved while the move is open (and refused to others), a finished
// move makes it the part (the source range freed, the lease's URI
// updated), a failed one frees it; a lease that is not active, a part
// that is no longer where the move starts, a part already moving are
// refused.
func testMoves(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	mv := mover(t, s)
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	nodes, devs := twoNodes(t, s, 100)
	from := api.Part{NodeID: nodes[0], DeviceID: devs[0], Offset: 0, Length: 40}
	if _, err := s.CreateLease(ctx, api.Lease{ID: "l1", State: api.LeaseReserved, Kind: api.KindBlock, Tenant: "t", Parts: []api.Part{from}},
		store.Demand{}, nil, api.Event{}); err != nil {
		t.Fatal(err)
	}
	to := api.Part{NodeID: nodes[1], DeviceID: devs[1], Offset: 20, Length: 40}
	m := api.Move{ID: "mv1", LeaseID: "l1", Part: 0, Kind: api.KindBlock, State: api.MoveCopying, From: from, To: to, Size: 40, StartedAt: now}
	if err := mv.BeginMove(ctx, m, api.Event{At: now, Type: "lease.move.started"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a move of a reserved lease: %v", err)
	}
	if _, err := s.TransitionLease(ctx, "l1", store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseActive,
		URIs: []string{"nbd://a/x"}, URI: "nbd://a/x", At: now}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	stale := m
	stale.From.Offset = 4
	if err := mv.BeginMove(ctx, stale, api.Event{At: now}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a move from where the part is not: %v", err)
	}
	nopart := m
	nopart.Part = 1
	if err := mv.BeginMove(ctx, nopart, api.Event{At: now}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a move of a part the lease does not have: %v", err)
	}
	outside := m
	outside.To.Offset = 80
	if err := mv.BeginMove(ctx, outside, api.Event{At: now}); !errors.Is(err, store.ErrCapacity) {
		t.Fatalf("a move past the destination's capacity: %v", err)
	}
	if err := mv.BeginMove(ctx, m, api.Event{At: now, Type: "lease.move.started"}); err != nil {
		t.Fatal(err)
	}
	if err := mv.BeginMove(ctx, api.Move{ID: "mv2", LeaseID: "l1", Part: 0, Kind: api.KindBlock, State: api.MoveCopying, From: from,
		To: api.Part{NodeID: nodes[1], DeviceID: devs[1], Offset: 60, Length: 40}, StartedAt: now}, api.Event{At: now}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second move of a moving part: %v", err)
	}
	// The destination is taken while the move is open.
	if _, err := s.CreateLease(ctx, api.Lease{ID: "l2", State: api.LeaseReserved, Kind: api.KindBlock, Tenant: "t",
		Parts: []api.Part{{NodeID: nodes[1], DeviceID: devs[1], Offset: 50, Length: 20}}}, store.Demand{}, nil, api.Event{}); !errors.Is(err, store.ErrCapacity) {
		t.Fatalf("a lease over a move's destination: %v", err)
	}
	if inv, _ := s.Inventory(ctx); len(inv.Parts) != 2 {
		t.Fatalf("placement sees %d live parts, want the part and its destination", len(inv.Parts))
	}
	if got := allocated(t, s); got[devs[0]] != 40 || got[devs[1]] != 40 {
		t.Fatalf("allocated during the move: %v", got)
	}
	if err := mv.SetMoveState(ctx, "mv1", api.MoveSwitching, 40, now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := mv.SetMoveState(ctx, "nope", api.MoveSwitching, 40, now); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("the state of an unknown move: %v", err)
	}
	if _, err := mv.FinishMove(ctx, "nope", "nbd://b/y", now, api.Event{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("finishing an unknown move: %v", err)
	}
	l, err := mv.FinishMove(ctx, "mv1", "nbd://b/y", now.Add(2*time.Second), api.Event{At: now, Type: "lease.moved"})
	if err != nil {
		t.Fatal(err)
	}
	want := to
	want.URI = "nbd://b/y"
	if l.URI != "nbd://b/y" || len(l.Parts) != 1 || l.Parts[0] != want || l.NodeID != nodes[1] {
		t.Fatalf("lease after the move: %+v", l)
	}
	if l2, _ := s.Lease(ctx, "l1"); len(l2.Parts) != 1 || l2.Parts[0] != want || l2.URI != "nbd://b/y" {
		t.Fatalf("lease read back: %+v", l2)
	}
	if got := allocated(t, s); got[devs[0]] != 0 || got[devs[1]] != 40 {
		t.Fatalf("allocated after the switch: %v", got)
	}
	if _, err := mv.FinishMove(ctx, "mv1", "nbd://b/y", now, api.Event{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("finishing a move twice: %v", err)
	}
	ms, _ := mv.Moves(ctx, store.MoveFilter{Open: true})
	if len(ms) != 1 || !ms[0].Committed || ms[0].State != api.MoveSwitching || ms[0].Copied != 40 || ms[0].From != from || ms[0].To != to {
		t.Fatalf("open moves: %+v", ms)
	}
	if err := mv.EndMove(ctx, "mv1", api.MoveDone, "", 40, now.Add(3*time.Second), &api.Event{At: now, Type: "lease.move.done"}); err != nil {
		t.Fatal(err)
	}
	if err := mv.EndMove(ctx, "mv1", api.MoveFailed, "late", 0, now.Add(4*time.Second), nil); err != nil {
		t.Fatalf("ending an ended move: %v", err)
	}
	if err := mv.EndMove(ctx, "mv1", api.MoveCopying, "", 0, now, nil); err == nil {
		t.Fatal("a move ended in a state that is not an end")
	}
	if got := allocated(t, s); got[devs[0]] != 0 || got[devs[1]] != 40 {
		t.Fatalf("allocated after the move: %v", got)
	}

	// A failed move frees its destination and leaves the part.
	back := api.Move{ID: "mv3", LeaseID: "l1", Part: 0, Kind: api.KindBlock, State: api.MoveCopying, From: to, To: from,
		StartedAt: now.Add(5 * time.Second)}
	if err := mv.BeginMove(ctx, back, api.Event{At: now}); err != nil {
		t.Fatal(err)
	}
	if err := mv.EndMove(ctx, "mv3", api.MoveFailed, "the destination did not answer", 0, now.Add(6*time.Second), nil); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.Lease(ctx, "l1"); l.Parts[0] != want {
		t.Fatalf("the part after a failed move: %+v", l.Parts)
	}
	if got := allocated(t, s); got[devs[0]] != 0 {
		t.Errorf("a failed move's destination is still held: %v", got)
	}
	all, _ := mv.Moves(ctx, store.MoveFilter{LeaseID: "l1"})
	if len(all) != 2 || all[0].State != api.MoveDone || all[1].State != api.MoveFailed || all[1].Error == "" || all[1].Committed {
		t.Fatalf("moves: %+v", all)
	}
	if since, _ := mv.Moves(ctx, store.MoveFilter{Since: now.Add(5 * time.Second)}); len(since) != 1 || since[0].ID != "mv3" {
		t.Fatalf("moves since the second: %+v", since)
	}
	if open, _ := mv.Moves(ctx, store.MoveFilter{Open: true}); len(open) != 0 {
		t.Fatalf("open moves left: %+v", open)
	}
	var types []string
	evs, _ := s.Events(ctx, 0, 100, "")
	for _, e := range evs {
		if e.Subject == "l1" {
			types = append(types, e.Type)
		}
	}
	if fmt.Sprint(types) != "[lease.move.started lease.moved lease.move.done]" {
		t.Errorf("the lease's move events: %v", types)
	}

	// A lease that ends while its part moves frees the destination too;
	// the move cannot commit any more.
	if err := mv.BeginMove(ctx, api.Move{ID: "mv4", LeaseID: "l1", Part: 0, Kind: api.KindBlock, State: api.MoveCopying, From: to, To: from,
		StartedAt: now.Add(7 * time.Second)}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TransitionLease(ctx, "l1", store.LeaseChange{From: []api.LeaseState{api.LeaseActive}, To: api.LeaseReleased, At: now}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	if _, err := mv.FinishMove(ctx, "mv4", "nbd://a/z", now, api.Event{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("finishing the move of a released lease: %v", err)
	}
	if err := mv.EndMove(ctx, "mv4", api.MoveFailed, "the lease ended", 0, now, nil); err != nil {
		t.Fatal(err)
	}
	if got := allocated(t, s); got[devs[0]] != 0 || got[devs[1]] != 0 {
		t.Fatalf("allocated after the lease ended: %v", got)
	}
}

// testFinishMoveToGoneNode: a move whose destination's node went down or
// was removed after the move began does not commit (the lease would be
// lost with that node while its source still holds the part): conflict,
// the lease keeps its part, and the move ends failed, freeing the
// destination.
func testFinishMoveToGoneNode(t *testing.T, o Options) {
	ctx := context.Background()
	for _, gone := range []api.NodeState{api.NodeDown, api.NodeRemoved} {
		t.Run(string(gone), func(t *testing.T) {
			s := open(t, o)
			mv := mover(t, s)
			now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
			nodes, devs := twoNodes(t, s, 100)
			from := api.Part{NodeID: nodes[0], DeviceID: devs[0], Offset: 0, Length: 40}
			activeLease(t, s, "l1", from)
			to := api.Part{NodeID: nodes[1], DeviceID: devs[1], Offset: 0, Length: 40}
			if err := mv.BeginMove(ctx, api.Move{ID: "mv1", LeaseID: "l1", Part: 0, Kind: api.KindBlock, State: api.MoveCopying,
				From: from, To: to, Size: 40, StartedAt: now}, api.Event{At: now}); err != nil {
				t.Fatal(err)
			}
			if gone == api.NodeRemoved {
				rm, ok := s.(store.NodeRemover)
				if !ok {
					t.Skipf("%T does not remove nodes", s)
				}
				if _, _, err := rm.RemoveNode(ctx, nodes[1], nil, api.Event{At: now, Type: "node.removed"}); err != nil {
					t.Fatal(err)
				}
			} else if err := s.SetNodeState(ctx, nodes[1], api.NodeReady, api.NodeDown, api.Event{At: now, Type: "node.down"}); err != nil {
				t.Fatal(err)
			}
			if _, err := mv.FinishMove(ctx, "mv1", "nbd://b/x", now, api.Event{At: now, Type: "lease.moved"}); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("a move onto a %s node committed: %v", gone, err)
			}
			if l, err := s.Lease(ctx, "l1"); err != nil || len(l.Parts) != 1 || l.Parts[0].NodeID != nodes[0] {
				t.Fatalf("the lease after the refused commit: %v %+v", err, l.Parts)
			}
			if err := mv.EndMove(ctx, "mv1", api.MoveFailed, "the destination is gone", 0, now, nil); err != nil {
				t.Fatal(err)
			}
			if got := allocated(t, s); got[devs[0]] != 40 || got[devs[1]] != 0 {
				t.Fatalf("allocated after the failed move: %v", got)
			}
		})
	}
}

// testCordon: a node cordoned stays so across a rejoin and shows in
// Nodes, Node and the inventory, and gets no new part; unknown nodes are
// not found.
func testCordon(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	mv := mover(t, s)
	now := time.Now()
	join := func() api.Node {
		n, _, err := s.JoinNode(ctx, store.JoinNode{Node: api.Node{ID: "node-1", Name: "n1", State: api.NodeReady,
			Fingerprint: api.Fingerprint{MachineID: "m1"}, LastHeartbeat: now, JoinedAt: now}, CredentialHash: "h1", AgentKey: "k1",
			ProofHash: "h1", // its agent, restarted with its credential
			Devices:   []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 100}}}, api.Event{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := join()
	if _, err := mv.SetNodeCordon(ctx, "nope", true, api.Event{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("cordon of an unknown node: %v", err)
	}
	got, err := mv.SetNodeCordon(ctx, n.ID, true, api.Event{At: now, Type: "node.cordoned"})
	if err != nil || !got.Cordoned || got.ID != n.ID {
		t.Fatalf("cordon: %v %+v", err, got)
	}
	join()
	if rn, _ := s.Node(ctx, n.ID); !rn.Cordoned {
		t.Error("a rejoin uncordoned the node")
	}
	if ns, _ := s.Nodes(ctx); len(ns) != 1 || !ns[0].Cordoned {
		t.Fatalf("nodes: %+v", ns)
	}
	if bc, _ := s.NodeByCredential(ctx, "h1"); !bc.Cordoned {
		t.Error("the node found by its credential is not cordoned")
	}
	if inv, _ := s.Inventory(ctx); !inv.Nodes[0].Cordoned {
		t.Fatal("the inventory does not say the node is cordoned")
	}
	// The store refuses new parts on a cordoned node (a replica whose
	// placement view missed the cordon places again).
	devs, _ := s.Devices(ctx)
	if len(devs) != 1 {
		t.Fatalf("devices: %+v", devs)
	}
	if _, err := s.CreateLease(ctx, lease("c1", "t", n.ID, devs[0].ID, 0, 10), store.Demand{}, nil, api.Event{}); !errors.Is(err, store.ErrCapacity) {
		t.Fatalf("a lease on a cordoned node: %v", err)
	}
	if lb, ok := s.(store.LeaseBatcher); ok {
		_, errs, err := lb.LeaseOps(ctx, []store.LeaseOp{{Create: &store.NewLease{Lease: lease("c2", "t", n.ID, devs[0].ID, 0, 10)}}})
		if err != nil || !errors.Is(errs[0], store.ErrCapacity) {
			t.Fatalf("a batched lease on a cordoned node: %v %v", err, errs)
		}
	}
	if got, err := mv.SetNodeCordon(ctx, n.ID, false, api.Event{At: now, Type: "node.uncordoned"}); err != nil || got.Cordoned {
		t.Fatalf("uncordon: %v %+v", err, got)
	}
	if _, err := s.CreateLease(ctx, lease("c3", "t", n.ID, devs[0].ID, 0, 10), store.Demand{}, nil, api.Event{}); err != nil {
		t.Fatalf("a lease on an uncordoned node: %v", err)
	}
	if rn, _ := s.Node(ctx, n.ID); rn.Cordoned {
		t.Error("the node is still cordoned")
	}
	evs, _ := s.Events(ctx, 0, 100, "")
	var types []string
	for _, e := range evs {
		if e.Subject == n.ID {
			types = append(types, e.Type)
		}
	}
	if fmt.Sprint(types) != "[node.cordoned node.uncordoned]" {
		t.Errorf("the node's cordon events: %v", types)
	}
}

// testConcurrentMoves: on several Stores of one database at once, moves
// of one part, a move of another lease and a creation race for one
// destination range (exactly one wins it); then the winning move's switch
// races its lease's release (the release always wins its
// compare-and-set, the switch only before it), and whichever order
// PostgreSQL or SQLite picked, once the move ends nothing of the lease is
// held.
func testConcurrentMoves(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	stores := []store.Store{s}
	if o.Reopen != nil {
		for i := 0; i < 3; i++ {
			r := o.Reopen(t, s)
			t.Cleanup(func() { r.Close() })
			stores = append(stores, r)
		}
	}
	at := func(i int) store.Store { return stores[i%len(stores)] }
	nodes, devs := twoNodes(t, s, 64)
	const rounds = 8
	for r := 0; r < rounds; r++ {
		a := api.Part{NodeID: nodes[0], DeviceID: devs[0], Offset: int64(r * 8), Length: 4}
		b := api.Part{NodeID: nodes[0], DeviceID: devs[0], Offset: int64(r*8 + 4), Length: 4}
		activeLease(t, s, fmt.Sprintf("a%d", r), a)
		activeLease(t, s, fmt.Sprintf("b%d", r), b)
	}
	for r := 0; r < rounds; r++ {
		dst := api.Part{NodeID: nodes[1], DeviceID: devs[1], Offset: int64(r * 8), Length: 4}
		a, b := fmt.Sprintf("a%d", r), fmt.Sprintf("b%d", r)
		from := func(id string) api.Part {
			l, err := s.Lease(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			p := l.Parts[0]
			p.URI = ""
			return p
		}
		fa, fb := from(a), from(b)
		racers := []func(store.Store) (string, error){
			func(st store.Store) (string, error) {
				id := fmt.Sprintf("mv%d-a1", r)
				return id, mover(t, st).BeginMove(ctx, api.Move{ID: id, LeaseID: a, Kind: api.KindBlock, State: api.MoveCopying, From: fa, To: dst,
					StartedAt: time.Now()}, api.Event{Type: "lease.move.started"})
			},
			func(st store.Store) (string, error) {
				id := fmt.Sprintf("mv%d-a2", r)
				return id, mover(t, st).BeginMove(ctx, api.Move{ID: id, LeaseID: a, Kind: api.KindBlock, State: api.MoveCopying, From: fa, To: dst,
					StartedAt: time.Now()}, api.Event{Type: "lease.move.started"})
			},
			func(st store.Store) (string, error) {
				id := fmt.Sprintf("mv%d-b", r)
				return id, mover(t, st).BeginMove(ctx, api.Move{ID: id, LeaseID: b, Kind: api.KindBlock, State: api.MoveCopying, From: fb, To: dst,
					StartedAt: time.Now()}, api.Event{Type: "lease.move.started"})
			},
			func(st store.Store) (string, error) {
				id := fmt.Sprintf("c%d", r)
				_, err := st.CreateLease(ctx, lease(id, "t", dst.NodeID, dst.DeviceID, dst.Offset, dst.Length), store.Demand{}, nil,
					api.Event{Type: "lease.reserved", Subject: id})
				return id, err
			},
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var won []string
		for i, f := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id, err := f(at(i + r))
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					won = append(won, id)
				case !errors.Is(err, store.ErrCapacity) && !errors.Is(err, store.ErrConflict):
					t.Errorf("%s: %v", id, err)
				}
			}()
		}
		wg.Wait()
		if len(won) != 1 {
			t.Fatalf("round %d: %v won the range %d+4", r, won, dst.Offset)
		}
		if got := allocated(t, s)[devs[1]]; got != int64(r+1)*4 {
			t.Fatalf("round %d: the destination device holds %d, want %d", r, got, (r+1)*4)
		}
		mvID := won[0]
		if mvID[0] == 'c' {
			continue // the creation won: nothing moves
		}
		ms, err := mover(t, s).Moves(ctx, store.MoveFilter{Open: true})
		if err != nil || len(ms) != 1 || ms[0].ID != mvID {
			t.Fatalf("round %d: open moves %+v %v, want %s", r, ms, err, mvID)
		}
		leaseID := ms[0].LeaseID
		var finishErr, releaseErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, finishErr = mover(t, at(r)).FinishMove(ctx, mvID, "nbd://b/"+mvID, time.Now(), api.Event{Type: "lease.moved"})
		}()
		go func() {
			defer wg.Done()
			_, releaseErr = at(r+1).TransitionLease(ctx, leaseID, store.LeaseChange{From: []api.LeaseState{api.LeaseActive},
				To: api.LeaseReleased, At: time.Now()}, api.Event{Type: "lease.released", Subject: leaseID})
		}()
		wg.Wait()
		if releaseErr != nil {
			t.Fatalf("round %d: release: %v", r, releaseErr)
		}
		state := api.MoveDone
		if finishErr != nil {
			if !errors.Is(finishErr, store.ErrConflict) {
				t.Fatalf("round %d: finish: %v", r, finishErr)
			}
			state = api.MoveFailed
		}
		if err := mover(t, at(r+2)).EndMove(ctx, mvID, state, "", 4, time.Now(), nil); err != nil {
			t.Fatal(err)
		}
		l, err := s.Lease(ctx, leaseID)
		if err != nil {
			t.Fatal(err)
		}
		wantDev := devs[0]
		if finishErr == nil {
			wantDev = devs[1]
		}
		if l.State != api.LeaseReleased || len(l.Parts) != 1 || l.Parts[0].DeviceID != wantDev {
			t.Fatalf("round %d: lease %s after the race (finish: %v): %+v", r, leaseID, finishErr, l)
		}
		inv, err := s.Inventory(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range inv.Parts {
			if p.LeaseID == leaseID {
				t.Fatalf("round %d: released lease %s still holds %+v", r, leaseID, p)
			}
		}
		// The range is free again: the next round's device count is
		// this round's, which a creation now fills.
		if _, err := s.CreateLease(ctx, lease(fmt.Sprintf("f%d", r), "t", dst.NodeID, dst.DeviceID, dst.Offset, dst.Length), store.Demand{}, nil,
			api.Event{}); err != nil {
			t.Fatalf("round %d: the range after the move ended: %v", r, err)
		}
	}
	evs, _ := s.Events(ctx, 0, 10000, "")
	for i := 1; i < len(evs); i++ {
		if evs[i].ID <= evs[i-1].ID {
			t.Fatalf("event ids out of order at %d", i)
		}
	}
}

// testAdoptPart adopts a part where a lender holds it: the part becomes
// the range adopted (a cordoned node's too), the recorded range is freed,
// the adoption is recorded as a move done, with its event, in one write;
// a lease that is not active, a part that is no longer where it was read,
// one that moves, and a range taken by another lease's part are refused,
// nothing changed.
func testAdoptPart(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	mv := mover(t, s)
	now := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	nodes, devs := twoNodes(t, s, 100)
	from := api.Part{NodeID: nodes[0], DeviceID: devs[0], Offset: 0, Length: 40}
	activeLease(t, s, "l1", from)
	activeLease(t, s, "other", api.Part{NodeID: nodes[1], DeviceID: devs[1], Offset: 0, Length: 20})
	to := api.Part{NodeID: nodes[1], DeviceID: devs[1], Offset: 20, Length: 40}
	m := api.Move{ID: "adopt-1", LeaseID: "l1", Part: 0, Kind: api.KindBlock, State: api.MoveDone, From: from, To: to, Size: 40,
		Reason: "adopted", StartedAt: now, UpdatedAt: now}
	ev := api.Event{At: now, Type: "lease.part.adopted", Message: "adopted"}
	unchanged := func(what string) {
		t.Helper()
		l, err := s.Lease(ctx, "l1")
		if err != nil {
			t.Fatal(err)
		}
		if l.Parts[0].NodeID != from.NodeID || l.Parts[0].Offset != from.Offset {
			t.Fatalf("%s: the part moved to %+v", what, l.Parts[0])
		}
		if got := allocated(t, s); got[devs[0]] != 40 || got[devs[1]] != 20 {
			t.Fatalf("%s: devices hold %v", what, got)
		}
	}
	stale := m
	stale.From.Offset = 4
	if _, err := mv.AdoptPart(ctx, stale, "nbd://b/y", ev); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("adopting a part that is not where it was read: %v", err)
	}
	taken := m
	taken.To.Offset = 10
	if _, err := mv.AdoptPart(ctx, taken, "nbd://b/y", ev); !errors.Is(err, store.ErrCapacity) {
		t.Fatalf("adopting over another lease's part: %v", err)
	}
	unchanged("refusals")
	// A part that moves is not adopted.
	if err := mv.BeginMove(ctx, api.Move{ID: "mv1", LeaseID: "l1", Part: 0, Kind: api.KindBlock, State: api.MoveCopying, From: from,
		To: api.Part{NodeID: nodes[1], DeviceID: devs[1], Offset: 60, Length: 40}, StartedAt: now}, api.Event{At: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := mv.AdoptPart(ctx, m, "nbd://b/y", ev); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("adopting a moving part: %v", err)
	}
	if err := mv.EndMove(ctx, "mv1", api.MoveFailed, "given up", 0, now, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := mv.SetNodeCordon(ctx, nodes[1], true, api.Event{At: now, Type: "node.cordoned"}); err != nil {
		t.Fatal(err)
	}
	got, err := mv.AdoptPart(ctx, m, "nbd://b/y", ev)
	if err != nil {
		t.Fatal(err)
	}
	if p := got.Parts[0]; p.NodeID != to.NodeID || p.DeviceID != to.DeviceID || p.Offset != to.Offset || p.Length != to.Length ||
		p.URI != "nbd://b/y" || got.URI != "nbd://b/y" || got.State != api.LeaseActive {
		t.Fatalf("the adopted lease: %+v", got)
	}
	if stored, err := s.Lease(ctx, "l1"); err != nil || stored.Parts[0].NodeID != to.NodeID || stored.URI != "nbd://b/y" {
		t.Fatalf("the adopted lease as stored: %+v %v", stored, err)
	}
	if got := allocated(t, s); got[devs[0]] != 0 || got[devs[1]] != 60 {
		t.Fatalf("after the adoption devices hold %v", got)
	}
	ms, err := mv.Moves(ctx, store.MoveFilter{LeaseID: "l1"})
	if err != nil {
		t.Fatal(err)
	}
	var rec store.MoveRecord
	for _, r := range ms {
		if r.ID == m.ID {
			rec = r
		}
	}
	if rec.State != api.MoveDone || !rec.Committed || rec.From.NodeID != from.NodeID || rec.To.NodeID != to.NodeID || rec.Reason != "adopted" {
		t.Fatalf("the adoption's move record: %+v", rec)
	}
	evs, err := s.Events(ctx, 0, 1000, "")
	if err != nil {
		t.Fatal(err)
	}
	if e := evs[len(evs)-1]; e.Type != "lease.part.adopted" || e.Subject != "l1" {
		t.Fatalf("the last event: %+v", e)
	}
	// Adopted again from where it was: the part is no longer there.
	if _, err := mv.AdoptPart(ctx, m, "nbd://b/y", ev); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("adopting a part again from where it was: %v", err)
	}
	if _, err := s.TransitionLease(ctx, "other", store.LeaseChange{From: []api.LeaseState{api.LeaseActive}, To: api.LeaseReleased, At: now}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	back := api.Move{ID: "adopt-2", LeaseID: "l1", Part: 0, Kind: api.KindBlock, State: api.MoveDone, From: to, To: from, Size: 40, StartedAt: now}
	if _, err := s.TransitionLease(ctx, "l1", store.LeaseChange{From: []api.LeaseState{api.LeaseActive}, To: api.LeaseReleased, At: now}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	if _, err := mv.AdoptPart(ctx, back, "nbd://a/x", ev); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("adopting a part of a released lease: %v", err)
	}
}
