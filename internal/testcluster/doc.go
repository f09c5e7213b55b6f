// Package testcluster runs a whole Rialto cluster inside a test: a control
// plane (controlplane.Server over SQLite in the test's temporary directory,
// served by an httptest server on loopback, driven by a fake clock) and N
// real agents lending file-backed block devices from t.TempDir(), with
// fault injection: kill or restart an agent (same state directory, so the
// same identity), pause its heartbeats, make it refuse or ignore
// reservations or stop a wipe half-way, stop, start or restart the control
// plane on the same database and address.
//
// The control plane's background duties do not run on their own: tests
// advance the fake clock with [Cluster.Advance] and run [Cluster.Sweep]
// (liveness, expiry). The agents tell time by the same fake clock (leases'
// expiries). Agents heartbeat on a short real interval ([Clock]: fake Now,
// real timers); a test that needs a heartbeat to have happened calls
// [Cluster.Heartbeat].
//
// Zero values: use [Start]; a zero Cluster or Node is not usable.
// Concurrency: Cluster and Node methods may be called from the test's
// goroutines concurrently, except Kill and Restart of the same Node.
// Everything started is stopped by the test's cleanup.
package testcluster
