package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/metrics"
)

func newFakeClock() *clock.Fake { return clock.NewFake(time.Unix(1000, 0)) }

// recorder is a backend that reports every batch and can be gated.
type recorder struct {
	batches chan []string
	gate    chan struct{} // nil: never blocks
}

func (r *recorder) CallBatch(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	var names []string
	for _, in := range ins {
		names = append(names, string(in))
	}
	r.batches <- names
	if r.gate != nil {
		select {
		case <-r.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if entry == "fail" {
		return nil, errors.New("backend exploded")
	}
	return ins, nil
}

func run(t *testing.T, cfg Config, b ...Backend) *Gateway {
	t.Helper()
	g, err := New(cfg, b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Run(ctx) }()
	waitFor(t, func() bool { return g.running.Load() })
	t.Cleanup(func() { cancel(); <-done })
	return g
}

// waitFor polls cond with a deadline (no sleeping for synchronisation).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		runtimeGosched()
	}
}

func callAsync(g *Gateway, entry, item string) chan error {
	ch := make(chan error, 1)
	go func() {
		out, err := g.Call(context.Background(), entry, []byte(item))
		if err == nil && string(out) != item {
			err = fmt.Errorf("got %q want %q", out, item)
		}
		ch <- err
	}()
	return ch
}

func noBatch(t *testing.T, r *recorder) {
	t.Helper()
	select {
	case b := <-r.batches:
		t.Fatalf("unexpected batch %v", b)
	default:
	}
}

func TestQueueDelay(t *testing.T) {
	clk := newFakeClock()
	rec := &recorder{batches: make(chan []string, 16)}
	g := run(t, Config{MaxBatch: 8, MaxQueueDelay: 10 * time.Millisecond, Clock: clk}, rec)
	var errs []chan error
	for i := 0; i < 3; i++ {
		errs = append(errs, callAsync(g, "e", fmt.Sprint(i)))
	}
	waitFor(t, func() bool { return g.received.Load() == 3 })
	if err := clk.BlockUntil(t.Context(), 1); err != nil { // the queue-delay timer
		t.Fatal(err)
	}
	noBatch(t, rec)
	clk.Advance(9 * time.Millisecond)
	noBatch(t, rec)
	clk.Advance(time.Millisecond)
	if b := <-rec.batches; len(b) != 3 {
		t.Fatalf("batch %v", b)
	}
	for _, e := range errs {
		if err := <-e; err != nil {
			t.Fatal(err)
		}
	}
}

func TestMaxBatchDispatchesAtOnce(t *testing.T) {
	clk := newFakeClock()
	rec := &recorder{batches: make(chan []string, 16)}
	g := run(t, Config{MaxBatch: 4, MaxQueueDelay: time.Hour, Clock: clk}, rec)
	for i := 0; i < 4; i++ {
		callAsync(g, "e", fmt.Sprint(i))
	}
	if b := <-rec.batches; len(b) != 4 {
		t.Fatalf("batch %v", b)
	}
}

func TestPreferredSizes(t *testing.T) {
	clk := newFakeClock()
	rec := &recorder{batches: make(chan []string, 16)}
	g := run(t, Config{MaxBatch: 8, PreferredBatch: []int{4, 2}, MaxQueueDelay: time.Hour, Clock: clk}, rec)
	callAsync(g, "e", "a")
	waitFor(t, func() bool { return g.received.Load() == 1 })
	noBatch(t, rec)
	callAsync(g, "e", "b")
	if b := <-rec.batches; len(b) != 2 {
		t.Fatalf("preferred 2: %v", b)
	}
	callAsync(g, "e", "c")
	waitFor(t, func() bool { return g.received.Load() == 3 })
	noBatch(t, rec)
	clk.Advance(time.Hour)
	if b := <-rec.batches; len(b) != 1 || b[0] != "c" {
		t.Fatalf("after delay: %v", b)
	}
}

