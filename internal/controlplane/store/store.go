package store

import (
	"context"
	"errors"
	"time"

	"github.com/rialto-project/rialto/api"
)

// Sentinel errors. Implementations wrap them with %w.
var (
	ErrNotFound  = errors.New("store: not found")
	ErrConflict  = errors.New("store: state changed concurrently")
	ErrCapacity  = errors.New("store: device capacity exhausted")
	ErrDuplicate = errors.New("store: idempotency key already used")
	// ErrQuota: a lease creation would take its tenant past its Limit.
	ErrQuota = errors.New("store: tenant quota exceeded")
	// ErrUnavailable: the database cannot be reached (or refused the
	// work for want of resources); nothing was written, or, for a write
	// cut off at its commit, the caller cannot tell. The control plane
	// answers 503, so that clients fail over to another replica.
	ErrUnavailable = errors.New("store: database unavailable")
	// ErrCorrupt: the database is damaged (SQLite found malformed pages;
	// PostgreSQL a damaged table or index page: SQLSTATE XX001, XX002);
	// it must be restored from a backup (a damaged PostgreSQL index may
	// be rebuilt instead).
	ErrCorrupt = errors.New("store: database damaged")
)

// Token kinds.
const (
	TokenBootstrap = "bootstrap"
	TokenTenant    = "tenant"
)

// Token is an API token as stored: only the hash of the secret is kept.
type Token struct {
	Hash      string // resource.HashSecret of the token
	Kind      string // TokenBootstrap or TokenTenant
	Tenant    string
	Admin     bool
	CreatedAt time.Time
}

// JoinNode is an agent's registration. On a rejoin (same
// Node.Fingerprint.MachineID) the stored node keeps its ID and its devices
// keep theirs (matched by name); devices no longer reported become
// "unavailable".
//
// A rejoin takes the node over (its credential and agent key replaced)
// only when the join proves it is the node's agent, by ProofHash or
// ProofNodeID (JoinedProven), or when the node is not live: down or
// removed (JoinedTakeover). Otherwise nothing is written and JoinNode
// returns a *NodeLive error (errors.Is ErrConflict).
type JoinNode struct {
	Node           api.Node // ID is used only for a new node
	CredentialHash string
	AgentKey       string
	Devices        []api.DeviceSpec
	// ProofHash is the hash (resource.HashSecret) of the node credential
	// the join presented, "" for none: it proves the join is the node's
	// when it is the stored credential's hash, or the hash the node's
	// last proven join presented (that join's answer may never have
	// reached its agent's state directory: it crashed before writing it,
	// or the answer was lost on the way), until a heartbeat of the node
	// later than that join is recorded (its agent holds the answer) or
	// the node is taken over or removed.
	ProofHash string
	// EarlierProofHashes are the hashes of the credentials earlier joins
	// issued to the agent, which the join presented too: each proves the
	// join as ProofHash does (the node's stored credential, or the one
	// its last proven join presented). A database restored from a backup
	// holds a credential issued before the backup, which the agent
	// replaced since. A credential replaced by a takeover or a removal
	// matches neither any more.
	EarlierProofHashes []string
	// ProofNodeID is the node a valid, unrevoked client certificate of
	// the join's connection names, "" for none: it proves the join is
	// that node's, unless the node is removed (its removal revoked its
	// certificates; one that it missed proves nothing).
	ProofNodeID string
}

// Joined says how JoinNode registered a node.
type Joined int

// How a node joined.
const (
	// JoinedNew: the machine ID was not known; a new node.
	JoinedNew Joined = iota
	// JoinedProven: the machine's node, whose credential or certificate
	// the join presented (an agent restarted with its state).
	JoinedProven
	// JoinedTakeover: the machine's node, down or removed, taken over by
	// a join without its credential (an agent that lost its state, or
	// another machine claiming its machine ID).
	JoinedTakeover
)

// Rejoined reports whether the machine ID was known.
func (j Joined) Rejoined() bool { return j != JoinedNew }

// NodeLive is JoinNode's refusal of a join of a known machine ID that
// proves nothing while its node is live (ready or suspect).
type NodeLive struct {
	MachineID string
	Node      api.Node // ID, Name and State
}

func (e *NodeLive) Error() string {
	return "machine " + e.MachineID + " is node " + e.Node.ID + " (" + e.Node.Name + "), which is " + string(e.Node.State) +
		": a join without its credential is accepted once it is down or removed"
}

