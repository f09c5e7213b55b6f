package api

import (
	"fmt"
	"strings"
	"time"
)

// NodeState is a node's liveness as seen by the control plane.
type NodeState string

// Node states.
const (
	NodeReady   NodeState = "ready"   // heartbeating
	NodeSuspect NodeState = "suspect" // missed heartbeats, within the grace period
	NodeDown    NodeState = "down"    // missed heartbeats past the grace period; its leases are lost
	// NodeRemoved: an administrator removed the node (DELETE
	// /v1/nodes/{id}): its leases are lost, its certificates revoked, its
	// credential forgotten. Its machine may join again as the same node,
	// with the bootstrap token.
	NodeRemoved NodeState = "removed"
)

// Kind is a resource kind.
type Kind string

// Resource kinds.
const (
	KindBlock  Kind = "block"
	KindMemory Kind = "memory"
	KindAccel  Kind = "accel"
	KindNIC    Kind = "nic"
)

// Kinds are the resource kinds the control plane accepts, in the order
// messages list them: the one list the server's checks and the CLI's
// messages use.
var Kinds = []Kind{KindBlock, KindMemory, KindAccel, KindNIC}

// KindNames lists Kinds for messages: "block, memory, accel or nic".
func KindNames() string {
	var b strings.Builder
	for i, k := range Kinds {
		switch {
		case i == len(Kinds)-1 && i > 0:
			b.WriteString(" or ")
		case i > 0:
			b.WriteString(", ")
		}
		b.WriteString(string(k))
	}
	return b.String()
}

// Article is the indefinite article messages put before the kind's name:
// "an accel lease", "a block lease".
func (k Kind) Article() string {
	if k != "" && strings.IndexByte("aeiou", k[0]) >= 0 {
		return "an"
	}
	return "a"
}

// Valid reports whether k is one of Kinds.
func (k Kind) Valid() bool {
	for _, v := range Kinds {
		if k == v {
			return true
		}
	}
	return false
}

// LeaseState is a lease's place in its lifecycle:
// requested → reserved → active → releasing → released, or failed, lost, expired.
type LeaseState string

// Lease states.
const (
	LeaseRequested LeaseState = "requested"
	LeaseReserved  LeaseState = "reserved"
	LeaseActive    LeaseState = "active"
	LeaseReleasing LeaseState = "releasing"
	LeaseReleased  LeaseState = "released"
	LeaseFailed    LeaseState = "failed"
	LeaseLost      LeaseState = "lost"
	LeaseExpired   LeaseState = "expired"
)

// Terminal reports whether no further transition can happen.
func (s LeaseState) Terminal() bool {
	switch s {
	case LeaseReleased, LeaseFailed, LeaseLost, LeaseExpired:
		return true
	}
	return false
}

// Mode is how a lease uses its devices.
type Mode string

// Lease modes.
const (
	ModeDedicated Mode = "dedicated" // a whole device, exclusively; accel: slots of its own, exclusively
	ModeShared    Mode = "shared"    // a partition of a device others also use; accel: use through the lender's gateway
	ModeComposed  Mode = "composed"  // N devices striped into one
)

// Modes are the lease modes a request may name (none: placement chooses).
var Modes = []Mode{ModeDedicated, ModeShared, ModeComposed}

// HealthUnknown is the health of a node that is not ready: its agent's
// last report is not current (Node.LastHealth keeps it).
const HealthUnknown = "unknown"

// Fingerprint is what an agent found on its host.
type Fingerprint struct {
	// MachineID is the hardware identity a rejoin is matched by (a join
	// takes over the machine's node with the node's credential, or while
	// it is down or removed). Shown only to admins and in the node's own
	// answers: empty for other tokens.
	MachineID    string   `json:"machine_id,omitempty"`
	Hostname     string   `json:"hostname"`
	Cores        int      `json:"cores"`
	MemoryBytes  int64    `json:"memory_bytes"`
	BlockDevices []string `json:"block_devices,omitempty"` // from /sys/block
	NICs         []string `json:"nics,omitempty"`          // from /sys/class/net
}

// Node is a server running an agent.
type Node struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	State       NodeState         `json:"state"`
	Address     string            `json:"address"`   // host the data planes listen on
	AgentURL    string            `json:"agent_url"` // the agent's lease-execution API
	Endpoints   map[Kind]string   `json:"endpoints,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Fingerprint Fingerprint       `json:"fingerprint"`
	// Health is what the node's agent reports ("ok" or a description of
	// trouble) while the node is ready, and HealthUnknown while it is
	// not (suspect, down, removed): no report is current then, and
	// LastHealth is the last one, made at LastHeartbeat.
	Health        string    `json:"health,omitempty"`
	LastHealth    string    `json:"last_health,omitempty"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	JoinedAt      time.Time `json:"joined_at"`
	// Cordoned: placement puts no new part on the node (rialto node
	// cordon, or a drain); its leases stay.
	Cordoned bool `json:"cordoned,omitempty"`
}