func TestGroupsStayTogether(t *testing.T) {
	rec := &recorder{batches: make(chan []string, 64), gate: make(chan struct{})}
	g := run(t, Config{MaxBatch: 4, Clock: newFakeClock()}, rec)
	first := callAsync(g, "e", "x0")
	<-rec.batches // the only worker is now busy
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		outs, err := g.CallGroup(context.Background(), "e", [][]byte{[]byte("g0"), []byte("g1"), []byte("g2")})
		if err != nil || len(outs) != 3 || string(outs[2]) != "g2" {
			t.Errorf("group: %q %v", outs, err)
		}
	}()
	waitFor(t, func() bool { return g.received.Load() == 2 })
	singles := []chan error{callAsync(g, "e", "s0"), callAsync(g, "e", "s1")}
	waitFor(t, func() bool { return g.received.Load() == 4 })
	close(rec.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for _, s := range singles {
		if err := <-s; err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(rec.batches)
	for b := range rec.batches {
		j := strings.Join(b, ",")
		if strings.Contains(j, "g") && !strings.Contains(j, "g0,g1,g2") {
			t.Fatalf("group split: %v", b)
		}
		if len(b) > 4 {
			t.Fatalf("batch above max: %v", b)
		}
	}
}

func TestRejections(t *testing.T) {
	clk := newFakeClock()
	rec := &recorder{batches: make(chan []string, 16), gate: make(chan struct{})}
	g := run(t, Config{MaxBatch: 2, QueueLimit: 3, QueueTimeout: 5 * time.Millisecond, MaxQueueDelay: time.Hour, Clock: clk}, rec)
	ctx := context.Background()
	if _, err := g.CallGroup(ctx, "e", make([][]byte, 3)); !errors.Is(err, ErrGroupTooBig) || !errors.Is(err, accel.ErrTooLarge) {
		t.Fatalf("group too big: %v", err)
	}
	a, b := callAsync(g, "e", "a"), callAsync(g, "e", "b")
	<-rec.batches // worker busy with [a b]
	c := callAsync(g, "e", "c")
	waitFor(t, func() bool { return g.received.Load() == 3 })
	if _, err := g.Call(ctx, "e", []byte("d")); !errors.Is(err, ErrQueueFull) || !errors.Is(err, accel.ErrBusy) {
		t.Fatalf("queue full: %v", err)
	}
	clk.Advance(5 * time.Millisecond)
	if err := <-c; !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("queue timeout: %v", err)
	}
	close(rec.gate)
	if err := <-a; err != nil {
		t.Fatal(err)
	}
	if err := <-b; err != nil {
		t.Fatal(err)
	}
	if s := g.Stats(); s.Rejected != 3 || s.Executions != 1 || s.Items != 2 {
		t.Fatalf("stats %+v", s)
	}
	idle, _ := New(Config{}, []Backend{rec})
	if _, err := idle.Call(ctx, "e", nil); !errors.Is(err, ErrStopped) {
		t.Fatalf("not running: %v", err)
	}
	if _, err := New(Config{MaxBatch: 4, PreferredBatch: []int{8}}, []Backend{rec}); !errors.Is(err, ErrConfig) {
		t.Fatalf("bad preferred: %v", err)
	}
}

func TestConcurrentCallersAndMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	echo, _ := roles.New(context.Background(), roles.Spec{Name: "echo"})
	g := run(t, Config{Name: "echo", MaxBatch: 16, MaxQueueDelay: 100 * time.Microsecond, Workers: 2, Metrics: reg},
		Local(echo), Local(echo))
	var wg sync.WaitGroup
	for c := 0; c < 64; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				msg := []byte(fmt.Sprintf("c%d-%d", c, i))
				out, err := g.Call(context.Background(), "echo", msg)
				if err != nil || !bytes.Equal(out, msg) {
					t.Errorf("%s: %q %v", msg, out, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	s := g.Stats()
	if s.Items != 3200 || s.Requests != 3200 || s.AvgBatch < 1 {
		t.Fatalf("stats %+v", s)
	}
	t.Logf("average batch %.1f over %d executions", s.AvgBatch, s.Executions)
	want := fmt.Sprintf(`# HELP rialto_gateway_executions_total Backend executions (batches); items/executions is the average batch size.
# TYPE rialto_gateway_executions_total counter
rialto_gateway_executions_total{gateway="echo"} %d
# HELP rialto_gateway_inferences_total Items executed.
# TYPE rialto_gateway_inferences_total counter
rialto_gateway_inferences_total{gateway="echo"} 3200
# HELP rialto_gateway_requests_total Requests by outcome (ok, error, rejected, cancelled).
# TYPE rialto_gateway_requests_total counter
rialto_gateway_requests_total{gateway="echo",outcome="cancelled"} 0
rialto_gateway_requests_total{gateway="echo",outcome="error"} 0
rialto_gateway_requests_total{gateway="echo",outcome="ok"} 3200
rialto_gateway_requests_total{gateway="echo",outcome="rejected"} 0
`, s.Executions)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"rialto_gateway_inferences_total", "rialto_gateway_requests_total", "rialto_gateway_executions_total"); err != nil {
		t.Error(err)
	}
	if n, _ := metrics.Value(reg, "rialto_gateway_queue_seconds", "gateway", "echo"); n != 3200 {
		t.Errorf("%v queue times observed, want 3200", n)
	}
	if v, _ := metrics.Value(reg, "rialto_gateway_pending_items", "gateway", "echo"); v != 0 {
		t.Errorf("%v items pending after every call returned", v)
	}
	// A failing backend fails every request of the batch, clearly.
	if _, err := g.Call(context.Background(), "nope", nil); !errors.Is(err, roles.ErrUnknownEntry) {
		t.Fatalf("unknown entry: %v", err)
	}
}

