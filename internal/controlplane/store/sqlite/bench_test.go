package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// BenchmarkLeaseCycle measures the store's share of a lease cycle: batches
// of 16 creations, then their activations, releasing and released
// transitions, as the control plane's group commit writes them. One op is
// one whole cycle.
func BenchmarkLeaseCycle(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	n, _, err := s.JoinNode(ctx, store.JoinNode{
		Node:           api.Node{ID: "node-1", Name: "n1", State: api.NodeReady, Fingerprint: api.Fingerprint{MachineID: "m1"}, LastHeartbeat: now, JoinedAt: now},
		CredentialHash: "h1", AgentKey: "k1", Devices: []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 40}},
	}, api.Event{})
	if err != nil {
		b.Fatal(err)
	}
	devs, _ := s.Devices(ctx)
	const batch = 16
	// A plan as placement writes it: about 1 KiB of explanation.
	plan := &api.Plan{State: "feasible", Mode: api.ModeShared, At: now, Explanation: []string{
		"request: block 1073741824 for controlplane, no bandwidth requirement, strategy binpack",
		"candidates: 32 usable devices of 32 examined; 11 options predicted, 0 rejected",
		"chose shared node-4apk6vcgaz12/dev-02swz0p5sdr9: 2 hops, 0s, predicted unbounded, link load 0%",
		"mode: binpack, so shared is preferred, then composed, then dedicated, while every requirement holds",
		"impact: no running lease slowed",
		"runner-up shared node-g8msv460n0e1/dev-2b9gm7zg23sx: predicted unbounded, lost on name order",
		"runner-up shared node-rp6srdef18er/dev-00verns7sdjn: predicted unbounded, lost on name order",
		"runner-up shared node-rp6srdef18er/dev-0eyxw7pdr5xf: predicted unbounded, lost on name order",
	}}
	ev := func(id, st string) api.Event {
		return api.Event{At: now, Type: "lease." + st, Subject: id, Message: "bench", State: st}
	}
	tr := func(id string, from, to api.LeaseState, ch store.LeaseChange) store.LeaseOp {
		ch.From, ch.To, ch.At = []api.LeaseState{from}, to, now
		return store.LeaseOp{Transition: store.Transition{ID: id, Change: ch, Event: ev(id, string(to))}}
	}
	seq := 0
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		ids := make([]string, batch)
		ops := make([]store.LeaseOp, batch)
		for j := range ops {
			seq++
			ids[j] = fmt.Sprintf("lease-%08d", seq)
			p := *plan
			p.Parts = []api.Part{{NodeID: n.ID, DeviceID: devs[0].ID, Offset: int64(j) << 30, Length: 1 << 30}}
			ops[j] = store.LeaseOp{Create: &store.NewLease{Lease: api.Lease{ID: ids[j], State: api.LeaseReserved, Kind: api.KindBlock, Mode: api.ModeShared,
				Tenant: "t", Size: 1 << 30, Count: 1, Credential: "rlc_x", TTLSeconds: 3600, ExpiresAt: now.Add(time.Hour), CreatedAt: now, UpdatedAt: now,
				Parts: p.Parts, Plan: &p}, Event: ev(ids[j], "reserved")}}
		}
		for k, step := range []func(id string) store.LeaseOp{
			nil,
			func(id string) store.LeaseOp {
				return tr(id, api.LeaseReserved, api.LeaseActive, store.LeaseChange{URIs: []string{"nbd://x/" + id}, URI: "nbd://x/" + id})
			},
			func(id string) store.LeaseOp {
				return tr(id, api.LeaseActive, api.LeaseReleasing, store.LeaseChange{Tenant: "t"})
			},
			func(id string) store.LeaseOp {
				return tr(id, api.LeaseReleasing, api.LeaseReleased, store.LeaseChange{})
			},
		} {
			if k > 0 {
				for j := range ops {
					ops[j] = step(ids[j])
				}
			}
			_, errs, err := s.LeaseOps(ctx, ops)
			if err != nil {
				b.Fatal(err)
			}
			for _, err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}
