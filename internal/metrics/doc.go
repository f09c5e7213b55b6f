// Package metrics is the glue between Rialto's components and
// github.com/prometheus/client_golang, the Prometheus client library every
// component publishes its metrics with.
//
// Each component keeps a registry of its own (prometheus.NewRegistry,
// served with promhttp.HandlerFor), never the library's global default
// registry, so that several components in one process (`rialto up`: a control plane and its agents; in-process test
// clusters) publish apart; RegisterRuntime adds the Go runtime and process
// collectors. Register lets several instances of a data plane
// (gateways, appliances) share the metric families of one registry.
// Families lists what a registration function registers (name, type,
// labels, help), which the components' tests pin in golden files.
//
// The package has no state of its own: its functions are safe for
// concurrent use as far as the registries passed in are (client_golang's
// are).
//
// Its tests also run a real Prometheus (Debian's prometheus and promtool)
// against a real `rialto up`: every target found through the control
// plane's GET /v1/metrics-targets is scraped healthy, every /metrics body
// passes `promtool check metrics`, and every query of the Grafana dashboard
// (docs/grafana/rialto.json) evaluates to a non-empty result.
package metrics