func TestServedOverAccel(t *testing.T) {
	echo, _ := roles.New(context.Background(), roles.Spec{Name: "echo"})
	g := run(t, Config{MaxBatch: 8}, Local(echo))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = (&accel.Server{Target: g.Target([]byte("gw-cred"))}).Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	if _, err := accel.Dial(ctx, ln.Addr().String(), []byte("bad")); !errors.Is(err, accel.ErrAuth) {
		t.Fatalf("bad credential: %v", err)
	}
	c, err := accel.Dial(ctx, ln.Addr().String(), []byte("gw-cred"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if out, err := c.Call(ctx, "echo", []byte("hi")); err != nil || string(out) != "hi" {
		t.Fatalf("call %q %v", out, err)
	}
	outs, err := c.CallBatch(ctx, "echo", [][]byte{[]byte("a"), []byte("b")})
	if err != nil || len(outs) != 2 || string(outs[1]) != "b" {
		t.Fatalf("batch %q %v", outs, err)
	}
	if _, err := c.CallBatch(ctx, "echo", make([][]byte, 9)); !errors.Is(err, accel.ErrTooLarge) {
		t.Fatalf("group too big over the wire: %v", err)
	}
	if err := c.WriteMem(ctx, 0, []byte("x")); !errors.Is(err, accel.ErrOutOfRange) {
		t.Fatalf("write to a gateway: %v", err)
	}
}

func TestBatchKeyPullsRelatedRequests(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		rec := &recorder{batches: make(chan []string, 16), gate: make(chan struct{})}
		g := run(t, Config{MaxBatch: 3, Clock: newFakeClock()}, rec)
		first := callAsync(g, "e", "x")
		<-rec.batches // the only worker is busy
		key := ""
		if keyed {
			key = "user-1"
		}
		var errs []chan error
		submit := func(k, item string) {
			ch := make(chan error, 1)
			go func() {
				outs, err := g.CallKeyed(context.Background(), k, "e", [][]byte{[]byte(item)})
				if err == nil && string(outs[0]) != item {
					err = fmt.Errorf("got %q for %q", outs[0], item)
				}
				ch <- err
			}()
			errs = append(errs, ch)
			waitFor(t, func() bool { return g.received.Load() == int64(1+len(errs)) })
		}
		submit(key, "a1")
		submit("", "b1")
		submit("", "c1")
		submit(key, "a2")
		close(rec.gate)
		for _, e := range append(errs, first) {
			if err := <-e; err != nil {
				t.Fatal(err)
			}
		}
		got := strings.Join(<-rec.batches, ",") + " | " + strings.Join(<-rec.batches, ",")
		want := "a1,b1,c1 | a2"
		if keyed {
			want = "a1,a2,b1 | c1"
		}
		if got != want {
			t.Errorf("keyed=%v: batches %s, want %s", keyed, got, want)
		}
	}
}

func TestStopFailsQueuedAndRunOnce(t *testing.T) {
	rec := &recorder{batches: make(chan []string, 4), gate: make(chan struct{})}
	g, err := New(Config{MaxBatch: 1, Clock: newFakeClock()}, []Backend{rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	waitFor(t, g.Running)
	inflight := callAsync(g, "e", "a")
	<-rec.batches
	queued := callAsync(g, "e", "b")
	waitFor(t, func() bool { return g.received.Load() == 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-queued; !errors.Is(err, ErrStopped) {
		t.Fatalf("queued request: %v", err)
	}
	if err := <-inflight; err == nil {
		t.Fatal("in-flight request survived the stop")
	}
	if err := g.Run(context.Background()); !errors.Is(err, ErrConfig) {
		t.Fatalf("second Run: %v", err)
	}
	if _, err := g.Call(context.Background(), "e", nil); !errors.Is(err, ErrStopped) {
		t.Fatalf("call after stop: %v", err)
	}
}
