package placement

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

// Resource kinds.
const (
	KindBlock  = "block"
	KindMemory = "memory"
	KindAccel  = "accel"
	// KindNIC is a lent network interface: capacity, a lease's size and
	// its parts' lengths are rates in bytes/s (docs/nic.md).
	KindNIC = "nic"
)

// Lease modes (the API's lease modes).
const (
	ModeDedicated = "dedicated"
	ModeShared    = "shared"
	ModeComposed  = "composed"
)

// Strategies.
const (
	// Binpack consolidates: among placements that keep every requirement,
	// it prefers devices that already carry leases, leaving empty devices
	// for later tight requests. The default.
	Binpack = "binpack"
	// Spread minimises load: among placements that keep every requirement,
	// it prefers the one with the lowest device utilisation afterwards.
	Spread = "spread"
)

// Node states; "" counts as ready.
const (
	NodeReady   = "ready"
	NodeSuspect = "suspect"
	NodeDown    = "down"
)

// Snapshot is the read-only state placement decides on. IDs must be unique
// within their slice. The caller owns it and must not modify it while a
// Place, Predict or Index built from it is in use.
type Snapshot struct {
	// Now is the snapshot's clock (any epoch, the same as Lease.Deadline's).
	Now      time.Duration
	Nodes    []Node
	Devices  []Device
	Links    []fabric.Link // endpoints are node IDs or switch / PCIe-root IDs
	Leases   []Lease       // running (reserved or active) leases
	Profiles map[string]Profile
	Quotas   map[string]Quota // by tenant; a tenant without one has DefaultQuota
	// DefaultQuota bounds every tenant not in Quotas (zero: unlimited).
	DefaultQuota Quota
	// SlotUnits is how many units of an accel device's capacity make one
	// slot (0 or 1: capacity counts whole slots, and a part is always
	// whole slots). With more, accel capacities, sizes, parts and the
	// Slots quota count shares of a slot: a dedicated or composed part is
	// whole slots (aligned to SlotUnits), and a shared part with a
	// Gateway is at most one slot's worth inside one slot, a slot that is
	// empty or shared only by leases of the same Gateway (docs/placement.md,
	// "Accelerator shares").
	SlotUnits int64
}

// Node is a server that lends or borrows. Only ready nodes ("" or "ready")
// donate; a suspect or down node is never chosen. A Cordoned node
// (`rialto node cordon`, or being drained) gets no new part either, though
// its running leases stay and it may still borrow.
type Node struct {
	ID string
	// Name is what users call the node ("n2"); explanations name it
	// "node n2 (node-…)". "" (or the ID): the ID alone.
	Name     string
	State    string
	Labels   map[string]string
	Cordoned bool
	// Excluded, when set, keeps the node's devices out of this snapshot's
	// placements and says why, as what follows "node ID is" in a
	// rejection ("skipped (it did not confirm the part)"): the control
	// plane's lenders that did not confirm a prepare. Unlike State it does
	// not keep the node from borrowing.
	Excluded string
}

// Device is a lendable resource on a node. Capacity is in bytes for block
// and memory, in slots for accel and in bytes/s for nic (the rate the
// lender lends). Bandwidth is the device's maximum in bytes/s when no
// Profile exists for Model (0: unconstrained; a nic's is its Capacity). Latency is the
// device's own access latency, added to the path latency. Attach is the
// fabric vertex the device hangs off (a PCIe root or switch), default Node.
// A device whose State is neither "" nor "healthy" is never chosen.
// An Exclusive device is lent whole only: it is never shared nor a part of
// a composition, and any lease on it (whatever its mode) holds all of it.
// Roles are the accelerator roles the device can load (nil: not known, any
// role is let through); a request with a Role uses only devices that offer
// it. Name is what users call the device on its node ("disk0"):
// explanations name a named device "n2/disk0 (dev-…)" (its node's name,
// its name, its ID); "" keeps the ID alone.
type Device struct {
	ID        string
	Name      string
	Node      string
	Kind      string
	Model     string
	Capacity  int64
	Bandwidth float64
	Latency   time.Duration
	Attach    string
	State     string
	Exclusive bool
	Roles     []string
}

// Part is one piece of a lease: Length units from Offset on a device.
type Part struct {
	NodeID   string
	DeviceID string
	Offset   int64
	Length   int64
}

// Lease is a running lease. Demand is the rate in bytes/s it would run at
// alone (0: as fast as it can, with no requirement; a nic lease's is then
// the rate its parts hold, which its lenders cap it at). Remaining is the work
// in bytes still to move (0: open-ended). Deadline is absolute on the
// snapshot clock (0: none). A composed lease's rate is striped evenly over
// its parts.
type Lease struct {
	ID        string
	Tenant    string
	Kind      string
	Borrower  string
	Mode      string
	Parts     []Part
	Demand    float64
	Remaining int64
	Deadline  time.Duration
	// Gateway is a shared accel lease's gateway key (with
	// Snapshot.SlotUnits > 1): its share's slot serves that gateway only.
	Gateway string
}

