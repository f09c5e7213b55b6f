package api

import "time"

// Transfers move a part of a lease from one lender to another while the
// borrower uses it (docs/operations.md, "Moving leases"). The control
// plane drives them through the agents' API; the bytes go from lender to
// lender, never through the borrower or the control plane. The source
// pushes: it knows which parts of the range its borrower writes while it
// copies, and it can hold those writes for the last pass.

// TransferInRequest asks the destination lender to receive a part:
// POST /agent/v1/transfers/in.
type TransferInRequest struct {
	ID string `json:"id"` // the transfer's ID, chosen by the control plane
	// Token is the transfer's credential (a secret): the destination
	// serves the received range to whoever presents it, for this
	// transfer only, until it is committed or ExpiresAt passes.
	Token string `json:"token"`
	// Part is the part as the destination will serve it once the
	// transfer is committed: lease, device, range and its (new) export
	// name. Its ExpiresAt and Now are the lease's; its TimeoutSeconds is
	// this call's bound, which the destination deducts from both times
	// left (the lease's and the transfer's).
	Part PrepareRequest `json:"part"`
	// ExpiresAt (with Now, the control plane's clock) is when the
	// destination gives the transfer up unless it was committed: it stops
	// serving the received range and wipes it.
	ExpiresAt time.Time `json:"expires_at"`
	Now       time.Time `json:"now,omitzero"`
}

// TransferInResponse is where the source writes the part: the URI of the
// received range, whose export name is the transfer's token (a secret).
type TransferInResponse struct {
	URI string `json:"uri"`
}

// TransferOutRequest asks the source lender to copy a part it serves to
// the destination: POST /agent/v1/transfers/out. It answers at once; the
// copy runs in the background (GET /agent/v1/transfers/ID).
type TransferOutRequest struct {
	ID      string `json:"id"`
	LeaseID string `json:"lease_id"`
	Export  string `json:"export"`   // the part's export name on the source (secret)
	DestURI string `json:"dest_uri"` // TransferInResponse.URI (secret)
	// MaxPasses bounds the copy passes over what was written during the
	// previous one (0: 8); ConvergeBytes is what may be left for the
	// last pass, copied with the borrower's writes held (0: 8 MiB).
	MaxPasses     int   `json:"max_passes,omitempty"`
	ConvergeBytes int64 `json:"converge_bytes,omitempty"`
	// HoldSeconds bounds how long the source holds the borrower's writes
	// once the copy is complete, waiting for the control plane to seal
	// the transfer (0: 30 s); then it serves them again and the transfer
	// fails.
	HoldSeconds float64 `json:"hold_seconds,omitempty"`
}

// Transfer states.
const (
	TransferCopying   = "copying"   // source: copying, pass after pass
	TransferReady     = "ready"     // source: complete and durable at the destination, writes held
	TransferSealed    = "sealed"    // source: writes held until commit or abort, whatever the time
	TransferReceiving = "receiving" // destination: receiving
	TransferCommitted = "committed" // source: the part retired, torn down and wiped; destination: the part served
	TransferAborted   = "aborted"   // given up: the source serves the part, the destination wiped its copy
	TransferFailed    = "failed"    // as aborted, after an error (Error says which)
)