// Unwrap makes a NodeLive an ErrConflict.
func (e *NodeLive) Unwrap() error { return ErrConflict }

// Beat is one heartbeat to record.
type Beat struct {
	NodeID string
	At     time.Time
	Health string
	Links  []api.Link
	// Wiping are the leases the node's lender reports being wiped (its
	// heartbeat's list), recorded on the node (see Wiper.ClearWipes).
	Wiping []string
}

// NodeRecord is a node with the secret the control plane presents to its
// agent.
type NodeRecord struct {
	api.Node
	AgentKey string
}

// Idempotency records a lease-creation key.
type Idempotency struct {
	Tenant      string
	Key         string
	RequestHash string
}

// LeaseChange is a compare-and-set transition of a lease.
type LeaseChange struct {
	From      []api.LeaseState // the lease must be in one of these states
	To        api.LeaseState
	Reason    string    // replaces the reason when non-empty
	URIs      []string  // when non-nil, the parts' URIs, in part order
	URI       string    // replaces the lease URI when non-empty
	ExpiresAt time.Time // replaces the expiry when non-zero
	TTL       int64     // replaces ttl_seconds when non-zero
	Plan      *api.Plan // replaces the plan when non-nil
	// LostParts are parts (indexes) the lease goes on without: each is
	// marked api.PartLost and its range freed (its lease_parts row no
	// longer live), in the same write.
	LostParts []int
	At        time.Time // updated_at
	// Tenant, when non-empty, is a further condition: a lease of another
	// tenant is not found (ErrNotFound).
	Tenant string
	// ExpiredBy, when non-zero, is a further condition: the lease's
	// expires_at is before it (else ErrConflict). An expiry decided on a
	// lease read before a renewal does not end the renewed lease.
	ExpiredBy time.Time
}

// LeaseFilter selects leases; zero fields do not filter.
type LeaseFilter struct {
	Tenant string
	Kind   api.Kind // leases of this kind
	NodeID string   // leases with a live part on this node
	// NodeStates, when set, keeps the leases with a live part on a node
	// in one of these states.
	NodeStates    []api.NodeState
	States        []api.LeaseState
	IDs           []string
	ExpiresBefore time.Time // expires_at < ExpiresBefore
	// After, when non-zero, keeps the leases after it in the listing's
	// order (created_at, then ID): a page's cursor (api.LeaseCursor).
	After api.Cursor
	// Limit, when positive, returns at most this many leases.
	Limit int
}

// Demand is what a lease's request asked of its devices, kept so that
// placement can predict how a new lease slows the running ones.
type Demand struct {
	Bandwidth float64   // bytes/s the workload runs at alone (0: as fast as it can)
	Work      int64     // bytes to move (0: open-ended)
	Deadline  time.Time // completion deadline (zero: none)
	// Gateway is a shared accel lease's gateway key (a digest of its role
	// and role config, never the config): placement puts a share only on
	// a slot empty or held by leases of the same key (docs/accelerators.md).
	Gateway string
}

// LivePart is a part of a non-terminal lease, as placement needs it.
type LivePart struct {
	api.Part
	LeaseID string
	Mode    api.Mode
	Tenant  string
	Demand  Demand // the lease's, repeated on each of its parts
}

// Inventory is a consistent read of what placement needs.
type Inventory struct {
	Nodes   []api.Node
	Devices []api.Device
	Parts   []LivePart
	Links   []api.Link
	// Profiles are the stored device profiles; a store's Inventory may
	// leave them out (the server reads them with Profiles).
	Profiles []api.Profile
}

// Counts are objects by state, for metrics.
type Counts struct {
	Nodes  map[api.NodeState]int
	Leases map[api.LeaseState]int
}