// Profile is a device model's characterization: Delivered[i] is the
// aggregate bandwidth in bytes/s the device delivers with i+1 concurrent
// streams (leases); beyond the table the last entry holds. With no table the
// device delivers MaxBandwidth at any concurrency. SMUFINProfile is the
// calibration of the NVMe device of the NVMe-oF genomics paper (Call et
// al.).
type Profile struct {
	Model        string
	MaxBandwidth float64
	Delivered    []float64
	Latency      time.Duration
}

// Quota bounds a tenant's running leases; zero fields are unlimited. Bytes
// counts block and memory capacity held (a dedicated device counts whole),
// Slots counts accel capacity in the snapshot's units (whole slots, or
// shares of a slot with Snapshot.SlotUnits > 1), Bandwidth sums lease demands in bytes/s (a nic
// lease's is the rate it holds).
type Quota struct {
	Leases    int
	Bytes     int64
	Slots     int64
	Bandwidth float64
}

// Request asks for one lease.
type Request struct {
	Kind     string // block, memory, accel or nic
	Size     int64  // bytes (block, memory), slots (accel) or bytes/s (nic); > 0 unless Whole
	Borrower string // node ID of the borrower
	// BorrowerName is how explanations name the borrower ("": Borrower),
	// for a caller that places a borrower it does not know at a stand-in
	// vertex (the control plane places an unnamed borrower at its own).
	BorrowerName string

	// Whole asks for an entire unused device, dedicated: Size is then the
	// least capacity it must have (0: any). Mode must be "" or dedicated.
	Whole bool
	// Exact keeps a sized request from holding more than Size: it is
	// dedicated a whole device only when the device's capacity is exactly
	// Size (the control plane's accel slot leases, which must not take a
	// four-slot device for one slot). A sized nic request is always exact:
	// a lease holds the rate it asks for, which its lenders cap it at.
	Exact bool

	// Bandwidth is the rate in bytes/s the workload would run at alone
	// (0: as fast as it can). Without a deadline, placement avoids slowing
	// it below this rate; with one, only the deadline binds.
	Bandwidth float64
	// MaxLatency bounds path plus device latency (0: none).
	MaxLatency time.Duration
	// Work is the bytes to move, for completion times (0: open-ended).
	Work int64
	// Deadline is relative to Snapshot.Now (0: none); it needs Work.
	Deadline time.Duration

	// Mode forces a mode ("": choose among dedicated and, when allowed,
	// shared and composed). Width forces the number of devices of a
	// composed lease (0: choose, up to MaxWidth). A composed nic lease (a
	// bond) has its parts on as many different lenders, never two on one.
	Mode         string
	Width        int
	AllowShare   bool
	AllowCompose bool
	// StripeUnit is the stripe unit a composed lease's volume will use (0:
	// none): each part's length is a multiple of it, so that the striped
	// volume, which uses whole stripes only, still holds Size bytes.
	StripeUnit int64

	// Affinity: when non-empty, donors must match at least one term;
	// AntiAffinity: donors must match none. A term is a node ID or
	// "label=value" against Node.Labels.
	Affinity, AntiAffinity []string
	// Labels is a selector: the donor node must carry every label with
	// the given value.
	Labels map[string]string
	// Devices pins the request: when non-empty, only these devices (by
	// ID) are candidates.
	Devices []string

	Tenant   string
	Strategy string // binpack (default) or spread

	// Gateway is the gateway key of a shared accel request (with
	// Snapshot.SlotUnits > 1): its part of at most one slot's units lies
	// inside one slot that is empty or shared only by leases of the same
	// Gateway. Without it an accel request takes whole slots.
	Gateway string
	// Role is the accelerator role the lease loads ("": none): only
	// devices whose Roles list it (or that list none) are candidates.
	Role string
}

// MaxWidth is the widest composition placement considers on its own.
const MaxWidth = 4

// Plan is a placement decision.
type Plan struct {
	Mode  string
	Parts []Part
	// Hops and Latency are the worst over the parts (path + device).
	Hops    int
	Latency time.Duration
	// PredictedBandwidth is the new lease's rate in bytes/s (+Inf when
	// nothing bounds it); PredictedCompletion the time from Now to move
	// Work (0 when Work is 0).
	PredictedBandwidth  float64
	PredictedCompletion time.Duration
	// Impacts lists running leases whose rate the plan lowers, by LeaseID.
	Impacts     []Impact
	Explanation []string
}

