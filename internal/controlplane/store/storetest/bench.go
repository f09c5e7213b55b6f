package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// LeaseCycles measures a store's share of a lease cycle: writers
// goroutines, writer w on stores[w%len(stores)] (replicas of one database,
// or one store) and on a device of its own, write batches of batch
// creations (a 1 GiB part each), then their activations, releasing and
// released transitions, as the control plane's group commit writes them
// (store.LeaseBatcher). One op is one whole cycle; the metric cycles/s
// counts those of all writers together.
func LeaseCycles(b *testing.B, stores []store.Store, writers, batch int) {
	ctx := context.Background()
	replicas := len(stores)
	now := time.Now()
	specs := make([]api.DeviceSpec, writers)
	for w := range specs {
		specs[w] = api.DeviceSpec{Name: fmt.Sprintf("disk%02d", w), Kind: api.KindBlock, Capacity: 1 << 40}
	}
	n, _, err := stores[0].JoinNode(ctx, store.JoinNode{
		Node:           api.Node{ID: "node-1", Name: "n1", State: api.NodeReady, Fingerprint: api.Fingerprint{MachineID: "m1"}, LastHeartbeat: now, JoinedAt: now},
		CredentialHash: "h1", AgentKey: "k1", Devices: specs,
	}, api.Event{})
	if err != nil {
		b.Fatal(err)
	}
	devs, err := stores[0].Devices(ctx)
	if err != nil || len(devs) != writers {
		b.Fatalf("devices: %v %v", devs, err)
	}
	plan := &api.Plan{State: "feasible", Mode: api.ModeShared, At: now, Explanation: []string{
		"request: block 1GiB for an unnamed borrower (placed at the control plane), no bandwidth requirement, strategy binpack",
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
	var left, done atomic.Int64 // cycles still to start, cycles done
	left.Store(int64(b.N))
	var failed atomic.Value
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, dev := stores[w%replicas].(store.LeaseBatcher), devs[w]
			for seq := 0; left.Add(-int64(batch)) > -int64(batch); {
				ids := make([]string, batch)
				ops := make([]store.LeaseOp, batch)
				for j := range ops {
					seq++
					ids[j] = fmt.Sprintf("lease-%02d-%08d", w, seq)
					p := *plan
					p.Parts = []api.Part{{NodeID: n.ID, DeviceID: dev.ID, Offset: int64(j) << 30, Length: 1 << 30}}
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
					for _, e := range errs {
						if err == nil {
							err = e
						}
					}
					if err != nil {
						failed.CompareAndSwap(nil, err)
						return
					}
				}
				done.Add(int64(batch))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(done.Load())/time.Since(start).Seconds(), "cycles/s")
}