// Transfer is a transfer's state on one lender: GET /agent/v1/transfers/ID.
type Transfer struct {
	ID      string `json:"id"`
	LeaseID string `json:"lease_id"`
	Kind    Kind   `json:"kind"`
	Role    string `json:"role"` // "out" (the source) or "in" (the destination)
	State   string `json:"state"`
	// Size is the part's size; Copied the bytes sent (or received) so
	// far, over every pass; Skipped the bytes not sent because they read
	// as zeroes; Dirty what the borrower wrote since the pass under way
	// started (the next pass's work).
	Size    int64 `json:"size"`
	Copied  int64 `json:"copied"`
	Skipped int64 `json:"skipped,omitempty"`
	Dirty   int64 `json:"dirty,omitempty"`
	Pass    int   `json:"pass,omitempty"`
	// HeldMillis is how long the borrower's writes were held for the
	// last pass and the switch (so far, while they are).
	HeldMillis float64 `json:"held_ms,omitempty"`
	// Error is why the transfer failed or was aborted, in words for the
	// tenant and the admins who read the move's error (the whole error is
	// in the lender's agent log): no lease ID, step of the agent or path
	// of the lender's. The source's agent calls the other lender
	// TransferDestination and itself TransferThisLender, which the control
	// plane replaces with the lenders' names ("the destination could not
	// be reached from this lender: connection refused" reads "the
	// destination n3 could not be reached from n1: connection refused").
	Error     string    `json:"error,omitempty"`
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// The names a source's Transfer.Error gives the two lenders of the move.
const (
	TransferDestination = "the destination"
	TransferThisLender  = "this lender"
)

// Done reports whether the transfer has ended (committed, aborted or
// failed).
func (t Transfer) Done() bool {
	return t.State == TransferCommitted || t.State == TransferAborted || t.State == TransferFailed
}

// TransferCommitRequest is the body of POST /agent/v1/transfers/ID/commit.
// To the destination it brings the lease's expiry as the control plane
// reads it for the commit: ExpiresAt with Now (the control plane's clock)
// and TimeoutSeconds (the call's bound), counted as a prepare's are
// (PrepareRequest). The part the destination serves from the commit on
// knows when the lease expires then, not when it expired at the
// TransferIn (the lease may have been renewed since, and a lender that
// only receives a part of a lease does not report it in its heartbeats,
// so no answer renewed it). The source ignores it. Empty (an older control
// plane): the part keeps the expiry it came with, or a later one that a
// heartbeat answer brought.
type TransferCommitRequest struct {
	ExpiresAt      time.Time `json:"expires_at,omitzero"`
	Now            time.Time `json:"now,omitzero"`
	TimeoutSeconds float64   `json:"timeout_seconds,omitempty"`
}

// TransferCommitResponse answers POST /agent/v1/transfers/ID/commit: on
// the destination, the URI the part is served at now (a secret).
type TransferCommitResponse struct {
	URI string `json:"uri,omitempty"`
}

// MoveRequest asks the control plane to move a lease while its borrower
// uses it: POST /v1/leases/ID/move. Each part moves on its own (a
// composed lease's parts one after the other). The destination is a node
// (by ID or name) or a device (by ID); without either, placement chooses,
// away from the part's current node.
type MoveRequest struct {
	// Part moves only that part (in layout order, from 0); nil moves
	// every part.
	Part     *int   `json:"part,omitempty"`
	ToNode   string `json:"to_node,omitempty"`
	ToDevice string `json:"to_device,omitempty"`
}

// Move states.
const (
	MovePending   = "pending"   // waiting for the lease's earlier moves
	MoveCopying   = "copying"   // the source copies the part to the destination
	MoveSwitching = "switching" // writes held; the destination takes over
	MoveDone      = "done"      // the part is served at its new place
	MoveFailed    = "failed"    // given up; the part is served where it was
)

// Move is one part of a lease moving to another lender: GET /v1/moves.
type Move struct {
	ID      string `json:"id"`
	LeaseID string `json:"lease_id"`
	Part    int    `json:"part"`
	Kind    Kind   `json:"kind"`
	State   string `json:"state"`
	// From and To are the part's old and new place (without URIs).
	From Part `json:"from"`
	To   Part `json:"to"`
	// Copied, Skipped, Dirty, Pass and HeldMillis are the source's
	// Transfer counters (see Transfer).
	Size       int64   `json:"size"`
	Copied     int64   `json:"copied"`
	Skipped    int64   `json:"skipped,omitempty"`
	Dirty      int64   `json:"dirty,omitempty"`
	Pass       int     `json:"pass,omitempty"`
	HeldMillis float64 `json:"held_ms,omitempty"`
	// Reason says who asked: a tenant's move, a node's drain.
	Reason    string    `json:"reason,omitempty"`
	Error     string    `json:"error,omitempty"`
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Done reports whether the move has ended (done or failed).
func (m Move) Done() bool { return m.State == MoveDone || m.State == MoveFailed }

// DrainRequest asks the control plane to move every lease off a node:
// POST /v1/nodes/ID/drain. The node is cordoned first.
type DrainRequest struct {
	// DeadlineSeconds bounds the drain (0: 10 minutes); what has not
	// moved by then is left in place and reported, its borrower told.
	DeadlineSeconds float64 `json:"deadline_seconds,omitempty"`
}

// Drain states.
const (
	DrainRunning    = "draining"
	DrainDone       = "drained"    // the node holds nothing
	DrainIncomplete = "incomplete" // leases left in place (Leases says which and why)
)

// Drain actions for a lease.
const (
	DrainMove    = "move"    // block and memory: moved part by part while used
	DrainReplace = "replace" // accelerator slots of a stateless role: a new slot elsewhere, its role loaded
	DrainLeave   = "leave"   // cannot move: left in place
)

// Drain is a node's drain: GET /v1/nodes/ID/drain.
type Drain struct {
	NodeID     string       `json:"node_id"`
	NodeName   string       `json:"node_name,omitempty"`
	State      string       `json:"state"`
	Deadline   time.Time    `json:"deadline"`
	StartedAt  time.Time    `json:"started_at"`
	FinishedAt time.Time    `json:"finished_at,omitzero"`
	Leases     []DrainLease `json:"leases"`
}

// DrainLease is what a drain does with one lease on the node.
type DrainLease struct {
	LeaseID string `json:"lease_id"`
	Kind    Kind   `json:"kind"`
	Tenant  string `json:"tenant,omitempty"`
	Action  string `json:"action"`
	// State is pending, moving, done or left.
	State string   `json:"state"`
	Moves []string `json:"moves,omitempty"` // the moves' IDs
	// Reason says why a lease was left (or what failed).
	Reason string `json:"reason,omitempty"`
}

// Drain lease states.
const (
	DrainLeasePending = "pending"
	DrainLeaseMoving  = "moving"
	DrainLeaseDone    = "done"
	DrainLeaseLeft    = "left"
)

// RoleConfigRequest asks a lender for the role (and its config) an
// accelerator export serves: POST /agent/v1/role-config, with the agent
// key. The control plane asks it when it re-places a lease's slot on
// another lender (a drain) and hands the answer to the new lender's
// prepare; it never stores, logs or returns it.
type RoleConfigRequest struct {
	LeaseID string `json:"lease_id"`
	Export  string `json:"export"` // the slot's export name (secret)
}

// RoleConfigResponse is the role an accelerator export serves.
type RoleConfigResponse struct {
	Role       string      `json:"role,omitempty"`
	RoleConfig *RoleConfig `json:"role_config,omitempty"`
	Gateway    bool        `json:"gateway,omitempty"`
}
