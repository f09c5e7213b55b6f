package main

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/gateway"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/mct"
)

func TestParseMetrics(t *testing.T) {
	const body = `# HELP rialto_gateway_lease_served_items_total Items answered.
# TYPE rialto_gateway_lease_served_items_total counter
rialto_gateway_lease_served_items_total{gateway="accel0/mct/1",lease="lease-a"} 1200
rialto_gateway_lease_served_items_total{gateway="accel0/mct/1",lease="lease-b"} 3600
rialto_gateway_lease_served_items_total{gateway="accel0/mct/2",lease="lease-a"} 5
rialto_gateway_lease_weight{gateway="accel0/mct/1",lease="lease-a"} 250
rialto_accel_slot_tasks_total{outcome="error",slot="0"} 1
rialto_accel_slot_tasks_total{outcome="error",slot="1"} 2
rialto_accel_slot_tasks_total{outcome="ok",slot="1"} 7e3
odd_label{note="a b, c=\"d\""} 4 1700000000000
plain 1.5
`
	m, err := parseMetrics(body)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"rialto_gateway_lease_served_items_total", []string{"lease", "lease-a"}, 1205},
		{"rialto_gateway_lease_served_items_total", []string{"lease", "lease-a", "gateway", "accel0/mct/1"}, 1200},
		{"rialto_gateway_lease_served_items_total", nil, 4805},
		{"rialto_gateway_lease_served_items_total", []string{"lease", "lease-"}, 0}, // values match whole
		{"rialto_gateway_lease_weight", []string{"lease", "lease-a"}, 250},
		{"rialto_gateway_lease", nil, 0}, // names match whole
		{"rialto_accel_slot_tasks_total", []string{"outcome", "error"}, 3},
		{"rialto_accel_slot_tasks_total", []string{"slot", "1"}, 7002},
		{"odd_label", nil, 4},
		{"plain", nil, 1.5},
	} {
		if got := m.sum(c.name, c.labels...); got != c.want {
			t.Errorf("sum(%s, %v) = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, bad := range []string{"novalue", `x{a="1"}`, "x one"} {
		if _, err := parseMetrics(bad + "\n"); err == nil {
			t.Errorf("parseMetrics(%q): no error", bad)
		}
	}
}

// TestScrapeOfARegistry scrapes what client_golang serves over HTTP, the
// exposition the agent's /metrics serves.
func TestScrapeOfARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_gateway_lease_served_items_total", Help: "h"}, []string{"gateway", "lease"})
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rialto_gateway_queue_seconds", Help: "h"}, []string{"gateway"})
	reg.MustRegister(c, h)
	c.WithLabelValues("accel0/mct/1", "lease-x").Add(42)
	c.WithLabelValues("accel0/mct/1", "lease-y").Add(8)
	h.WithLabelValues("accel0/mct/1").Observe(0.002)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	m, err := scraper{url: srv.URL, hc: srv.Client()}.scrape(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for lease, want := range map[string]float64{"lease-x": 42, "lease-y": 8, "lease-z": 0} {
		if got := m.sum("rialto_gateway_lease_served_items_total", "lease", lease); got != want {
			t.Errorf("%s: %v, want %v", lease, got, want)
		}
	}
	if got := m.sum("rialto_gateway_queue_seconds_count"); got != 1 {
		t.Errorf("histogram count %v, want 1", got)
	}
}

// TestRunTenants drives two leases of a shared gateway (the gateway
// package over the accel protocol on loopback, the MCT role in process)
// and checks the harness's accounting: every answered request counts its
// group's queries, expired deadlines are told from failures, and the
// gateway served at least what the clients counted.
func TestRunTenants(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rng := rand.New(rand.NewPCG(3, 4))
	rs := mct.Generate(rng, 300)
	engine, err := mct.Compile(rs)
	if err != nil {
		t.Fatal(err)
	}
	rulesJSON, _ := jsonMarshal(rs)
	role, err := roles.New(ctx, roles.Spec{Name: "mct", Config: rulesJSON})
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := engine.EncodeAll(mct.GenerateQueries(rng, 256))
	e := &env{engine: engine}
	for i := 0; i < 256; i++ {
		e.queries = append(e.queries, enc[i*mct.QuerySize:(i+1)*mct.QuerySize])
	}
	g, err := gateway.New(gateway.Config{Name: "t", MaxBatch: 16, Workers: 1, QueueLimit: 1 << 12}, []gateway.Backend{gateway.Local(role)})
	if err != nil {
		t.Fatal(err)
	}
	gdone := make(chan error, 1)
	go func() { gdone <- g.Run(ctx) }()
	var cs gateway.Credentials
	for _, l := range []struct {
		cred, name string
		w          int
	}{{"cred-a", "lease-a", 1}, {"cred-b", "lease-b", 3}} {
		if err := cs.AddWeighted([]byte(l.cred), l.name, l.w); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sdone := make(chan error, 1)
	go func() { sdone <- (&accel.Server{Target: g.SharedTarget(&cs)}).Serve(ctx, ln) }()
	defer func() { cancel(); <-sdone; <-gdone }()
	mk := func(name, cred string) *tenant {
		tn := &tenant{name: name}
		for range 4 {
			c, err := accel.Dial(ctx, ln.Addr().String(), []byte(cred))
			if err != nil {
				t.Fatal(err)
			}
			tn.conns = append(tn.conns, c)
		}
		return tn
	}
	ta, tb := mk("A", "cred-a"), mk("B", "cred-b")
	defer ta.close()
	defer tb.close()
	const group = 4
	served := func() map[string]uint64 {
		m := map[string]uint64{}
		for _, l := range g.Leases() {
			m[l.Lease] = l.Served
		}
		return m
	}
	before := served()
	k := kernel{entry: "match", item: e.query}
	s := runTenants(ctx, k, 200*time.Millisecond, group, []tenantLoad{{t: ta}, {t: tb}})
	after := served()
	for i, name := range []string{"lease-a", "lease-b"} {
		x := s[i]
		if x.ok == 0 || x.failed != 0 || x.expired != 0 || x.p99 < x.p50 || x.p50 <= 0 {
			t.Fatalf("tenant %d: %+v", i, x)
		}
		if want := float64(x.ok*group) / x.secs; x.qps != want {
			t.Errorf("tenant %d: %v queries/s, want %v", i, x.qps, want)
		}
		if got := after[name] - before[name]; got < uint64(x.ok*group) {
			t.Errorf("%s: the gateway served %d queries, the clients counted %d", name, got, x.ok*group)
		}
	}
	// A deadline no call can meet: every request of A expires, B's are
	// answered.
	s = runTenants(ctx, k, 100*time.Millisecond, group, []tenantLoad{{t: ta, deadline: time.Nanosecond}, {t: tb}})
	if a := s[0]; a.ok != 0 || a.expired == 0 || a.failed != 0 {
		t.Fatalf("A with a 1ns deadline: %+v", a)
	}
	if b := s[1]; b.ok == 0 || b.failed != 0 || b.expired != 0 {
		t.Fatalf("B beside it: %+v", b)
	}
}

// TestWorkModule runs the hand-assembled module in the wasm role: its
// answers are workResult's, and its cost grows with n.
func TestWorkModule(t *testing.T) {
	ctx := context.Background()
	role, err := roles.New(ctx, roles.Spec{Name: "wasm", Module: workModule()})
	if err != nil {
		t.Fatal(err)
	}
	defer role.Close(ctx)
	for _, n := range []uint32{0, 1, 2, 1000, 123457} {
		out, err := role.Run(ctx, "work", workInput(n))
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 4 || binary.LittleEndian.Uint32(out) != workResult(n) {
			t.Fatalf("work(%d) = %x, want %d", n, out, workResult(n))
		}
	}
	for _, n := range []uint32{0, 200, 1000} {
		t0 := time.Now()
		for range 200 {
			if _, err := role.Run(ctx, "work", workInput(n)); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("work(%d): %v a call", n, time.Since(t0)/200)
	}
}
