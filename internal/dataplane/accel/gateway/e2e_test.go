package gateway

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/mct"
)

// TestMCTThroughAppliance: 64 clients call one gateway whose instances are
// connections to two MCT slots of an appliance; every answer is the
// brute-force answer.
func TestMCTThroughAppliance(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 9))
	rs := mct.Generate(rng, 500)
	cfg, _ := json.Marshal(rs)
	engine, err := mct.Compile(rs)
	if err != nil {
		t.Fatal(err)
	}
	qs, _ := engine.EncodeAll(mct.GenerateQueries(rng, 640))

	app := startAppliance(t, appliance.Config{Slots: 2, SlotMemory: 1 << 16, Workers: 2})
	var backends []Backend
	for i := 0; i < 2; i++ {
		if err := app.Load(ctx, i, roles.Spec{Name: "mct", Config: cfg}); err != nil {
			t.Fatal(err)
		}
		_ = app.SetCredential(i, []byte("k"))
		addr, _ := app.Addr(i)
		c, err := accel.Dial(ctx, addr, []byte("k"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		backends = append(backends, c)
	}
	g := run(t, Config{MaxBatch: 32, MaxQueueDelay: 200 * time.Microsecond, Workers: 2}, backends...)
	var wg sync.WaitGroup
	for c := 0; c < 64; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < 640; i += 64 {
				q := qs[i*mct.QuerySize : (i+1)*mct.QuerySize]
				out, err := g.Call(ctx, "match", q)
				want, _, _ := engine.BruteForce(q)
				if err != nil || len(out) != 4 || binary.LittleEndian.Uint32(out) != want {
					t.Errorf("query %d: %x %v want %d", i, out, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	s := g.Stats()
	t.Logf("%d queries in %d executions (average batch %.1f)", s.Items, s.Executions, s.AvgBatch)
	if s.Items != 640 || s.Failed != 0 {
		t.Fatalf("stats %+v", s)
	}
	var tasks uint64
	for _, st := range app.Slots() {
		tasks += st.Tasks
	}
	if tasks != s.Executions {
		t.Fatalf("appliance ran %d tasks for %d executions", tasks, s.Executions)
	}
}

func TestRedialerSurvivesLeaseRenewal(t *testing.T) {
	ctx := context.Background()
	app := startAppliance(t, appliance.Config{Slots: 1, SlotMemory: 4096})
	_ = app.Load(ctx, 0, roles.Spec{Name: "echo"})
	_ = app.SetCredential(0, []byte("k"))
	addr, _ := app.Addr(0)
	r := NewRedialer(addr, []byte("k"))
	defer r.Close()
	g := run(t, Config{MaxBatch: 4}, r)
	if out, err := g.Call(ctx, "echo", []byte("one")); err != nil || string(out) != "one" {
		t.Fatalf("first call: %q %v", out, err)
	}
	// Renewing the lease cuts the connection; the next calls redial.
	_ = app.SetCredential(0, []byte("k"))
	var out []byte
	var err error
	for i := 0; i < 3; i++ {
		if out, err = g.Call(ctx, "echo", []byte("two")); err == nil {
			break
		}
		if !errors.Is(err, accel.ErrClosed) {
			t.Fatalf("call after renewal: %v", err)
		}
	}
	if err != nil || string(out) != "two" {
		t.Fatalf("after redial: %q %v", out, err)
	}
}

// startAppliance runs an appliance until the test ends.
func startAppliance(t *testing.T, cfg appliance.Config) *appliance.Appliance {
	t.Helper()
	app, err := appliance.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	return app
}
