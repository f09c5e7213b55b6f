// Package controlplane is Rialto's control plane: the inventory of nodes
// and devices, the lease lifecycle (place → reserve → lender prepares →
// active → release, with TTL expiry and node liveness), authentication of
// agents and tenants, and the REST/JSON API under /v1/ (with its OpenAPI
// document, Prometheus metrics and the event stream, stream.go), with the
// Redfish facade of package redfish under /redfish/v1.
//
// A Server is built by New from a Config whose Store is required; every
// other field has a default. A Server is safe for concurrent use: handlers
// run in many goroutines and the store serializes the reservations so that
// a device is never over-committed. Run (or, in tests, Sweep with a fake
// Clock) drives the background duties; Run's caller owns its goroutine and
// stops it by cancelling the context.
package controlplane