// Store is the control plane's persistence. Every method that writes takes
// the event to append in the same transaction (Event.ID and, when zero,
// Event.At are filled in by the store).
type Store interface {
	Close() error

	PutToken(ctx context.Context, t Token) error
	LookupToken(ctx context.Context, hash string) (Token, error)

	// JoinNode registers or re-registers a node; how says whether the
	// machine ID was known and the join proved it is the node's (see
	// JoinNode). A join that may not take over a live node writes
	// nothing and returns a *NodeLive.
	JoinNode(ctx context.Context, j JoinNode, ev api.Event) (n api.Node, how Joined, err error)
	// NodeByCredential returns the node whose credential hash matches.
	NodeByCredential(ctx context.Context, credHash string) (api.Node, error)
	// Heartbeat records liveness and links; it moves the node to ready and
	// returns its previous state. A removed node stays removed: its
	// heartbeat writes nothing (no state, time, links or event) and is
	// refused with ErrNotFound, checked in the write's own transaction,
	// so that a heartbeat in flight (or kept in memory) on any replica
	// when the node was removed cannot bring it back; only JoinNode does.
	Heartbeat(ctx context.Context, nodeID string, at time.Time, health string, links []api.Link) (prev api.NodeState, err error)
	// Heartbeats records many heartbeats in one transaction (group
	// commit); prev[i] and errs[i] are Heartbeat's answers for beats[i].
	// err is set only when the transaction itself failed.
	Heartbeats(ctx context.Context, beats []Beat) (prev []api.NodeState, errs []error, err error)
	// SetNodeState moves a node from one state to another (ErrConflict if
	// it is not in from).
	SetNodeState(ctx context.Context, id string, from, to api.NodeState, ev api.Event) error
	Node(ctx context.Context, id string) (NodeRecord, error)
	Nodes(ctx context.Context) ([]api.Node, error)
	Devices(ctx context.Context) ([]api.Device, error)
	Links(ctx context.Context) ([]api.Link, error)
	Inventory(ctx context.Context) (Inventory, error)

	// CreateLease inserts a lease with its parts, atomically checking that
	// every part fits its device (device available, node ready, inside the
	// capacity, no overlap with a live part): ErrCapacity otherwise. With a
	// non-nil idem, an existing (tenant, key) gives ErrDuplicate. d is the
	// request's demand, returned with the lease's live parts.
	CreateLease(ctx context.Context, l api.Lease, d Demand, idem *Idempotency, ev api.Event) (api.Lease, error)
	// ReplaceParts frees a non-terminal lease's parts and reserves new ones
	// with the same checks as CreateLease; the lease becomes reserved.
	ReplaceParts(ctx context.Context, id string, parts []api.Part, plan *api.Plan, at time.Time, ev api.Event) (api.Lease, error)
	// TransitionLease applies ch if the lease is in one of ch.From
	// (ErrConflict otherwise). A move to a terminal state frees the parts.
	TransitionLease(ctx context.Context, id string, ch LeaseChange, ev api.Event) (api.Lease, error)
	Lease(ctx context.Context, id string) (api.Lease, error)
	Leases(ctx context.Context, f LeaseFilter) ([]api.Lease, error)
	// LeaseByIdempotencyKey returns the lease and request hash recorded
	// for (tenant, key).
	LeaseByIdempotencyKey(ctx context.Context, tenant, key string) (api.Lease, string, error)

	PutProfile(ctx context.Context, p api.Profile, ev api.Event) (api.Profile, error)
	Profiles(ctx context.Context) ([]api.Profile, error)

	AppendEvent(ctx context.Context, ev api.Event) (api.Event, error)
	// Events returns up to limit events with ID > since, oldest first.
	// A tenant, if given, sees only the events of its own leases and those
	// of no lease (nodes, profiles).
	Events(ctx context.Context, since int64, limit int, tenant string) ([]api.Event, error)

	Counts(ctx context.Context) (Counts, error)
}

// MoveRecord is a lease part moving to another lender, as stored:
// Committed once the lease points at the destination (the source may
// not have let go yet).
type MoveRecord struct {
	api.Move
	Committed bool
}

// MoveFilter selects moves; zero fields do not filter.
type MoveFilter struct {
	LeaseID string
	Open    bool // only moves not done or failed
	// Since keeps the moves that started or changed at or after it.
	Since time.Time
}

