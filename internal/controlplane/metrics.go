package controlplane

import (
	"context"
	"net/http"
	"net/url"
	"path"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/metrics"
)

type serverMetrics struct {
	requests         *prometheus.CounterVec
	latency          *prometheus.HistogramVec
	leases           *prometheus.GaugeVec
	nodes            *prometheus.GaugeVec
	leaseTransitions *prometheus.CounterVec
	lenderLatency    *prometheus.HistogramVec
	placeRetries     prometheus.Counter
	wipeWaits        prometheus.Gauge
	batchSize        *prometheus.HistogramVec
	leader           prometheus.Gauge
	hbInterval       prometheus.Gauge
}

// The states the gauges report, and the transitions start at zero for.
var (
	metricNodeStates  = []api.NodeState{api.NodeReady, api.NodeSuspect, api.NodeDown}
	metricLeaseStates = []api.LeaseState{api.LeaseRequested, api.LeaseReserved, api.LeaseActive, api.LeaseReleasing,
		api.LeaseReleased, api.LeaseFailed, api.LeaseLost, api.LeaseExpired}
)

// newServerMetrics registers the control plane's metrics with r. Series
// whose labels are known in advance start at zero, so that a rate over an
// idle cluster is 0 rather than absent.
func newServerMetrics(r prometheus.Registerer) serverMetrics {
	m := serverMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_api_requests_total",
			Help: "API requests by route and status code."}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rialto_api_request_duration_seconds",
			Help: "API request latency by route.", Buckets: metrics.LatencyBuckets}, []string{"route"}),
		leases: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "rialto_leases", Help: "Leases by state."}, []string{"state"}),
		nodes:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "rialto_nodes", Help: "Nodes by state."}, []string{"state"}),
		leaseTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_lease_transitions_total",
			Help: "Lease state transitions by target state."}, []string{"state"}),
		lenderLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rialto_lender_call_duration_seconds",
			Help: "Calls to lender agents by operation.", Buckets: metrics.LatencyBuckets}, []string{"op"}),
		placeRetries: prometheus.NewCounter(prometheus.CounterOpts{Name: "rialto_placement_retries_total",
			Help: "Reservations retried after losing a race for a device."}),
		wipeWaits: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rialto_placement_wipe_waits",
			Help: "Lease requests waiting, for want of room, until a lender confirms the wipe of a range released before (docs/placement.md)."}),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rialto_store_batch_size",
			Help:    "Writes group-committed in one store transaction, by kind (lease: creations and transitions; heartbeat).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256}}, []string{"kind"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rialto_controlplane_leader",
			Help: "1 when this replica runs the background duties (the elected one of replicas sharing a store)."}),
		hbInterval: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rialto_heartbeat_interval_seconds",
			Help: "The heartbeat interval agents are told (stretched with the number of nodes: docs/operations.md)."}),
	}
	r.MustRegister(m.requests, m.latency, m.leases, m.nodes, m.leaseTransitions, m.lenderLatency, m.placeRetries, m.wipeWaits, m.batchSize,
		m.leader, m.hbInterval)
	for _, st := range metricLeaseStates {
		m.leaseTransitions.WithLabelValues(string(st))
	}
	for _, op := range []string{"prepare", "teardown"} {
		m.lenderLatency.WithLabelValues(op)
	}
	return m
}

// serveMetrics refreshes the state gauges from the store and serves the
// registry.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.PrepareTimeout)
	defer cancel()
	if c, err := s.st.Counts(ctx); err == nil {
		for _, st := range metricNodeStates {
			s.m.nodes.WithLabelValues(string(st)).Set(float64(c.Nodes[st]))
		}
		for _, st := range metricLeaseStates {
			s.m.leases.WithLabelValues(string(st)).Set(float64(c.Leases[st]))
		}
	} else {
		s.log.Warn("metrics: counts", "err", err)
	}
	leader := 0.0
	if s.Leading() {
		leader = 1
	}
	s.m.leader.Set(leader)
	s.m.hbInterval.Set(s.heartbeatInterval().Seconds())
	promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
}

// hMetricsTargets lists the Prometheus scrape targets, for Prometheus's
// HTTP service discovery: this control plane, at the address the request
// reached it by (the one Prometheus uses), and every node's agent API, in
// every state (a node that is down shows as a target that is down).
func (s *Server) hMetricsTargets(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	nodes, err := s.st.Nodes(ctx)
	if err != nil {
		return 0, nil, err
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	out := []api.MetricsTargetGroup{{Targets: []string{r.Host},
		Labels: map[string]string{"__scheme__": scheme, "__metrics_path__": "/metrics", "component": "controlplane"}}}
	for _, n := range nodes {
		if n.State == api.NodeRemoved {
			continue // retired: its agent is gone for good, not down
		}
		u, err := url.Parse(n.AgentURL)
		if err != nil || u.Host == "" {
			continue
		}
		out = append(out, api.MetricsTargetGroup{Targets: []string{u.Host}, Labels: map[string]string{
			"__scheme__": u.Scheme, "__metrics_path__": path.Join("/", u.Path, "metrics"), "component": "agent", "node": n.Name}})
	}
	return http.StatusOK, out, nil
}
