package lifecycle

import (
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// Event is something that happens to a lease: Step's input.
type Event interface{ event() }

// Reserve: placement chose the requested lease's parts (the lease carries
// them and its plan); write it reserved, then prepare it.
type Reserve struct {
	Demand store.Demand       // the request's demand, kept for placement
	Idem   *store.Idempotency // the request's idempotency key, if any
	Size   string             // the request's size in words ("1 GiB", "2 slots"), for the audit event
}

// Confirm: every lender prepared its part; URIs are the parts' addresses,
// in part order.
type Confirm struct{ URIs []string }

// PrepareFailed: in prepare round Round (from 0), the lenders in Failed
// (node ID → why, in words a user reads, naming the lender: "lender
// node2 refused the part: …") did not confirm.
type PrepareFailed struct {
	Failed map[string]string
	Round  int
}

// Placed: a new placement (Place) found parts for the lease.
type Placed struct {
	Plan    api.Plan
	Skipped int // lenders that did not confirm, for the audit event
}

// Unplaceable: a new placement found no parts for the lease, or writing
// them was refused.
type Unplaceable struct {
	Failed map[string]string // the lenders that did not confirm, in any round (node ID → why, as in PrepareFailed)
	Err    error             // why there is no other placement, in words a user reads
	Plan   *api.Plan         // the plan that could not be used, recorded with the failure
}

// Renew extends the lease's TTL from now; TTLSeconds 0 keeps the lease's.
type Renew struct{ TTLSeconds int64 }

// Release: tenant By releases the lease. Tenant, when set, is a condition
// of the write: the lease must be that tenant's (else the store answers
// not found).
type Release struct{ By, Tenant string }

// TornDown: the lenders of a releasing lease were told to stop serving it.
type TornDown struct{}

// Expire: the lease's TTL ran out without renewal.
type Expire struct{}

// NodeDown: a lender of the lease (NodeID, named Name) missed its
// heartbeats past the grace period, or (Removed) was removed by the
// operator. A lease whose kind may lose a part (Degrades) goes on without
// the parts on that node while other parts are left; any other lease is
// lost.
type NodeDown struct {
	NodeID, Name string
	Removed      bool
}

// PartsLost: lender NodeID lost the exports of the lease's parts on it
// at Parts (device ID and offset; lengths are not compared) with their
// data, for the reason Why (a memory region does not survive its agent's
// restart). The parts are lost as those of a down node are (NodeDown);
// the node's other parts are not.
type PartsLost struct {
	NodeID string
	Parts  []api.PartRef
	Why    string
}

// Interrupted: a reservation or a release has not moved since before
// Before: the control plane was restarted while it ran.
type Interrupted struct{ Before time.Time }

// Reconcile: node NodeID reports in its heartbeat that it serves the
// lease. Incoming are the destinations on that node of the lease's moves
// under way (it serves such a part before the lease points at it).
type Reconcile struct {
	NodeID   string
	Incoming []api.PartRef
	// Doubt are exports the node holds of the lease, which the store
	// places elsewhere, that the control plane may adopt (PartAdopted):
	// while the lease is active, the node is told neither to serve nor to
	// tear them down.
	Doubt []api.PartRef
}

// Moved: lender NodeID serves exports of the lease at new addresses after
// a restart.
type Moved struct {
	NodeID  string
	Exports []api.MovedExport
}

func (Reserve) event()       {}
func (Confirm) event()       {}
func (PrepareFailed) event() {}
func (Placed) event()        {}
func (Unplaceable) event()   {}
func (Renew) event()         {}
func (Release) event()       {}
func (TornDown) event()      {}
func (Expire) event()        {}
func (NodeDown) event()      {}
func (PartsLost) event()     {}
func (Interrupted) event()   {}
func (Reconcile) event()     {}
func (Moved) event()         {}

// MoveStarted: part Move.Part of the lease is to move from Move.From to
// Move.To (rialto lease move, a drain): write the open move, which holds
// the destination, then copy.
type MoveStarted struct{ Move api.Move }

// MoveDone: the destination serves the moving part at URI (the source
// holds its writes): the lease's part is the destination from now on.
type MoveDone struct {
	Move api.Move
	URI  string
}

// MoveFailed: a move ended without the lease pointing at its destination
// (or, Committed, after it did, when the source failed to let go); Why
// says what happened.
type MoveFailed struct {
	Move api.Move
	Why  string
}

// PartAdopted: the recorded lender of part Move.Part (at Move.From) was
// shown not to serve it (its heartbeats, checked twice), and node
// Move.To.NodeID holds an export of it at Move.To, served at URI, whose
// name the control plane derived for that part (the destination of a move
// the store does not know: its database was restored from a backup taken
// before it). The part is Move.To from now on, with Move recorded done.
type PartAdopted struct {
	Move api.Move
	URI  string
}

func (PartAdopted) event() {}

func (MoveStarted) event() {}
func (MoveDone) event()    {}
func (MoveFailed) event()  {}