// NodesNamed are the nodes ref names among nodes: the node of that ID, or
// else those of that name. Names are not unique (another machine may join
// under a removed node's name): nodes that are not removed are taken over
// removed ones. One node is an answer; none is not found, and several are
// ambiguous (the caller asks for an ID).
func NodesNamed(nodes []Node, ref string) []Node {
	var named, kept []Node
	for _, n := range nodes {
		if n.ID == ref {
			return []Node{n}
		}
		if n.Name == ref {
			named = append(named, n)
			if n.State != NodeRemoved {
				kept = append(kept, n)
			}
		}
	}
	if len(kept) == 0 {
		return named
	}
	return kept
}

// NodeIDsAndStates lists nodes as "ID (state), …", for a message that
// asks for one of them.
func NodeIDsAndStates(nodes []Node) string {
	alts := make([]string, len(nodes))
	for i, n := range nodes {
		alts[i] = fmt.Sprintf("%s (%s)", n.ID, n.State)
	}
	return strings.Join(alts, ", ")
}

// Device is a lendable resource on a node (Resource Registration Table).
type Device struct {
	ID     string `json:"id"`
	NodeID string `json:"node_id"`
	Name   string `json:"name"` // unique per node, e.g. "disk0"
	Kind   Kind   `json:"kind"`
	State  string `json:"state"` // "available", "unavailable"
	// Capacity and Allocated are bytes (block, memory), bytes/s (nic) or,
	// for accel, slot units: SlotUnits make one slot, so that a shared
	// lease's share of a slot is counted (`rialto device list` shows slots).
	Capacity   int64             `json:"capacity"`
	Allocated  int64             `json:"allocated"`
	Model      string            `json:"model,omitempty"` // profile key
	Attributes map[string]string `json:"attributes,omitempty"`
	Sharing    string            `json:"sharing,omitempty"` // "exclusive" or "partitionable"
}

// DeviceSpec is what an agent offers to lend.
type DeviceSpec struct {
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	// Capacity is bytes (block, memory), bytes/s (nic) or whole slots
	// (accel: the control plane counts SlotUnits per slot).
	Capacity   int64             `json:"capacity"`
	Model      string            `json:"model,omitempty"`
	Attributes map[string]string `json:"attributes,omitempty"`
	Sharing    string            `json:"sharing,omitempty"`
}

// Link is a measured path between two nodes, or a node and the control plane
// (Topology Status Table). To is "controlplane" for the latter.
type Link struct {
	ID           string    `json:"id"`
	From         string    `json:"from"`
	To           string    `json:"to"`
	Kind         string    `json:"kind"` // ethernet, loopback, pcie-ntb, mesh
	BandwidthBps int64     `json:"bandwidth_bps,omitempty"`
	RTTMicros    float64   `json:"rtt_us"`
	Status       string    `json:"status"` // up, down
	LoadBps      int64     `json:"load_bps,omitempty"`
	MeasuredAt   time.Time `json:"measured_at"`
	State        string    `json:"state"` // same as Status; every object has a state
}

// Topology is the fabric as the control plane knows it.
type Topology struct {
	Nodes []Node `json:"nodes"`
	Links []Link `json:"links"`
}

// SlotUnits is how many units of an accelerator's capacity make one slot:
// accel devices' capacity and allocation, accel parts' offsets and lengths
// and the slots quota count thousandths of a slot, so that a shared lease
// holds a share of one slot (docs/accelerators.md, "Shares, not slots").
const SlotUnits = 1000

// DefaultShare is a shared accel lease's share of a slot when its request
// names none: four leases per slot.
const DefaultShare = 0.25

// Part is one device (or partition of one) in a lease. Offset and Length
// are bytes (block, memory), bytes/s (nic) or slot units (accel: SlotUnits
// per slot; a dedicated lease's parts are whole slots, a shared lease's
// part its share inside one slot).
type Part struct {
	NodeID   string `json:"node_id"`
	DeviceID string `json:"device_id"`
	Offset   int64  `json:"offset"`
	Length   int64  `json:"length"`
	// URI reaches this part's data plane; it embeds the export name bound to
	// the lease credential, so it is a secret.
	URI string `json:"uri,omitempty"`
	// State is empty while the part is served, PartLost once its lender
	// went down and the lease went on without it (a NIC bond degrades
	// instead of breaking: docs/nic.md). A lost part holds no capacity,
	// is served by no lender and does not come back.
	State PartState `json:"state,omitempty"`
}

// PartState is the state of one part of an active lease.
type PartState string

// Part states ("" is a part being served).
const (
	PartLost PartState = "lost"
)

// Lost reports whether the part was lost (see Part.State).
func (p Part) Lost() bool { return p.State == PartLost }

// Holding is what parts hold: how many are not lost, and the sum of
// their lengths (a lease's Count and Held).
func Holding(parts []Part) (count int, held int64) {
	for _, p := range parts {
		if !p.Lost() {
			count++
			held += p.Length
		}
	}
	return count, held
}

// PartRef names a range a lender serves for a lease: a part's device,
// offset and length (never its URI, which is a secret).
type PartRef struct {
	DeviceID string `json:"device_id"`
	Offset   int64  `json:"offset"`
	Length   int64  `json:"length"`
}

