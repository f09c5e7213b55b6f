// Package placement decides where a lease's parts go: which devices (or
// partitions, or slots) on which donor nodes, in which mode (dedicated,
// shared, composed), and what bandwidth and completion time the new lease and
// every running lease it slows down can expect. See docs/placement.md.
//
// Everything here is a pure function of a read-only Snapshot and a Request:
// no goroutines, no I/O, no wall clock (Snapshot.Now is passed in), and the
// same inputs always give the same Plan. Place builds an Index for one call;
// callers that place many requests against one snapshot (the simulator, the
// benchmark) build an Index once with NewIndex and call Index.Place, and may
// record accepted plans with Index.Add.
//
// The zero value of Snapshot is an empty cluster (every request is
// infeasible); the zero Request is invalid. Place and Predict are safe for
// concurrent use on the same Snapshot as long as nobody modifies it. An Index
// is not safe for concurrent use (it caches per-borrower distances).
package placement
