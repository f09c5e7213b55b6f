package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/tlspsk"
)

// Sentinel errors.
var (
	ErrConfig       = errors.New("agent: invalid configuration")
	ErrBadRequest   = errors.New("agent: bad request")
	ErrNoDevice     = errors.New("agent: no such device")
	ErrNoDriver     = errors.New("agent: no driver for this kind")
	ErrOutOfRange   = errors.New("agent: range outside the device")
	ErrRefused      = errors.New("agent: prepare refused")
	ErrNotJoined    = errors.New("agent: not joined yet")
	ErrUnauthorized = errors.New("agent: unauthorized")
)

// DeviceConfig is a resource the agent is told to lend.
type DeviceConfig struct {
	// Name is unique within the agent, e.g. "disk0".
	Name string
	Kind api.Kind
	// Path is a block device's backing file (created sparse if absent;
	// relative paths are inside StateDir); no two devices may share one.
	Path string
	// Size is bytes for block and memory devices and slots for accelerators.
	// A block device's file is extended to Size if it is smaller; Size 0
	// takes the existing file's size.
	Size       int64
	Model      string
	Sharing    string // "exclusive" or "partitionable" (default: partitionable: byte ranges, or accelerator slots)
	Attributes map[string]string
}

// Config configures an Agent.
type Config struct {
	// ControlPlane is the control plane's base URL, e.g. "http://127.0.0.1:7070".
	ControlPlane string
	// BootstrapToken authorizes the join.
	BootstrapToken string
	// Name is the node's name, unique within the cluster.
	Name string
	// Version is the agent's release version, sent at join and in every
	// heartbeat: the control plane refuses agents it is not compatible
	// with (controlplane.CheckAgentVersion). "": none sent.
	Version string
	// StateDir holds the agent's identity and export state.
	StateDir string
	// WipeLostExports, when the exports file in StateDir cannot be read,
	// wipes every block device in full (through the wipe journal, before
	// anything is served) and sets the file aside, instead of refusing to
	// start: the exports it listed are lost either way (their leases are
	// lost when the agent rejoins without them), and any range may hold a
	// tenant's bytes.
	WipeLostExports bool
	// Listen is the host the agent API and the data planes bind to
	// (default 127.0.0.1). Advertise, if set, is the host put into URLs
	// instead.
	Listen    string
	Advertise string
	// Ports of the agent API and of the data planes by kind; 0 means the
	// port used before (from StateDir) or, failing that, a free one.
	APIPort   int
	DataPorts map[api.Kind]int
	// MachineID overrides the hardware identity (default: derived from
	// /etc/machine-id and Name).
	MachineID string
	Labels    map[string]string
	Devices   []DeviceConfig
	// Drivers adds or replaces the drivers of resource kinds.
	Drivers map[api.Kind]Driver
	// HeartbeatInterval overrides the interval the control plane asks for.
	HeartbeatInterval time.Duration
	// HTTPClient is used to reach the control plane and peers (default: a
	// client with a 10 s timeout). With CAFile the agent builds its own
	// (keeping HTTPClient's timeout).
	HTTPClient *http.Client
	// CAFile is the cluster CA's certificate (PEM). With it the agent
	// verifies the control plane and its peers against the CA (and the
	// revocation list the control plane hands out), the control plane's
	// certificate being a control plane's (api.ControlPlaneServerCN, not
	// a node's the CA issued for its address: the join's bootstrap token
	// and the node's credential go to nothing else), sends a CSR
	// when it joins and keeps the node certificate it gets (node-key.pem,
	// 0600, and node-cert.pem in StateDir), presents it on every call,
	// renews it when a third of its lifetime is left, and serves its API
	// over HTTPS, taking lease-execution calls only from the control
	// plane's certificate.
	CAFile string
	// InsecureDataplane serves the data planes (NBD, memory, accelerator
	// slots and gateways) in plaintext although the agent enrolls with
	// CAFile: the opt-out for a fabric the operator trusts. Lease
	// credentials are still checked, but they and the data cross the
	// network in clear. Without CAFile the data planes are always
	// plaintext (there is no node certificate to serve).
	InsecureDataplane bool
	// TLSPSK, if it holds keys, lets the NBD server also take TLS 1.3
	// with these pre-shared keys (libnbd's tls-psk-file), beside the node
	// certificate; the export name is still the lease credential checked.
	// Unused when the data planes are plaintext.
	TLSPSK *tlspsk.Keys
	// MovePendingBytes bounds the memory a block part moving from here
	// (a lease move, a drain) spends on its borrower's writes: the
	// payload bytes taken in and not yet written (held while the move's
	// last pass and switch hold the writes, or on their way to the
	// file), over all the export's connections. Past it the NBD server
	// takes no more in (the borrower's writes wait in its sends) until
	// some are written or refused. 0: 64 MiB (nbd.DefaultMovePending);
	// less than 0: no bound but each connection's own (64 MiB). A
	// moving memory part needs no bound: its donor holds a write before
	// it reads its payload (docs/memory-protocol.md).
	MovePendingBytes int64
	// MaxExportConns bounds the NBD connections one block lease's export
	// serves at once (each may hold up to 64 MiB of buffers); past it a
	// client is refused at NBD_OPT_GO with NBD_REP_ERR_POLICY. 0: 64
	// (nbd.DefaultMaxExportConns); less than 0: no bound.
	MaxExportConns int
	// MaxHandshakes bounds the block data plane's connections in the NBD
	// option phase at once (peers that have presented no lease
	// credential yet); past it the one waiting longest of the source
	// with the most is closed. 0: 256 (nbd.DefaultMaxHandshakes); less
	// than 0: no bound.
	MaxHandshakes int
	// MaxHandshakesPerSource bounds those from one source (an IPv4
	// address, an IPv6 /64); past it that source's longest waiting is
	// closed. 0: 64 (nbd.DefaultMaxHandshakesPerSource); less than 0: no
	// bound.
	MaxHandshakesPerSource int
	// SysRoot is prefixed to /proc, /sys and /etc paths while
	// fingerprinting (tests point it at a fake tree).
	SysRoot string
	Logger  *slog.Logger
	// Clock tells the time and times the heartbeat rounds, the join's
	// retries and the leases' known expiries (nil: the real clock; tests
	// inject a clock.Fake).
	Clock clock.Clock
	// OmitRuntimeMetrics leaves the Go runtime and process collectors
	// (go_*, process_*) out of /metrics: for an agent that shares its
	// process with a component that reports them (`rialto up`), so that
	// the process is counted once.
	OmitRuntimeMetrics bool
}