// Lease is an allocation of devices to a borrower (Resource Allocation Table).
type Lease struct {
	ID       string     `json:"id"`
	State    LeaseState `json:"state"`
	Kind     Kind       `json:"kind"`
	Mode     Mode       `json:"mode"`
	Tenant   string     `json:"tenant"`
	Borrower string     `json:"borrower,omitempty"` // node ID or free-form client name
	// Size is what the request asked for: bytes (block, memory; 0 for a
	// whole device), the rate in bytes/s a nic lease holds, or the slot
	// units an accel lease holds (api.SlotUnits a slot).
	Size int64 `json:"size"`
	// Held is what the lease's parts hold, in the unit of Size: the sum
	// of their lengths, lost parts left out. It is what a borrower sees:
	// more than Size for a dedicated lease of a larger device, a whole
	// device (size 0) or a composed lease whose parts are rounded up to
	// its stripe unit.
	Held int64 `json:"held"`
	// Count is how many parts the lease holds (lost parts left out): the
	// devices it uses, or a bond's lenders. An accel lease's slots are
	// its Size and Held, not its Count.
	Count      int   `json:"count"`
	StripeUnit int64 `json:"stripe_unit,omitempty"`
	// BandwidthCap (bytes/s) and IOPSCap are the caps of the request
	// (block leases): every lender of the lease enforces them, a part
	// moved to another lender included.
	BandwidthCap int64 `json:"bandwidth_cap,omitempty"`
	IOPSCap      int64 `json:"iops_cap,omitempty"`
	// NodeID and DeviceID name the first part's lender and device (the
	// first part that is not lost: a bond that lost a lender), and only
	// that part's: a lease of several parts (composed, a bond) is on each
	// of Parts' nodes and devices.
	NodeID   string `json:"node_id,omitempty"`
	DeviceID string `json:"device_id,omitempty"`
	Parts    []Part `json:"parts"`
	// URI is the data-plane address of a single-part lease (dedicated or
	// shared). Composed leases are used through `rialto attach`.
	URI            string    `json:"uri,omitempty"`
	Credential     string    `json:"credential,omitempty"` // only shown to the tenant that owns it
	TTLSeconds     int64     `json:"ttl_seconds"`
	ExpiresAt      time.Time `json:"expires_at"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	Reason         string    `json:"reason,omitempty"` // why failed/lost/expired
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Plan           *Plan     `json:"plan,omitempty"`
}

// LeaseRequest asks for a lease. Tenant comes from the API token.
type LeaseRequest struct {
	Kind           Kind     `json:"kind"`
	Mode           Mode     `json:"mode,omitempty"` // empty: placement chooses
	Size           int64    `json:"size,omitempty"` // bytes (block, memory)
	Count          int      `json:"count,omitempty"`
	StripeUnit     int64    `json:"stripe_unit,omitempty"`
	Borrower       string   `json:"borrower,omitempty"`
	TTLSeconds     int64    `json:"ttl_seconds,omitempty"`
	Bandwidth      float64  `json:"bandwidth,omitempty"`        // bytes/s wanted
	MaxLatencyUs   float64  `json:"max_latency_us,omitempty"`   // per-op latency need
	Work           int64    `json:"work,omitempty"`             // bytes to move, for completion time
	DeadlineSecond float64  `json:"deadline_seconds,omitempty"` // completion-time need
	Affinity       []string `json:"affinity,omitempty"`
	AntiAffinity   []string `json:"anti_affinity,omitempty"`
	Strategy       string   `json:"strategy,omitempty"` // binpack or spread
	Role           string   `json:"role,omitempty"`     // accel: role to load
	// Share is a shared accel lease's share of one slot (0 < share <= 1,
	// in steps of 1/SlotUnits; 0: DefaultShare): placement, quotas and the
	// device's allocation count it, N leases whose shares add up to one
	// slot fit on it, and the gateway weighs the lease's work by it.
	Share float64 `json:"share,omitempty"`
	// RoleConfig configures an accel lease's role (an AES key, an MCT rule
	// set, a Wasm module). It may hold a secret: the control plane hands it
	// to the lender and never stores, logs or returns it.
	RoleConfig *RoleConfig `json:"role_config,omitempty"`
	// Whole asks for an entire unused device, dedicated (block and memory:
	// also size 0); size, or an accel count, is then the least capacity.
	Whole bool `json:"whole,omitempty"`
	// BandwidthCap (bytes/s) and IOPSCap limit what the borrower gets from
	// a block lease's exports (0 = no cap); meant for shared partitions.
	BandwidthCap   int64             `json:"bandwidth_cap,omitempty"`
	IOPSCap        int64             `json:"iops_cap,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
}

// MaxRoleConfig bounds a RoleConfig's Config and Module together (bytes,
// before base64): larger rule sets or modules are loaded through the
// appliance's management API.
const MaxRoleConfig = 512 << 10

// RoleConfig is what an accelerator role needs besides its name. Both byte
// fields are base64 in JSON.
type RoleConfig struct {
	// Config is role-specific: the AES-GCM key (16, 24 or 32 bytes), the
	// MCT rule set (JSON).
	Config []byte `json:"config,omitempty"`
	// Module is a "wasm" role's WebAssembly module.
	Module []byte `json:"module,omitempty"`
	// WasmMemoryPages caps a Wasm role's memory (64 KiB pages; 0: default).
	WasmMemoryPages uint32 `json:"wasm_memory_pages,omitempty"`
}

