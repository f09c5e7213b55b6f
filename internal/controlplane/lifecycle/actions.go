package lifecycle

import (
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// Action is what the caller of Step performs, in order.
type Action interface{ action() }

// Create writes the new lease (Step's answer), reserved, with its parts.
// The store re-checks every part's capacity atomically (store.ErrCapacity)
// and the idempotency key (store.ErrDuplicate); the placement holding the
// parts is committed or released with the write's outcome.
type Create struct {
	Demand store.Demand
	Idem   *store.Idempotency
	Event  api.Event
}

// Replace writes Plan's parts in place of the reserved lease's, with the
// same checks as Create.
type Replace struct {
	Plan  api.Plan
	Event api.Event
}

// Persist is a compare-and-set write of the lease, from one of
// Change.From to Change.To, with its audit event. If the store refuses it
// (store.ErrConflict: the lease moved on; store.ErrNotFound) or fails, the
// caller performs Undo instead of the actions after it.
type Persist struct {
	Change store.LeaseChange
	Event  api.Event
	Undo   []Action
}

// Prepare asks each part's lender to prepare its export and mint its
// address. The outcome is the next event: Confirm or PrepareFailed.
type Prepare struct{}

// Place places the lease again, also avoiding the nodes in Skip (node ID
// → why). The outcome is the next event: Placed or Unplaceable.
type Place struct{ Skip map[string]string }

// Teardown asks the lease's lenders (each node once, all but Except) to
// stop serving it: every export of the lease, or with Placement set only
// those prepared for that placement or an earlier one (the lease is being
// placed again: a teardown arriving late must leave the new exports). A
// lender that misses it is told again in the answer to its next heartbeat
// (Reconcile).
//
// The lenders wipe the block ranges they tear down, and those ranges stay
// marked as being wiped (out of placement) until each lender confirms:
// Except's too, whose lender is not told now (it is down, or lost the
// lease's exports) but still holds what it held of the lease, and wipes
// it once a heartbeat answer tells it to tear the lease down. Unless
// Removed: node Except was removed, and its ranges left the pool with it
// (a join that brings it back is answered by its heartbeats).
type Teardown struct {
	Except    string
	Removed   bool
	Placement int
}

// TeardownOn answers node NodeID's heartbeat: stop serving the lease.
type TeardownOn struct{ NodeID string }

// KeepOn answers node NodeID's heartbeat: keep serving the lease, which
// expires at ExpiresAt unless renewed, but only its ranges in Parts (the
// lease's parts on that node that are not lost, and the destinations
// there of its moves under way); the lender tears down and wipes the
// lease's other exports. A lender serves an export it restored after a
// restart only once told so, and learns renewals from it.
type KeepOn struct {
	NodeID    string
	ExpiresAt time.Time
	Parts     []api.PartRef
	// Doubt are the node's exports of the lease it is to leave as they
	// are (Reconcile.Doubt).
	Doubt []api.PartRef
}

// Free takes the lease's parts out of the placement view: the lease ended
// and the store freed them with the write before.
type Free struct{}

// FreeParts takes the lease's parts Parts (indexes) out of the placement
// view: the lease goes on without them, and the store freed them with the
// write before.
type FreeParts struct{ Parts []int }

func (Create) action()     {}
func (Replace) action()    {}
func (Persist) action()    {}
func (Prepare) action()    {}
func (Place) action()      {}
func (Teardown) action()   {}
func (TeardownOn) action() {}
func (KeepOn) action()     {}
func (Free) action()       {}
func (FreeParts) action()  {}

// BeginMove writes an open move of a part (store.Mover.BeginMove), which
// holds its destination. If the store refuses it, nothing moves.
type BeginMove struct {
	Move  api.Move
	Event api.Event
}

// FinishMove makes a move's destination the lease's part
// (store.Mover.FinishMove): the commit point of a move. If the store
// refuses it (the lease is no longer active), the caller performs Undo.
type FinishMove struct {
	Move  api.Move
	URI   string
	Event api.Event
	Undo  []Action
}

// EndMove records a move's end (store.Mover.EndMove); a failed move that
// had not committed frees its destination.
type EndMove struct {
	Move  api.Move
	State string // api.MoveDone or api.MoveFailed
	Error string
	Event api.Event
}

// AdoptPart makes what a lender holds a part of the lease at once
// (store.Mover.AdoptPart), with its event: Move recorded done. If the
// store refuses it, nothing changes.
type AdoptPart struct {
	Move  api.Move
	URI   string
	Event api.Event
}

func (AdoptPart) action() {}

// AbortMove asks both lenders of a move to give it up: the source serves
// the part as before, the destination wipes what it received.
type AbortMove struct{ Move api.Move }

func (BeginMove) action()  {}
func (FinishMove) action() {}
func (EndMove) action()    {}
func (AbortMove) action()  {}
