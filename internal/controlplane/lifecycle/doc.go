// Package lifecycle is the lease state machine of the control plane
// (docs/ARCHITECTURE.md §2): requested → reserved → active → releasing →
// released, with failed, lost and expired.
//
// Step takes a lease, an event and the time, and returns the lease after
// the event and the actions that bring the world in line with it: writes
// to the store (Create, Replace, Persist), calls to the lenders (Prepare,
// Teardown), a new placement (Place), the release of the lease's capacity
// in the placement view (Free), and the answers to a lender's heartbeat
// (TeardownOn, KeepOn). Like raft's RawNode it does no I/O: the caller
// performs the actions, in order, and feeds their outcomes back as events
// — a Prepare comes back as Confirm or PrepareFailed, a Place as Placed or
// Unplaceable. Every path that changes a lease goes through Step:
// creation, renewal, release, the expiry sweep, node loss, interrupted
// work and heartbeat reconciliation.
//
// A step asks for at most one write. Writes are compare-and-set: each
// names the states it may move the lease from, so a caller whose copy of
// the lease is stale loses the write (the store refuses it) instead of
// undoing another writer's. At a refused or failed write the caller stops:
// it performs the write's Undo instead of the actions after it. An event
// the lease's state does not allow is refused (a *Refusal, ErrRefused):
// the lease does not change and nothing is written, though a refused
// Confirm or PrepareFailed still asks for Teardown, since the lenders
// prepared exports that no lease will use.
//
// The package has no state; Step is a pure function (no goroutines, no
// clock, no I/O: a test keeps it so), safe for concurrent use.
package lifecycle