// String keeps the contents out of logs and error messages.
func (c *RoleConfig) String() string {
	if c == nil {
		return "<none>"
	}
	return fmt.Sprintf("<role config: %d config bytes, %d module bytes>", len(c.Config), len(c.Module))
}

// Plan is the placement decision and its reasoning, as shown by explain.
type Plan struct {
	Mode                Mode      `json:"mode"`
	Parts               []Part    `json:"parts"`
	PredictedBandwidth  float64   `json:"predicted_bandwidth,omitempty"`
	PredictedCompletion float64   `json:"predicted_completion_seconds,omitempty"`
	Impacts             []Impact  `json:"impacts,omitempty"`
	Explanation         []string  `json:"explanation,omitempty"`
	State               string    `json:"state"` // "feasible" or "infeasible"
	ID                  string    `json:"id"`    // empty for dry runs
	At                  time.Time `json:"at"`
}

// Impact is how a plan would slow a running lease. Kind is that lease's
// (its bandwidths are bytes/s whatever the kind; a nic's print as link
// rates).
type Impact struct {
	LeaseID          string  `json:"lease_id"`
	Kind             Kind    `json:"kind,omitempty"`
	BandwidthBefore  float64 `json:"bandwidth_before"`
	BandwidthAfter   float64 `json:"bandwidth_after"`
	CompletionBefore float64 `json:"completion_before_seconds,omitempty"`
	CompletionAfter  float64 `json:"completion_after_seconds,omitempty"`
}

// Profile is a device model's characterization (bandwidth vs concurrency).
type Profile struct {
	ID    string `json:"id"` // model name
	State string `json:"state"`
	Model string `json:"model"`
	// WriteBps[i] and ReadBps[i] are delivered aggregate bytes/s with i+1
	// concurrent sequential writers/readers.
	WriteBps    []float64 `json:"write_bps"`
	ReadBps     []float64 `json:"read_bps"`
	Latency4KUs float64   `json:"latency_4k_us"`
	Source      string    `json:"source"` // "measured" or "declared"
	MeasuredAt  time.Time `json:"measured_at"`
}

// Event is one entry of the append-only audit log.
type Event struct {
	ID      int64     `json:"id"`
	At      time.Time `json:"at"`
	Type    string    `json:"type"` // e.g. node.joined, lease.active
	Subject string    `json:"subject"`
	Message string    `json:"message"`
	State   string    `json:"state"` // the subject's state after the event
}

// JoinRequest is sent by an agent with the bootstrap token.
type JoinRequest struct {
	Name        string            `json:"name"`
	Address     string            `json:"address"`
	AgentURL    string            `json:"agent_url"`
	Endpoints   map[Kind]string   `json:"endpoints,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Fingerprint Fingerprint       `json:"fingerprint"`
	Devices     []DeviceSpec      `json:"devices"`
	// CSR is a PEM certificate signing request for the node's TLS key. A
	// control plane with a cluster CA requires it and answers with the
	// node's certificate: the agent then serves its API over mutual TLS
	// and presents the certificate on every call to the control plane.
	// Its subject is left empty (the control plane names the node) and
	// it may ask only for the hosts of Address, AgentURL and Endpoints.
	CSR string `json:"csr,omitempty"`
	// Version is the agent's release version (rialto version), which
	// the control plane checks: it accepts agents of its own and the
	// previous minor version. Agents that predate the field send none.
	Version string `json:"version,omitempty"`
	// LostExports says the agent lost the record of the exports it
	// served and wiped its block devices: `rialto agent
	// --wipe-lost-exports` after an unreadable exports.json, or a start
	// with a fresh state directory (no identity.json, no exports.json),
	// which may be a known machine's whose state was lost, or with its
	// identity.json but without the exports.json it kept. Every lease
	// with a part on the node is lost (a node the control plane did not
	// know has none). Agents send it at the first join after such a
	// start.
	LostExports bool `json:"lost_exports,omitempty"`
	// Credential is the node's current credential (the one its last
	// join answered, which the agent keeps in its state directory): a
	// secret, which proves that a join of a known machine ID is made by
	// the node's own agent. A known machine's node is taken over by a
	// join only with it (or over mutual TLS with the node's certificate,
	// still valid), or while the node is down or removed; otherwise the
	// join is refused (409). The first join of a machine has none.
	Credential string `json:"credential,omitempty"`
	// PreviousCredentials are node credentials earlier joins answered the
	// agent (newest first, at most MaxPreviousCredentials, each at most
	// MaxCredentialLen bytes), secrets like Credential, which the agent
	// keeps with it. Any of them proves the join as Credential does while
	// it is the node's credential the control plane holds: a control
	// plane whose database was restored from a backup knows the one
	// issued before the backup, not the agent's current one. A credential
	// replaced by a takeover (a join without proof, or a node removed)
	// is not the node's any more and proves nothing.
	PreviousCredentials []string `json:"previous_credentials,omitempty"`
}