// Mover is the store's part in moving leases and draining nodes
// (docs/operations.md, "Moving leases and draining nodes"). Every method
// that writes takes the event to append in the same transaction.
type Mover interface {
	// SetNodeCordon marks a node cordoned (placement gives it no new
	// part) or not.
	SetNodeCordon(ctx context.Context, id string, cordoned bool, ev api.Event) (api.Node, error)
	// BeginMove records an open move of part m.Part of an active lease
	// whose part is still m.From (ErrConflict otherwise, and if the part
	// already moves) and reserves its destination m.To with CreateLease's
	// checks (ErrCapacity).
	BeginMove(ctx context.Context, m api.Move, ev api.Event) error
	// FinishMove makes an open move's destination the part, with uri, if
	// the lease is still active (ErrConflict otherwise): the source range
	// is freed, the move committed. It returns the lease.
	FinishMove(ctx context.Context, id, uri string, at time.Time, ev api.Event) (api.Lease, error)
	// AdoptPart makes what a lender holds the part m.Part of an active
	// lease at once, with uri: the part, still at m.From (ErrConflict
	// otherwise, and if it moves), becomes m.To, checked as BeginMove
	// checks a destination (ErrCapacity), a cordoned node accepted (the
	// bytes are there already); m.From's range is freed and m recorded
	// as a move done. The control plane adopts a part its recorded
	// lender does not serve, which another holds (a database restored
	// from a backup taken before the part moved). It returns the lease.
	AdoptPart(ctx context.Context, m api.Move, uri string, ev api.Event) (api.Lease, error)
	// EndMove records the end of a move: state done or failed (with
	// errMsg), copied bytes. A failed move that did not commit frees its
	// destination. ev may be nil.
	EndMove(ctx context.Context, id, state, errMsg string, copied int64, at time.Time, ev *api.Event) error
	// SetMoveState records an open move's state and progress.
	SetMoveState(ctx context.Context, id, state string, copied int64, at time.Time) error
	Moves(ctx context.Context, f MoveFilter) ([]MoveRecord, error)
}

// Transition is one lease transition of a batch (see LeaseBatcher).
type Transition struct {
	ID     string
	Change LeaseChange
	Event  api.Event
}

// NewLease is a lease creation of a batch (see LeaseBatcher): CreateLease's
// arguments, and the tenant's limit.
type NewLease struct {
	Lease  api.Lease
	Demand Demand
	Idem   *Idempotency
	Event  api.Event
	// Limit, when non-nil, is the tenant's quota, re-checked atomically
	// with the insertion by a store that several control-plane replicas
	// share (ErrQuota). A store with one writer process may leave it to
	// placement, whose view is then exact.
	Limit *Limit
}

// Limit bounds a tenant's non-terminal leases (placement's Quota, as the
// store counts it: a part of a dedicated block or memory lease charges
// its device's whole capacity, any other part its length; accel parts
// count as slots, the others as bytes). Zero fields are unlimited.
type Limit struct {
	Leases    int
	Bytes     int64
	Slots     int64
	Bandwidth float64
}

// Leader is an optional Store capability of a store that several
// control-plane replicas share: an election, through the database, of the
// one replica that runs the background duties (sweeps). Campaign blocks
// until this replica leads, or ctx ends; it then returns a context that
// is cancelled when the leadership is lost (the database session that
// holds it ended), and a function that resigns. Only one replica leads at
// a time.
type Leader interface {
	Campaign(ctx context.Context) (lead context.Context, resign func(), err error)
}

// Broadcaster is an optional Store capability of a store that several
// control-plane replicas share: messages to every replica at once
// (PostgreSQL's NOTIFY). Broadcast sends msg (at most 7,000 bytes) to
// every replica listening when it commits. Listen calls ready once it
// listens, then fn for every message broadcast (its own too), one at a
// time and in the order they were sent, until ctx ends or the connection
// fails (its error); a replica listens again after a failure and must
// take what it may have missed meanwhile for lost.
type Broadcaster interface {
	Broadcast(ctx context.Context, msg string) error
	Listen(ctx context.Context, ready func(), fn func(msg string)) error
}

// Pinger is an optional Store capability: Ping reports whether the
// database answers (ErrUnavailable otherwise).
type Pinger interface {
	Ping(ctx context.Context) error
}

// LeaseOp is one write of a batch: a creation when Create is non-nil,
// otherwise Transition.
type LeaseOp struct {
	Create     *NewLease
	Transition Transition
}

// LeaseBatcher is an optional Store capability: several lease creations
// and transitions in one write transaction (group commit), each applied as
// CreateLease or TransitionLease would, in order (a later op sees the
// earlier ones), and independently of the others (errs[i] is op i's
// error; a failed op leaves no trace). err is set, and nothing committed,
// when the batch itself fails. The batch is durable, like a single write,
// when the call returns.
type LeaseBatcher interface {
	LeaseOps(ctx context.Context, ops []LeaseOp) (out []api.Lease, errs []error, err error)
}

// Pruned is what one Prune removed.
type Pruned struct {
	Leases int
	Events int
	// EventsThrough is the greatest event ID pruned so far (by this call
	// or an earlier one): see Pruner.PrunedEvents.
	EventsThrough int64
}