// Impact is a running lease slowed by a plan. Completions are from Now
// (0 for open-ended leases). Kind is the lease's (its rates print as its
// kind's do: a nic's as link rates).
type Impact struct {
	LeaseID          string
	Kind             string
	BandwidthBefore  float64
	BandwidthAfter   float64
	CompletionBefore time.Duration
	CompletionAfter  time.Duration
	MissesDeadline   bool // only after the plan
}

// String is a one-line summary.
func (p Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", p.Mode)
	for _, pt := range p.Parts {
		fmt.Fprintf(&b, " %s/%s[%d+%d]", pt.NodeID, pt.DeviceID, pt.Offset, pt.Length)
	}
	return b.String()
}

// ErrInfeasible is matched (errors.Is) by every InfeasibleError.
var ErrInfeasible = errors.New("placement: infeasible")

// ErrInvalid reports a malformed request.
var ErrInvalid = errors.New("placement: invalid request")

// Constraint names used in InfeasibleError.
const (
	ConstraintBorrower  = "borrower"  // borrower unknown or not ready
	ConstraintKind      = "kind"      // no device of that kind
	ConstraintNode      = "node"      // donor node suspect or down
	ConstraintCordon    = "cordon"    // donor node cordoned (or being drained)
	ConstraintHealth    = "health"    // device unhealthy
	ConstraintCapacity  = "capacity"  // not enough free space / slots
	ConstraintLatency   = "latency"   // path + device latency above MaxLatency
	ConstraintAffinity  = "affinity"  // affinity or anti-affinity
	ConstraintLabels    = "labels"    // donor node lacks a selected label
	ConstraintPin       = "pin"       // a pinned device that does not exist or is of another kind
	ConstraintExclusive = "exclusive" // exclusive device asked for a part (shared or composed)
	ConstraintReach     = "reach"     // no fabric path
	ConstraintMode      = "mode"      // the mode asked for is impossible
	ConstraintRole      = "role"      // the device does not offer the accelerator role asked for
	ConstraintQuota     = "quota"     // tenant quota
	ConstraintDeadline  = "deadline"  // no placement meets the deadline
)

// Rejection says why a candidate (a device, or an option such as
// "composed n1/d1+n2/d2") was not chosen. Candidate is by ID (a device
// ID, or the option with node and device IDs); Name is how explanations
// name it, with the names users know ("n2/disk0 (dev-…)"; "": Candidate).
type Rejection struct {
	Candidate  string
	Name       string
	Constraint string
	Reason     string
}

// Text is how explanations name the rejected candidate: Name, or
// Candidate without one.
func (r Rejection) Text() string {
	if r.Name != "" {
		return r.Name
	}
	return r.Candidate
}

// InfeasibleError explains a request that cannot be placed. Constraint is
// the one that rejected the most candidates (or the request itself);
// Rejections lists candidates nearest first, at most MaxRejections, and
// Omitted counts the rest.
type InfeasibleError struct {
	Constraint string
	Detail     string
	Rejections []Rejection
	Omitted    int
}

// MaxRejections bounds InfeasibleError.Rejections.
const MaxRejections = 32

func (e *InfeasibleError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "placement: infeasible: %s", e.Constraint)
	if e.Detail != "" {
		fmt.Fprintf(&b, ": %s", e.Detail)
	}
	if e.Constraint == ConstraintRole && e.Omitted == 0 && !slices.ContainsFunc(e.Rejections, func(r Rejection) bool { return r.Constraint != ConstraintRole }) {
		return b.String() // the detail names the role and the roles offered; each device would say it again
	}
	for i, r := range e.Rejections {
		if i == 3 {
			fmt.Fprintf(&b, "; … %d more", len(e.Rejections)-3+e.Omitted)
			break
		}
		fmt.Fprintf(&b, "; %s: %s", r.Text(), r.Reason)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrInfeasible) true.
func (e *InfeasibleError) Is(target error) bool { return target == ErrInfeasible }

func newInfeasible(detail string, rej []Rejection, constraint string) *InfeasibleError {
	e := &InfeasibleError{Constraint: constraint, Detail: detail}
	if constraint == "" {
		counts := map[string]int{}
		for _, r := range rej {
			counts[r.Constraint]++
		}
		best := -1
		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if counts[k] > best {
				best, e.Constraint = counts[k], k
			}
		}
		if e.Constraint == "" {
			e.Constraint = ConstraintKind
		}
	}
	if len(rej) > MaxRejections {
		e.Omitted = len(rej) - MaxRejections
		rej = rej[:MaxRejections]
	}
	e.Rejections = rej
	return e
}