// Bounds of a join's credentials (JoinRequest): a join beyond them is
// refused (400).
const (
	MaxPreviousCredentials = 8
	MaxCredentialLen       = 256
	// MaxMachineIDLen bounds Fingerprint.MachineID.
	MaxMachineIDLen = 256
)

// JoinResponse carries the node's credential; the agent uses it as its
// bearer token from then on.
type JoinResponse struct {
	NodeID           string  `json:"node_id"`
	Credential       string  `json:"credential"`
	HeartbeatSeconds float64 `json:"heartbeat_seconds"`
	// AgentKey is what the control plane presents (as a bearer token) when
	// it calls the agent's lease-execution API.
	AgentKey          string `json:"agent_key"`
	ControlPlaneNodes []Node `json:"peers,omitempty"` // peers to probe for links
	// Certificate is the node's certificate (PEM), signed by the cluster
	// CA from the join's CSR: common name the node ID, subject
	// alternative names the node's hosts, valid for a short time (the
	// agent renews it with POST /v1/nodes/{id}/certificate).
	// CACertificate is the cluster CA's certificates (PEM): those the
	// control plane trusts (ca-cert.pem), which the agent verifies the
	// control plane and other lenders with from then on.
	Certificate   string `json:"certificate,omitempty"`
	CACertificate string `json:"ca_certificate,omitempty"`
	// CRL is the cluster CA's current revocation list (PEM): the agent
	// refuses the certificates it names where it accepts certificates
	// (its API) and where it dials (other lenders' data planes); heartbeat
	// answers bring newer ones.
	CRL string `json:"crl,omitempty"`
	// LostLeases are the leases recorded lost for a join that said the
	// agent lost its exports (JoinRequest.LostExports).
	LostLeases []string `json:"lost_leases,omitempty"`
}

// NodeCertificateRequest asks for a new certificate of a node (renewal).
type NodeCertificateRequest struct {
	CSR string `json:"csr"`
}

// NodeCertificateResponse carries a node's new certificate.
type NodeCertificateResponse struct {
	Certificate   string `json:"certificate"`
	CACertificate string `json:"ca_certificate"`
}

// CACertificates is the answer of GET /v1/ca-certificates: the cluster
// CA's certificates the control plane trusts (its ca-cert.pem: after a
// `rialto ca rotate`, the new CA's and the old one's), which a
// long-running client (rialto attach) verifies the control plane and
// lenders' data planes with from then on, and the CA's revocation list
// when the caller's is older, with which it refuses the lenders whose
// certificates the list names.
type CACertificates struct {
	// CAHash identifies them: the hex SHA-256 of their DER, newest
	// first (the canonical order, pki.SortCerts: whatever order a holder
	// has them in; as Heartbeat.CAHash).
	CAHash string `json:"ca_hash"`
	// CACertificate is them (PEM), newest first, as the control plane's
	// ca-cert.pem holds them; absent when CAHash is the request's ca_hash
	// (the caller has them).
	CACertificate string `json:"ca_certificate,omitempty"`
	// CRL is the cluster CA's current revocation list (PEM, an X.509 CRL
	// signed by one of the CA certificates) when the request's
	// crl_number is lower than its number; absent when the request has
	// no crl_number (as HeartbeatResponse.CRL).
	CRL string `json:"crl,omitempty"`
}

// Heartbeat is an agent's periodic report.
type Heartbeat struct {
	Health string       `json:"health"` // "ok" or a description of trouble
	Links  []LinkReport `json:"links,omitempty"`
	Leases []string     `json:"leases"` // lease IDs whose exports the agent serves
	// Wiping lists the lease IDs whose torn-down block ranges the agent
	// is still wiping (its wipe journal): ranges it refuses to lend. The
	// control plane keeps an ended lease's ranges (released, expired, or
	// lost while this lender was away) out of placement until a heartbeat
	// lists the lease neither here nor in Leases (docs/placement.md,
	// "Ranges being wiped").
	Wiping []string `json:"wiping,omitempty"`
	// Moved lists exports the agent serves at another address than the
	// URI the control plane was given (an export restored after a restart
	// whose port was taken). The control plane records the new URIs of
	// its active leases and acknowledges them in HeartbeatResponse.Moved.
	Moved []MovedExport `json:"moved,omitempty"`
	// Lost lists the parts whose exports the agent lost with their data
	// (a memory region, which lives in the agent's process, after a
	// restart). The control plane records each part lost, as if its
	// lender were down, and acknowledges them in HeartbeatResponse.Lost;
	// the agent reports them until then.
	Lost []LostExport `json:"lost,omitempty"`
	// Usage counts each device's data-plane traffic, for the devices
	// whose driver counts it (GET /v1/usage turns it into bandwidth).
	Usage []DeviceCounters `json:"usage,omitempty"`
	// Version is the agent's release version, checked as at join.
	Version string `json:"version,omitempty"`
	// CRLNumber is the number of the revocation list the agent holds (0:
	// none); the answer brings the current list when it is newer.
	CRLNumber int64 `json:"crl_number,omitempty"`
	// CAHash identifies the CA certificates the agent verifies the
	// control plane and other lenders with: the hex SHA-256 of their DER,
	// newest first (pki.CertsHash, whatever order the agent has them in;
	// empty: no TLS, or an agent before this field). The answer brings the
	// control plane's when they differ.
	CAHash string `json:"ca_hash,omitempty"`
	// LeasesComplete says that Leases, Wiping and Lost list every lease
	// the agent holds anything of (an export served, held until
	// confirmed or stopped at its expiry; a range being wiped; a part
	// lost), but the parts moving here: a lease with a part on this node
	// that they do not list is not served here. The control plane then
	// answers with a Check, and records lost the active leases with a
	// part here that a heartbeat echoing it does not list either, as the
	// one it answered did not (docs/operations.md, "Backups and
	// restore").
	LeasesComplete bool `json:"leases_complete,omitempty"`
	// Check is the HeartbeatResponse.Check of the last answer the agent
	// read before it made this heartbeat's lists (empty: none yet).
	Check string `json:"check,omitempty"`
	// Exports lists, with ExportsComplete, every export of the leases in
	// Leases, by part: the control plane then checks the parts it places
	// here one by one (a lease with two parts here whose lender serves
	// one is not served, for that check), and may adopt an export of an
	// active lease it places elsewhere, whose recorded lender does not
	// serve it (docs/operations.md, "Backups and restore"). Without
	// ExportsComplete (an older agent) the check is per lease.
	Exports         []ServedExport `json:"exports,omitempty"`
	ExportsComplete bool           `json:"exports_complete,omitempty"`
}

