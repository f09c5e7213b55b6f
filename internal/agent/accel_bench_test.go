package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/mct"
)

// BenchmarkAccelLeases compares four borrowers of an MCT role (2,000
// rules), 64 callers in all sending one 64-byte query per call: each
// borrower with a dedicated slot, or the four sharing the lender's
// batching gateway over the same four slots. ns/op is per query.
func BenchmarkAccelLeases(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	rs := mct.Generate(rng, 2000)
	cfg, _ := json.Marshal(rs)
	eng, err := mct.Compile(rs)
	if err != nil {
		b.Fatal(err)
	}
	qs, _ := eng.EncodeAll(mct.GenerateQueries(rng, 1024))
	for _, shared := range []bool{false, true} {
		name := map[bool]string{false: "dedicated", true: "shared"}[shared]
		b.Run(name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			d := NewAccelDriver(nil, "127.0.0.1")
			attrs := map[string]string{"slot_memory": "1MiB"}
			for _, kv := range strings.Fields(os.Getenv("RIALTO_BENCH_ACCEL_ATTRS")) { // e.g. "gateway_workers=1 gateway_max_delay=500us"
				k, v, _ := strings.Cut(kv, "=")
				attrs[k] = v
			}
			dev, err := d.Open(ctx, DeviceConfig{Name: "accel0", Kind: api.KindAccel, Size: 4, Attributes: attrs})
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan struct{})
			go func() { defer close(done); _ = d.Run(ctx) }()
			defer func() { cancel(); <-done; d.Close() }()
			var uris []string
			for i := range 4 {
				resp, err := d.Prepare(ctx, Export{Device: dev, Request: api.PrepareRequest{LeaseID: fmt.Sprint("l", i), Kind: api.KindAccel,
					Offset: int64(i) * api.SlotUnits, Length: api.SlotUnits, Export: fmt.Sprint("rlc_", i), Role: "mct", RoleConfig: &api.RoleConfig{Config: cfg}, Gateway: shared}})
				if err != nil {
					b.Fatal(err)
				}
				uris = append(uris, resp.URI)
			}
			var next atomic.Uint64
			var mu sync.Mutex
			var conns []*accel.Conn
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				n := next.Add(1)
				u := uris[n%4]
				pu, err := url.Parse(u)
				if err != nil {
					b.Error(err)
					return
				}
				c, err := accel.Dial(ctx, pu.Host, []byte(strings.TrimPrefix(pu.Path, "/")))
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				i := int(n) * 7
				for pb.Next() {
					q := qs[(i%1024)*mct.QuerySize : (i%1024+1)*mct.QuerySize]
					i++
					if _, err := c.Call(ctx, "match", q); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			if gs := d.Gateways(); shared && len(gs) == 1 {
				b.ReportMetric(gs[0].Stats.AvgBatch, "queries/exec")
			}
		})
	}
}
