// Package metrics is a small Prometheus text-format (version 0.0.4) metrics
// registry: counters, gauges and histograms, with optional labels.
//
// The zero value of Registry is not usable; call NewRegistry. All metric
// types are safe for concurrent use by multiple goroutines. A Registry is an
// http.Handler that serves the exposition format.
package metrics