// ServedExport is an export a lender holds for a part of a lease (served,
// or held until confirmed or stopped at its expiry), as its heartbeat
// lists it (Heartbeat.Exports).
type ServedExport struct {
	LeaseID  string `json:"lease_id"`
	DeviceID string `json:"device_id"`
	Offset   int64  `json:"offset"`
	Length   int64  `json:"length"`
	// Move is the move that brought the part here (PrepareRequest.Move),
	// for an export a move brought: its URI is listed too. Empty for a
	// prepared export.
	Move string `json:"move,omitempty"`
	// URI, for an export a move brought, is where the lender serves it.
	// It embeds the export's name, derived from the lease's credential
	// and the move, so it is a secret like the lease's own, and proves
	// that a control plane gave the lender the part: the control plane
	// adopts an export only if its name is the one it derives for the part
	// and Move (docs/operations.md, "Backups and restore").
	URI string `json:"uri,omitempty"`
}

// DeviceCounters is an agent's running count of one device's data-plane
// traffic, since the agent started, and what the device actually holds.
type DeviceCounters struct {
	Name         string `json:"name"`          // the device's name on its node
	ReadBytes    int64  `json:"read_bytes"`    // bytes borrowers read
	WrittenBytes int64  `json:"written_bytes"` // bytes borrowers wrote
	// UsedBytes is what the device holds (block: the allocated blocks of
	// its backing file, which grow as borrowers write); absent if unknown.
	UsedBytes *int64 `json:"used_bytes,omitempty"`
}

// MetricsTargetGroup is a group of Prometheus scrape targets (GET
// /v1/metrics-targets), in the format of Prometheus's HTTP service
// discovery (http_sd_configs): host:port targets and the labels Prometheus
// gives them: __scheme__ and __metrics_path__ (how to scrape), component
// (controlplane or agent) and, for an agent, node (its name).
type MetricsTargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// DeviceUsage is a device's measured use (GET /v1/usage): what it holds
// and its data-plane bandwidth over the last minutes, from its agent's
// heartbeats. The control plane keeps it in memory only.
type DeviceUsage struct {
	DeviceID  string  `json:"device_id"`
	NodeID    string  `json:"node_id"`
	UsedBytes *int64  `json:"used_bytes,omitempty"` // latest report; absent if unknown
	ReadBps   float64 `json:"read_bps"`             // bytes/s read over the latest interval
	WriteBps  float64 `json:"write_bps"`            // bytes/s written over the latest interval
	// Samples are bytes/s over the interval ending at each sample's At,
	// oldest first.
	Samples []UsageSample `json:"samples"`
}

// UsageSample is a device's bandwidth over the interval ending at At.
type UsageSample struct {
	At       time.Time `json:"at"`
	ReadBps  float64   `json:"read_bps"`
	WriteBps float64   `json:"write_bps"`
}

// LoginLink is a one-time link that signs a browser in to the dashboard
// (/ui/) as the token that asked for it (POST /v1/login-links). It works
// once, until ExpiresAt.
type LoginLink struct {
	Path      string    `json:"path"` // "/ui/login?code=…": append it to the API's base URL
	ExpiresAt time.Time `json:"expires_at"`
}

// Whoami is who a token is (GET /v1/whoami).
type Whoami struct {
	Role   string `json:"role"` // "tenant" or "node"
	Tenant string `json:"tenant,omitempty"`
	Admin  bool   `json:"admin,omitempty"`
	NodeID string `json:"node_id,omitempty"`
}

