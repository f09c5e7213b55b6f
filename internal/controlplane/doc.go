// Package controlplane is Rialto's control plane: the inventory of nodes
// and devices, the lease lifecycle (place → reserve → lender prepares →
// active → release, with TTL expiry and node liveness), authentication of
// agents and tenants, and the REST/JSON API under /v1/ (with its OpenAPI
// document, Prometheus metrics and the event stream, stream.go), with the
// Redfish facade of package redfish under /redfish/v1.
//
// A lease changes only through the lease state machine
// (internal/controlplane/lifecycle, pure): apply steps it and performs
// the actions it hands back. The reservation pipeline (reservation.go) is
// plan → apply: the reserver (reserver.go) places a request against its
// cached view of the inventory (snapshot.go adapts that view to
// internal/placement) and holds the plan's parts; the state machine's
// Create writes the reservation through the group commit (batch.go), and
// the store re-checks every part atomically, so a stale view costs a
// retry, never an over-commit. Renewal and release (lease.go), the
// background sweep (sweep.go: liveness, expiry, interrupted work) and
// heartbeat reconciliation (nodes.go) drive the same machine; lender.go
// reaches the agents. Replicas sharing a PostgreSQL store elect one
// (replica.go) that runs the background duties and places every lease;
// the others forward lease creations and releases to it (forward.go) and
// serve everything else themselves.
//
// A Server is built by New from a Config whose Store is required; every
// other field has a default. A Server is safe for concurrent use: handlers
// run in many goroutines, the reserver serializes placements and the
// store serializes the writes. Run (or, in tests, Sweep with a fake Clock)
// drives the background duties; Run's caller owns its goroutine and stops
// it by cancelling the context. Config.Clock (internal/clock; nil: the
// real clock) is the one source of time: liveness, TTLs, Run's sweeps and
// the event stream's polls and keep-alives. Reload (reload.go) swaps the
// tokens and quotas of a running Server, all or nothing, concurrently
// with requests; Config.Version decides which agent versions may join
// (version.go).
package controlplane