// Pruner is an optional Store capability: forgetting history (the
// server's retention, docs/operations.md "History retention").
type Pruner interface {
	// Prune deletes, in one write transaction, at most limit leases and
	// limit events:
	//   - leases in a terminal state whose last change (updated_at) is
	//     before before, that hold no live part (a move's destination
	//     included) and have no open move, with their parts, plan,
	//     idempotency key and moves;
	//   - events appended before before: the oldest ones, up to (not
	//     including) the first event at or after before, and never the
	//     newest event (event IDs only grow).
	// A live lease, or one still tearing down (releasing), is never
	// pruned. The greatest pruned event ID is recorded in the same
	// transaction.
	Prune(ctx context.Context, before time.Time, limit int) (Pruned, error)
	// PrunedEvents returns the greatest event ID ever pruned (0: none):
	// a reader whose cursor is below it may have missed events.
	PrunedEvents(ctx context.Context) (int64, error)
}

// NodeRemover is implemented by stores that can retire a node (an
// optional capability): RemoveNode moves it to api.NodeRemoved, replaces
// its credential hash with one no token hashes to (so that its credential
// stops working), makes its devices unavailable and forgets its links and
// its ranges being wiped (Wiper), in
// one transaction with ev. ErrNotFound for an unknown node. The node's
// leases are the caller's (they are lost through the lease state machine
// first); a later join of the same machine brings it back.
//
// The store also keeps the serial numbers (hex) of the node certificates
// the removal revoked, for whichever replica later calls the removed
// node's agent (which presents one of them): RemoveNode records revoked
// in its transaction, and returns the generation of the node's removal
// record (RemovalRecord.Gen); AddRemovalRevoked adds those revoked after
// its commit while the node is still removed and its record is still of
// generation gen (a no-op otherwise: the node joined again since);
// RemovalRevoked returns the record of the node's removals since its
// last join while it is removed, no serials once a join brought it back
// (a join forgets them, and raises the generation). ErrNotFound for an
// unknown node. UnrecordedRemovalRevoked returns, for every removed node
// that has them, the serials of the certificates recorded as issued to it
// (Revocations.RecordIssued, its ID their common name) that are revoked,
// not expired off the list, and that its removal record does not name,
// with that record's generation: those a removal revoked after its commit
// whose AddRemovalRevoked the store failed, and that the replica holding
// them forgot in a restart (none from a store without Revocations).
// UnrevokedRemoved returns, for every removed node that has them, the
// serials of the certificates recorded as issued to it that expire after
// at and that no revocation names (neither on the list nor expired off
// it), read in one snapshot with the nodes' states, with the generation
// of the node's removal record: those a renewal signed during a removal
// that the removal's second pass, after its commit, did not revoke (the
// replica removing the node stopped first). A certificate a join issues
// is recorded once the join committed, the node no longer removed: never
// one of them (none from a store without Revocations).
type NodeRemover interface {
	RemoveNode(ctx context.Context, id string, revoked []string, ev api.Event) (api.Node, int64, error)
	AddRemovalRevoked(ctx context.Context, id string, gen int64, revoked []string) error
	RemovalRevoked(ctx context.Context, id string) (RemovalRecord, error)
	UnrecordedRemovalRevoked(ctx context.Context) (map[string]RemovalRecord, error)
	UnrevokedRemoved(ctx context.Context, at time.Time) (map[string]UnrevokedCerts, error)
}

// UnrevokedCerts are the certificates issued to a removed node that no
// revocation names (NodeRemover.UnrevokedRemoved).
type UnrevokedCerts struct {
	// Gen is the generation of the node's removal record (RemovalRecord).
	Gen int64
	// Serials are the certificates' serial numbers (hex).
	Serials []string
}

// RemovalRecord is what a store keeps of a removed node's removals since
// its last join (NodeRemover).
type RemovalRecord struct {
	// Gen tells the records of one node apart: every join raises it.
	Gen int64
	// Revoked are the serials (hex) the removals revoked; none for a
	// node that is not removed.
	Revoked []string
}