// MovedExport is a lease part served at a new URI. The URI embeds the
// part's export name, so it is a secret like the lease's own.
type MovedExport struct {
	LeaseID  string `json:"lease_id"`
	DeviceID string `json:"device_id"`
	Offset   int64  `json:"offset"`
	URI      string `json:"uri"`
}

// LostExport is a lease part whose export its lender lost with its data,
// and why.
type LostExport struct {
	LeaseID  string `json:"lease_id"`
	DeviceID string `json:"device_id"`
	Offset   int64  `json:"offset"`
	Reason   string `json:"reason"`
}

// LinkReport is a round-trip measurement made by an agent.
type LinkReport struct {
	To        string  `json:"to"` // node ID or "controlplane"
	RTTMicros float64 `json:"rtt_us"`
	Up        bool    `json:"up"`
}

// HeartbeatResponse tells the agent what to reconcile.
type HeartbeatResponse struct {
	Teardown []string `json:"teardown,omitempty"` // lease IDs the agent must stop serving
	// Moved lists the lease IDs of the heartbeat's Moved entries whose
	// lease now carries the reported URI.
	Moved []string `json:"moved,omitempty"`
	// Lost lists the lease IDs of the heartbeat's Lost entries the
	// control plane is done with: the parts are recorded lost (or their
	// lease no longer holds them).
	Lost  []string `json:"lost,omitempty"`
	Peers []Node   `json:"peers,omitempty"`
	// Leases lists the heartbeat's leases that are still reserved or
	// active on this node, with their expiry: the lender serves an export
	// it restored after a restart only once its lease is listed here, and
	// learns renewals from it.
	Leases []LeaseExpiry `json:"leases,omitempty"`
	// Now is the control plane's clock when it answered: the lender counts
	// the time left of each lease (ExpiresAt - Now) from when it sent the
	// heartbeat, on its own clock.
	Now time.Time `json:"now,omitzero"`
	// CRL is the cluster CA's revocation list (PEM) when it is newer than
	// the heartbeat's CRLNumber.
	CRL string `json:"crl,omitempty"`
	// CACertificate is the cluster CA's certificates (PEM, as
	// JoinResponse.CACertificate) when their hash is not the heartbeat's
	// CAHash: after a `rialto ca rotate`, the new CA's and the old one's.
	// The agent verifies with them from then on, and keeps them.
	CACertificate string `json:"ca_certificate,omitempty"`
	// HeartbeatSeconds is the interval the agent is to beat at from now
	// on: the control plane stretches it as the cluster grows, so that
	// the heartbeats of all agents stay under its cap
	// (docs/operations.md, "Heartbeat spreading").
	HeartbeatSeconds float64 `json:"heartbeat_seconds,omitempty"`
	// Check, in the answer to a heartbeat with LeasesComplete, names this
	// answer: the agent sends it back in the next heartbeat (Heartbeat.
	// Check), whose lists it made after reading this answer, so after the
	// control plane read the leases it answered with. Absent: keep the
	// last one.
	Check string `json:"check,omitempty"`
}

// NodeRemoval is the answer to DELETE /v1/nodes/{id}.
type NodeRemoval struct {
	Node Node `json:"node"`
	// Revoked counts the node's certificates on the revocation list:
	// those this removal put there, and those an earlier attempt did.
	Revoked int `json:"revoked_certificates"`
	// Lost lists the leases that had a part on the node, now lost.
	Lost []string `json:"lost_leases"`
}

// PrepareRequest is sent by the control plane to a lender agent during the
// reservation phase. The agent prepares the export and confirms.
type PrepareRequest struct {
	LeaseID    string `json:"lease_id"`
	Kind       Kind   `json:"kind"`
	Mode       Mode   `json:"mode"`
	DeviceID   string `json:"device_id"`
	DeviceName string `json:"device_name"`
	Offset     int64  `json:"offset"`
	Length     int64  `json:"length"`
	Export     string `json:"export"` // export name bound to the lease credential (secret)
	Role       string `json:"role,omitempty"`
	// RoleConfig configures the role (a secret; lenders never log it).
	RoleConfig *RoleConfig `json:"role_config,omitempty"`
	// Gateway (accel) asks for shared use: the lender serves the lease
	// through its batching gateway for Role instead of a slot of its own.
	Gateway bool `json:"gateway,omitempty"`
	// Caps for shared partitions (0 = none).
	BandwidthCap int64 `json:"bandwidth_cap,omitempty"`
	IOPSCap      int64 `json:"iops_cap,omitempty"`
	// ExpiresAt is when the lease expires unless renewed; heartbeat
	// answers bring renewals (HeartbeatResponse.Leases). A lender that
	// cannot reach the control plane stops serving the export then.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Now is the control plane's clock when it sent the request: the
	// lender counts the time left (ExpiresAt - Now) on its own clock, so
	// the two clocks need not agree.
	Now time.Time `json:"now,omitzero"`
	// TimeoutSeconds is the most time that may pass, from Now, before
	// the control plane gives the call up: an answer later than that is
	// not taken, and the control plane counts the prepare failed (and
	// tears down what it started). The lender counts the time left from
	// that long before the request arrived, so that a request delayed on
	// its way never makes it believe the lease expires later than it
	// does. With no time left after that the export is prepared but not
	// served (as if its expiry had passed) until a heartbeat answer shows
	// the lease has time left. 0 (an older control plane): the time left
	// is counted from the request's arrival.
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"`
	// Placement counts the control plane's placements of the lease (1,
	// 2, … as it places the lease again without lenders that did not
	// confirm): a teardown of an earlier placement (TeardownRequest)
	// leaves this export alone. 0: unknown (an older control plane).
	Placement int `json:"placement,omitempty"`
	// Move is the move (its ID: TransferInRequest.ID) that brought the
	// part to the lender, whose export name derives from it; the
	// destination of a move sets it from the transfer, and lists it in
	// its heartbeats (ServedExport.Move). Empty for a prepared export.
	Move string `json:"move,omitempty"`
}

