package controlplane

import (
	"context"
	"net/http"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/metrics"
)

type serverMetrics struct {
	requests         *metrics.CounterVec
	latency          *metrics.HistogramVec
	leases           *metrics.GaugeVec
	nodes            *metrics.GaugeVec
	leaseTransitions *metrics.CounterVec
	lenderLatency    *metrics.HistogramVec
	placeRetries     *metrics.Counter
	batchSize        *metrics.HistogramVec
	leader           *metrics.Gauge
	hbInterval       *metrics.Gauge
}

func newServerMetrics(r *metrics.Registry) serverMetrics {
	return serverMetrics{
		requests:         r.Counter("rialto_api_requests_total", "API requests by route and status code.", "route", "code"),
		latency:          r.Histogram("rialto_api_request_duration_seconds", "API request latency by route.", nil, "route"),
		leases:           r.Gauge("rialto_leases", "Leases by state.", "state"),
		nodes:            r.Gauge("rialto_nodes", "Nodes by state.", "state"),
		leaseTransitions: r.Counter("rialto_lease_transitions_total", "Lease state transitions by target state.", "state"),
		lenderLatency:    r.Histogram("rialto_lender_call_duration_seconds", "Calls to lender agents by operation.", nil, "op"),
		placeRetries:     r.Counter("rialto_placement_retries_total", "Reservations retried after losing a race for a device.").With(),
		batchSize: r.Histogram("rialto_store_batch_size", "Writes group-committed in one store transaction, by kind (lease: creations and transitions; heartbeat).",
			[]float64{1, 2, 4, 8, 16, 32, 64, 128, 256}, "kind"),
		leader:     r.Gauge("rialto_controlplane_leader", "1 when this replica runs the background duties (the elected one of replicas sharing a store).").With(),
		hbInterval: r.Gauge("rialto_heartbeat_interval_seconds", "The heartbeat interval agents are told (stretched with the number of nodes: docs/operations.md).").With(),
	}
}

// serveMetrics refreshes the state gauges from the store and writes the
// registry.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.PrepareTimeout)
	defer cancel()
	if c, err := s.st.Counts(ctx); err == nil {
		for _, st := range []api.NodeState{api.NodeReady, api.NodeSuspect, api.NodeDown} {
			s.m.nodes.With(string(st)).Set(float64(c.Nodes[st]))
		}
		for _, st := range []api.LeaseState{api.LeaseRequested, api.LeaseReserved, api.LeaseActive, api.LeaseReleasing,
			api.LeaseReleased, api.LeaseFailed, api.LeaseLost, api.LeaseExpired} {
			s.m.leases.With(string(st)).Set(float64(c.Leases[st]))
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
	s.reg.ServeHTTP(w, r)
}
