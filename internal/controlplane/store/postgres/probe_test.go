package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

func TestProbe(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, pgtest.DB(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	n, _, _ := s.JoinNode(ctx, store.JoinNode{Node: api.Node{ID: "n1", Name: "n1", State: api.NodeReady, Fingerprint: api.Fingerprint{MachineID: "m"}, LastHeartbeat: now, JoinedAt: now},
		CredentialHash: "h", AgentKey: "k", Devices: []api.DeviceSpec{{Name: "d", Kind: api.KindBlock, Capacity: 1 << 40}}}, api.Event{})
	devs, _ := s.Devices(ctx)
	t0 := time.Now()
	N := 300
	for i := 0; i < N; i++ {
		l := api.Lease{ID: fmt.Sprint("l", i), State: api.LeaseReserved, Kind: api.KindBlock, Tenant: "t", CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
			Parts: []api.Part{{NodeID: n.ID, DeviceID: devs[0].ID, Offset: int64(i) << 20, Length: 1 << 20}}, Plan: &api.Plan{Explanation: []string{"x"}}}
		if _, err := s.CreateLease(ctx, l, store.Demand{}, nil, api.Event{Type: "lease.reserved", Subject: l.ID}); err != nil {
			t.Fatal(err)
		}
	}
	t1 := time.Now()
	for i := 0; i < N; i++ {
		if _, err := s.TransitionLease(ctx, fmt.Sprint("l", i), store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseActive, URIs: []string{"x"}, At: now}, api.Event{Type: "lease.active", Subject: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	t2 := time.Now()
	for i := 0; i < N; i++ {
		s.Lease(ctx, fmt.Sprint("l", i))
	}
	t3 := time.Now()
	t4 := time.Now()
	for i := 0; i < N; i++ {
		s.AppendEvent(ctx, api.Event{Type: "x", Subject: "y"})
	}
	t5 := time.Now()
	for i := 0; i < N; i++ {
		s.tx(ctx, func(tx execer) error {
			return lockParts(ctx, tx, nil, []api.Part{{NodeID: n.ID, DeviceID: devs[0].ID}})
		})
	}
	t6 := time.Now()
	for i := 0; i < N; i++ {
		s.tx(ctx, func(tx execer) error {
			return checkParts(ctx, tx, api.KindBlock, []api.Part{{NodeID: n.ID, DeviceID: devs[0].ID, Offset: 1 << 39, Length: 1}})
		})
	}
	t7 := time.Now()
	t.Logf("append event %v, lock parts %v, check parts %v", (t5.Sub(t4))/time.Duration(N), t6.Sub(t5)/time.Duration(N), t7.Sub(t6)/time.Duration(N))
	t.Logf("create %v/op, transition %v/op, get %v/op", t1.Sub(t0)/time.Duration(N), t2.Sub(t1)/time.Duration(N), t3.Sub(t2)/time.Duration(N))
}
