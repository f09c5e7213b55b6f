package robustness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// TestReplicasKeepEachOthersMoves: a lease part's move is run by the
// replica that started it; the others must leave it alone. Two moves are
// written open in the store as a third replica would (one touched just
// now, one untouched for longer than a replica takes to die); then
//   - the destination's heartbeat, to either replica, listing the lease
//     it receives, is not told to tear it down;
//   - the elected replica ends the untouched move (aborted: the part stays
//     where it was, the destination freed) and leaves the touched one open.
func TestReplicasKeepEachOthersMoves(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	url := pgtest.DB(t)
	addrs := inProcessOn(t, ctx, url, func(s *postgres.Store) store.Store { return s })
	st, err := postgres.Open(ctx, url, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	// Two lenders that confirm every prepare and every transfer call; the
	// test heartbeats them itself.
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/agent/v1/prepare":
			var req api.PrepareRequest
			json.NewDecoder(r.Body).Decode(&req)
			json.NewEncoder(w).Encode(api.PrepareResponse{URI: "nbd://127.0.0.1:10809/" + req.Export})
		default:
			w.Write([]byte("{}"))
		}
	}))
	t.Cleanup(agent.Close)
	boot := api.NewClient(addrs, bootTok, nil)
	creds := map[string]string{}
	for i := range 2 {
		name := fmt.Sprintf("mover%d", i)
		jr, err := boot.Join(ctx, api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: agent.URL,
			Fingerprint: api.Fingerprint{MachineID: "mv-" + name, Hostname: name, Cores: 2, MemoryBytes: 1 << 30},
			Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: devSize, Sharing: "partitionable"}}})
		if err != nil {
			t.Fatal(err)
		}
		creds[jr.NodeID] = jr.Credential
	}

	var leases []api.Lease
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		c := api.NewClient(addrs, tokens[tenant], nil)
		l, err := c.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: leaseSz})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for l.State != api.LeaseActive {
			if time.Now().After(deadline) {
				t.Fatalf("lease %s still %s", l.ID, l.State)
			}
			if l, err = c.Lease(ctx, l.ID); err != nil {
				t.Fatal(err)
			}
		}
		leases = append(leases, l)
	}

	// Destinations: the other lender's device, in a range nothing holds.
	devs, err := st.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := st.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := slices.Clone(inv.Parts)
	dest := func(l api.Lease) api.Part {
		for _, d := range devs {
			if d.NodeID == l.Parts[0].NodeID {
				continue
			}
			for off := int64(0); off+leaseSz <= d.Capacity; off += leaseSz {
				if !slices.ContainsFunc(held, func(p store.LivePart) bool {
					return p.DeviceID == d.ID && p.Offset < off+leaseSz && p.Offset+p.Length > off
				}) {
					held = append(held, store.LivePart{Part: api.Part{DeviceID: d.ID, Offset: off, Length: leaseSz}})
					return api.Part{NodeID: d.NodeID, DeviceID: d.ID, Offset: off, Length: leaseSz}
				}
			}
		}
		t.Fatalf("no destination for %+v", l.Parts)
		return api.Part{}
	}
	now := time.Now().UTC()
	// The touched move started first (the sweep, which takes the open
	// moves in the order they started, looks at it first), and was
	// touched just now; the orphan was last touched an hour ago. Both
	// begin just now: BeginMove records a move's start as its last touch,
	// and a move begun "two hours ago" looked abandoned until it was
	// touched, to the elected replica, which sweeps every 500 ms: a sweep
	// that read it before the touch ended it after, and the destination's
	// heartbeat was told to tear the lease down.
	moves := []api.Move{
		{ID: "mv-touched", StartedAt: now.Add(-2 * time.Second)},
		{ID: "mv-orphan", StartedAt: now.Add(-time.Second)},
	}
	for i := range moves {
		l := leases[i]
		from := l.Parts[0]
		from.URI = ""
		moves[i].LeaseID, moves[i].Kind, moves[i].State, moves[i].From, moves[i].To, moves[i].Size =
			l.ID, api.KindBlock, api.MoveCopying, from, dest(l), leaseSz
		if err := st.BeginMove(ctx, moves[i], api.Event{Type: "lease.move.started", At: moves[i].StartedAt}); err != nil {
			t.Fatal(err)
		}
	}

	if err := st.SetMoveState(ctx, "mv-touched", api.MoveCopying, 1<<20, now); err != nil {
		t.Fatal(err)
	}
	if err := st.SetMoveState(ctx, "mv-orphan", api.MoveCopying, 0, now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}

	// The touched move's destination lists its lease: both replicas keep it.
	touched := moves[0]
	for _, addr := range strings.Split(addrs, ",") {
		c := api.NewClient(addr, creds[touched.To.NodeID], nil)
		resp, err := c.Heartbeat(ctx, touched.To.NodeID, api.Heartbeat{Health: "ok", Leases: []string{touched.LeaseID}})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(resp.Teardown, touched.LeaseID) {
			t.Fatalf("replica %s tells a move's destination to tear the lease down", addr)
		}
	}

	// The elected replica ends the orphan (untouched since an hour ago)
	// and keeps the touched move open.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ms, err := st.Moves(ctx, store.MoveFilter{})
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]store.MoveRecord{}
		for _, m := range ms {
			byID[m.ID] = m
		}
		if o := byID["mv-orphan"]; o.State == api.MoveFailed {
			if tm := byID["mv-touched"]; tm.Done() {
				t.Fatalf("the touched move was ended too: %+v", tm)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphaned move is still %+v", byID["mv-orphan"])
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	orphan := moves[1]
	l, err := st.Lease(ctx, orphan.LeaseID)
	if err != nil {
		t.Fatal(err)
	}
	if l.State != api.LeaseActive || l.Parts[0].DeviceID != orphan.From.DeviceID || l.Parts[0].Offset != orphan.From.Offset {
		t.Fatalf("the lease of the orphaned move: %+v", l)
	}
	inv, err = st.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range inv.Parts {
		if p.LeaseID == orphan.LeaseID && p.DeviceID == orphan.To.DeviceID {
			t.Fatalf("the orphaned move's destination is still held: %+v", p)
		}
	}
}