// Revocations is an optional Store capability: the cluster CA's
// revocation list, kept in the store so that control-plane replicas each
// holding a copy of the CA directory agree on it (docs/operations.md,
// "Revocation across replicas"). Serial numbers are hex.
type Revocations interface {
	// RecordIssued records a certificate the CA issued (serial, common
	// name: a node's ID, expiry), so that any replica can revoke it by
	// its common name. The records of certificates expired before now
	// are forgotten (the control plane gives its time less the grace
	// its revocation list keeps expired certificates for).
	RecordIssued(ctx context.Context, serial, commonName string, notAfter, now time.Time) error
	// Revoke revokes certs and every certificate recorded as issued to
	// commonName ("": none) that expires after expiresAfter (the control
	// plane gives its time less the grace its revocation list keeps
	// expired certificates for, as to UnrevokedRemoved: a peer whose
	// clock is behind by less still accepts those), as revoked at at,
	// and returns those it revoked that were not revoked already
	// (added), and every serial it named (named: certs' and commonName's, revoked already or now). A
	// call that revoked any raises the list's number by one, or to
	// minNumber if that is higher (a CA directory whose own list has a
	// number as high records what it revokes under one above it at once,
	// never under its own list's number: RaiseRevocationNumber). Each is
	// recorded with its certificate's expiry (ExpireRevoked): the one
	// recorded with its issue (RecordIssued), or else the one certs
	// gives. A serial revoked already whose expiry the store does not
	// know (RevocationList.NoExpiry) takes it so: it is not revoked
	// again, and the list's number stays.
	Revoke(ctx context.Context, certs []RevokedCert, commonName string, expiresAfter, at time.Time, minNumber int64) (added, named []string, err error)
	// RevocationList returns the serials revoked and the list's number,
	// as one snapshot: every replica signs the same entries with the same
	// number.
	RevocationList(ctx context.Context) (RevocationList, error)
	// RaiseRevocationNumber makes the list's number at least min (a CA
	// directory whose own list has a higher one: written before the store
	// kept the list, or by `rialto ca`).
	RaiseRevocationNumber(ctx context.Context, min int64) error
	// ExpireRevoked drops from the list the serials whose certificates
	// expired before before (their expiry known: recorded as issued when
	// they were revoked, or given to Revoke; those of unknown expiry
	// stay), raising the
	// list's number by one if it dropped any, and returns how many it
	// dropped. They stay recorded as expired (RevocationList.Expired),
	// and a later Revoke of one of them leaves it so. A certificate
	// expired is refused by every check of a peer, which verifies its
	// validity period.
	ExpireRevoked(ctx context.Context, before time.Time) (int, error)
}

// RevokedCert is a certificate to revoke (Revocations.Revoke): its
// serial number (hex) and its expiry, which the list drops it after
// (ExpireRevoked). A zero NotAfter is an expiry unknown: unless its issue
// was recorded, the serial stays on the list until a later Revoke gives
// it one (RevocationList.NoExpiry).
type RevokedCert struct {
	Serial   string
	NotAfter time.Time
}

// RevocationList is the store's revocation list (Revocations).
type RevocationList struct {
	Number  int64
	Revoked map[string]time.Time // serial → when it was revoked
	// Expired are the serials dropped from the list because their
	// certificates expired (ExpireRevoked).
	Expired map[string]bool
	// NoExpiry are the serials of Revoked whose certificates' expiry the
	// store does not know (revoked by a version before it recorded
	// expiries, their issue not recorded): they stay on the list until
	// a Revoke gives them one.
	NoExpiry []string
}

// Wipe is the block ranges of one lease on one node that the node's
// lender is wiping (docs/placement.md, "Ranges being wiped"). LeaseID may
// also name a range a lender refused as being wiped after a lease the
// control plane did not know (its prefix "refused/").
type Wipe struct {
	LeaseID string
	NodeID  string
	Parts   []api.Part
	Mode    api.Mode  // the lease's
	At      time.Time // when the mark was written
}

// Wiper is an optional Store capability: the block ranges being wiped,
// kept in the store so that every replica of a shared store sees them.
// A range being wiped is refused to a new part (ErrCapacity), as a live
// part's range is.
type Wiper interface {
	// MarkWiping records ranges being wiped, at the time given; those
	// already recorded (lease, node) take that time: a lender told again
	// to tear a lease down is given settle again (ClearWipes).
	MarkWiping(ctx context.Context, ws []Wipe) error
	// Unwipe forgets lease id's ranges on node: its lender confirmed
	// their wipe.
	Unwipe(ctx context.Context, leaseID, nodeID string) error
	// Wipes returns every range recorded as being wiped.
	Wipes(ctx context.Context) ([]Wipe, error)
	// ClearWipes forgets the ranges whose node's last recorded heartbeat
	// (Beat.Wiping), received more than settle after the mark was
	// written, no longer lists their lease as being wiped (a refused
	// range: lists none). A join is no such heartbeat: the marks of a
	// node that joined again stay until a heartbeat of it is recorded.
	// It returns how many marks it forgot.
	ClearWipes(ctx context.Context, settle time.Duration) (int, error)
}