func (c *Config) validate() error {
	switch {
	case c.ControlPlane == "":
		return fmt.Errorf("%w: ControlPlane is required", ErrConfig)
	case c.BootstrapToken == "":
		return fmt.Errorf("%w: BootstrapToken is required", ErrConfig)
	case c.Name == "":
		return fmt.Errorf("%w: Name is required", ErrConfig)
	case c.StateDir == "":
		return fmt.Errorf("%w: StateDir is required", ErrConfig)
	case len(c.MachineID) > api.MaxMachineIDLen:
		return fmt.Errorf("%w: MachineID is %d bytes; the control plane takes at most %d", ErrConfig, len(c.MachineID), api.MaxMachineIDLen)
	}
	if ip := net.ParseIP(c.Listen); ip != nil && ip.IsUnspecified() && c.Advertise == "" {
		return fmt.Errorf("%w: listening on %s needs Advertise, the address peers and borrowers use", ErrConfig, c.Listen)
	}
	seen := map[string]bool{}
	for _, d := range c.Devices {
		if d.Name == "" {
			return fmt.Errorf("%w: a device has no name", ErrConfig)
		}
		if seen[d.Name] {
			return fmt.Errorf("%w: device %q listed twice", ErrConfig, d.Name)
		}
		seen[d.Name] = true
		switch d.Kind {
		case api.KindBlock:
			if d.Path == "" {
				return fmt.Errorf("%w: block device %q has no path", ErrConfig, d.Name)
			}
		case api.KindMemory, api.KindAccel, api.KindNIC:
			if d.Size <= 0 {
				return fmt.Errorf("%w: device %q needs a positive size", ErrConfig, d.Name)
			}
		default:
			return fmt.Errorf("%w: device %q has unknown kind %q", ErrConfig, d.Name, d.Kind)
		}
		if d.Size < 0 {
			return fmt.Errorf("%w: device %q has a negative size", ErrConfig, d.Name)
		}
	}
	return nil
}

// Faults injects failures for tests. Every flag is safe to flip while the
// agent runs.
type Faults struct {
	// PauseHeartbeats stops heartbeats, as a partition from the control
	// plane would: the agent keeps serving the leases whose known expiry
	// has not passed.
	PauseHeartbeats atomic.Bool
	// RefusePrepare answers every prepare with 503.
	RefusePrepare atomic.Bool
	// IgnorePrepare never answers a prepare: the handler waits until the
	// caller gives up or the agent stops.
	IgnorePrepare atomic.Bool
	// CrashMidWipe stops every wipe half-way, as a crash of the agent in
	// the middle of it would: half the range is zeroed, the journal entry
	// stays and the range stays unlendable (until a restart without the
	// fault finishes it).
	CrashMidWipe atomic.Bool
	// BeforeWipe, when set, is called as each wipe starts, with its
	// context and lease, before it writes anything.
	BeforeWipe atomic.Pointer[func(ctx context.Context, leaseID string)]
	// HoldJoinAnswer, when set, makes the agent wait after a join was
	// answered, before it takes the answer (node certificate, identity,
	// agent key), until the channel is closed or the agent stops: the
	// control plane has registered the node and may call it meanwhile.
	HoldJoinAnswer atomic.Pointer[chan struct{}]
	// BeforeJoin, when set, is called before each join is sent, with the
	// run's context: the agent's API and data planes are serving (the
	// restored exports held), and the control plane has not heard of
	// this run yet.
	BeforeJoin atomic.Pointer[func(ctx context.Context)]
}