// LeaseExpiry is a lease a lender serves that the control plane still
// wants served, with when it expires unless renewed.
type LeaseExpiry struct {
	ID        string    `json:"id"`
	ExpiresAt time.Time `json:"expires_at"`
	// Parts are the ranges of the lease the lender is to serve: its parts
	// there that are not lost, and the destinations there of the lease's
	// moves under way. An export of the lease that is none of them (a
	// part that moved away or was lost, a stale copy restored after a
	// restart) is torn down and its range wiped, never served. Absent
	// (a control plane older than this field): every export of the lease
	// is wanted.
	Parts []PartRef `json:"parts,omitempty"`
	// Doubt are ranges of the lease the lender holds that the control
	// plane does not place there but may adopt (Heartbeat.Exports: a
	// database restored from a backup taken before the part moved here):
	// the lender keeps them as they are, neither served anew nor torn
	// down, until an answer lists them in Parts or leaves them out.
	Doubt []PartRef `json:"doubt,omitempty"`
}

// PrepareResponse is the lender's confirmation.
type PrepareResponse struct {
	URI string `json:"uri"`
}

// RangeBeingWiped ends a lender's refusal of a prepare whose block range
// it is still wiping after an earlier lease ("the range of device disk1 is
// still being wiped after an earlier lease"): the control plane places the
// lease around the range (or waits for the wipe) rather than skip the
// lender.
const RangeBeingWiped = "is still being wiped after an earlier lease"

// RangeStillServed ends a lender's refusal of a prepare whose block range
// overlaps an export it still serves for another lease ("the range
// overlaps one this agent still serves for another lease"): typically a
// lease lost while its lender was away, which the lender tears down and
// wipes once a heartbeat answer tells it. The control plane places the
// lease around the range, as around one being wiped, rather than skip the
// lender.
const RangeStillServed = "still serves for another lease"

// TeardownRequest asks a lender to stop serving a lease.
type TeardownRequest struct {
	LeaseID string `json:"lease_id"`
	// Placement, if set, limits the teardown to the exports prepared for
	// that placement of the lease or an earlier one
	// (PrepareRequest.Placement): a teardown that arrives late, once the
	// lease has been placed on the lender again, leaves the new exports
	// served and their ranges unwiped. 0: every export of the lease.
	Placement int `json:"placement,omitempty"`
}

// RenewRequest extends a lease's TTL.
type RenewRequest struct {
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
}

// ErrorBody is every error response: {"error": {"code": ..., "message": ...}}.
type ErrorBody struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo is a stable machine code and a message for people.
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Stable error codes.
const (
	CodeInvalid      = "invalid_request" // 400
	CodeUnauthorized = "unauthorized"    // 401: missing or unknown token
	CodeForbidden    = "forbidden"       // 403: token not allowed to do this
	CodeNotFound     = "not_found"       // 404
	CodeConflict     = "conflict"        // 409: wrong state, idempotency mismatch
	CodeInfeasible   = "infeasible"      // 422: no placement satisfies the request
	CodeQuota        = "quota_exceeded"  // 429
	CodeUnavailable  = "unavailable"     // 503: lenders did not confirm
	CodeInternal     = "internal"        // 500
	// CodeGone: an event cursor (since, Last-Event-ID) below the events
	// the control plane pruned (history retention): the events after it
	// are no longer all there. Start again from the cursor the message
	// names, or from 0 (the oldest event kept).
	CodeGone = "gone" // 410
)

// CodeOfStatus is the code of an error answer of status that does not
// carry the API's error body: one from something in front of the control
// plane or of another server at its address ("Client sent an HTTP request
// to an HTTPS server.", "404 page not found"). It is the code the API
// answers with that status (the list above); a client's mistake of another
// status (405, 413, …) is invalid_request; anything else is internal, a
// failure of the server.
func CodeOfStatus(status int) string {
	switch status {
	case 400:
		return CodeInvalid
	case 401:
		return CodeUnauthorized
	case 403:
		return CodeForbidden
	case 404:
		return CodeNotFound
	case 409:
		return CodeConflict
	case 410:
		return CodeGone
	case 422:
		return CodeInfeasible
	case 429:
		return CodeQuota
	case 503:
		return CodeUnavailable
	}
	if status/100 == 4 {
		return CodeInvalid
	}
	return CodeInternal
}
