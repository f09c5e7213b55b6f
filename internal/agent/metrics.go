package agent

import (
	"github.com/prometheus/client_golang/prometheus"
)

// registerMetrics registers the agent's metrics with r. Series whose
// labels are known in advance start at zero, so that a rate over an idle
// agent is 0 rather than absent.
func (a *Agent) registerMetrics(r prometheus.Registerer) {
	a.mHeartbeats = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_agent_heartbeats_total",
		Help: "Heartbeats sent, by result."}, []string{"result"})
	a.mPrepares = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_agent_prepares_total",
		Help: "Prepare requests, by result."}, []string{"result"})
	a.mExports = prometheus.NewGauge(prometheus.GaugeOpts{Name: "rialto_agent_exports",
		Help: "Exports kept: served, held or suspended (see rialto_agent_exports_withheld)."})
	a.mWithheld = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "rialto_agent_exports_withheld",
		Help: "Exports kept but not served, by state: held (restored, awaiting the control plane's confirmation) or suspended (their lease's known expiry passed)."},
		[]string{"state"})
	a.mRestored = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_agent_restored_exports_total",
		Help: "Exports restored after a restart, by result once the control plane answered: same_address, new_address (the lease's URI is stale), unknown_address (none persisted), failed, dropped (the control plane no longer wanted the lease), or lost (counted at the start: the export's data lived in the agent's process, a memory region; its lease is reported lost)."},
		[]string{"result"})
	a.mWipes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_agent_wipes_total",
		Help: "Block ranges wiped before returning to the pool, by result (ok, failed)."}, []string{"result"})
	a.mPendingWipes = prometheus.NewGauge(prometheus.GaugeOpts{Name: "rialto_agent_pending_wipes",
		Help: "Block ranges in the wipe journal: lent to no one until wiped."})
	a.mSuspends = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_agent_expiry_suspensions_total",
		Help: "Exports the agent stopped serving because their lease's known expiry passed without a renewal it could confirm."},
		[]string{"kind"})
	a.mTransfers = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_agent_transfers_total",
		Help: "Parts of leases moved to or from this lender while served, by role (out: the source, in: the destination) and event (started, committed, aborted, failed; held: committed here with no time left on its lease, not served until a heartbeat answer shows time left)."},
		[]string{"role", "event"})
	a.mMoved = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_agent_moved_bytes_total",
		Help: "Bytes this lender sent to other lenders moving parts of leases (every pass), by kind."}, []string{"kind"})
	a.mSkipped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_agent_move_zero_bytes_total",
		Help: "Bytes of moved parts that read as zeroes and were sent as zeroing requests instead, by kind."}, []string{"kind"})
	a.mHeld = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rialto_agent_move_hold_seconds",
		Help:    "How long a moving part's writes were held for its last pass and the switch, by kind.",
		Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}}, []string{"kind"})
	for _, d := range a.drivers {
		if b, ok := d.(*BlockDriver); ok {
			r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rialto_agent_move_pending_bytes",
				Help: "Payload bytes of borrowers' writes to block parts moving from here that the agent holds in memory, not yet written (bounded per part by --move-pending)."},
				func() float64 { return float64(b.movePending()) }))
		}
	}
	r.MustRegister(a.mHeartbeats, a.mPrepares, a.mExports, a.mWithheld, a.mRestored, a.mWipes, a.mPendingWipes, a.mSuspends,
		a.mTransfers, a.mMoved, a.mSkipped, a.mHeld, usageCollector{a})
	for _, re := range [][2]string{{"out", "started"}, {"out", "committed"}, {"out", "aborted"}, {"out", "failed"},
		{"in", "started"}, {"in", "committed"}, {"in", "aborted"}, {"in", "held"}} {
		a.mTransfers.WithLabelValues(re[0], re[1])
	}
	for v, labels := range map[*prometheus.CounterVec][]string{
		a.mHeartbeats: {"ok", "error"},
		a.mPrepares:   {"ok", "error", "ignored", "refused", "held"},
		a.mRestored:   {"same_address", "new_address", "unknown_address", "failed", "dropped", "lost"},
		a.mWipes:      {"ok", "failed"},
	} {
		for _, l := range labels {
			v.WithLabelValues(l)
		}
	}
	for k, d := range a.drivers {
		a.mSuspends.WithLabelValues(string(k))
		if _, ok := d.(Mover); ok {
			a.mMoved.WithLabelValues(string(k))
			a.mSkipped.WithLabelValues(string(k))
			a.mHeld.WithLabelValues(string(k))
		}
	}
	a.mWithheld.WithLabelValues("held")
	a.mWithheld.WithLabelValues("suspended")
}

// registerer is reg as a prometheus.Registerer, nil if reg is nil (a
// driver given no registry publishes nothing).
func registerer(reg *prometheus.Registry) prometheus.Registerer {
	if reg == nil {
		return nil
	}
	return reg
}

// usageCollector publishes the data-plane counters of the drivers that
// keep them (UsageReporter: block devices), read at each scrape: the same
// counters heartbeats carry to the control plane (GET /v1/usage).
type usageCollector struct{ a *Agent }

var (
	descReadBytes = prometheus.NewDesc("rialto_agent_device_read_bytes_total",
		"Bytes borrowers read from the device through its data plane, since the agent started (devices whose driver counts them: block).", []string{"device"}, nil)
	descWrittenBytes = prometheus.NewDesc("rialto_agent_device_written_bytes_total",
		"Bytes borrowers wrote to the device through its data plane, since the agent started (devices whose driver counts them: block).", []string{"device"}, nil)
	descUsedBytes = prometheus.NewDesc("rialto_agent_device_used_bytes",
		"What the device holds (block: the allocated blocks of its backing file, which grow as borrowers write); absent if unknown.", []string{"device"}, nil)
)

func (usageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReadBytes
	ch <- descWrittenBytes
	ch <- descUsedBytes
}

func (c usageCollector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c.a.usage() {
		ch <- prometheus.MustNewConstMetric(descReadBytes, prometheus.CounterValue, float64(u.ReadBytes), u.Name)
		ch <- prometheus.MustNewConstMetric(descWrittenBytes, prometheus.CounterValue, float64(u.WrittenBytes), u.Name)
		if u.UsedBytes != nil {
			ch <- prometheus.MustNewConstMetric(descUsedBytes, prometheus.GaugeValue, float64(*u.UsedBytes), u.Name)
		}
	}
}
