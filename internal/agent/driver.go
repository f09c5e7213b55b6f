package agent

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/pki"
)

// Export is one prepared export: the control plane's request, the local
// device it uses, the endpoint ("host:port") of the kind's data plane, the
// host that URIs name and the URI the control plane has for it.
type Export struct {
	Request  api.PrepareRequest
	Device   DeviceConfig
	Endpoint string
	Host     string
	// URI is the URI the control plane was given for the export (the
	// driver's answer to its prepare); the agent persists it with the
	// request. When the agent restores an export after a restart, Prepare
	// gets that URI: a driver that binds listeners of its own for exports
	// binds the addresses it names again, if it can, so that the lease's
	// URI keeps working. Empty for a new export. Drivers served on the
	// kind's endpoint ignore it: the agent binds that endpoint's port again
	// itself.
	URI string
	// Moved is where a restored export is served when that is not URI (its
	// address was taken); heartbeats report it until the control plane
	// records it as the lease's URI, which then becomes URI. Drivers ignore
	// it.
	Moved string

	// held: restored after a restart and not yet confirmed by the control
	// plane, or torn down (by a driver without Suspender) when its lease's
	// known expiry passed. The driver does not serve it.
	held bool
	// suspended: its lease's known expiry passed; the driver (a
	// Suspender) keeps its data and does not serve it.
	suspended bool
	// incoming: a part moving here (transfer.go), received under the
	// transfer's token and not served as the lease's export until the
	// transfer is committed. Not persisted, not reported in heartbeats.
	incoming bool
	// prepared is the agent's count of prepares (Agent.prepares) when
	// the control plane last asked for the export (a prepare, or a move's
	// commit here); 0 for a restored export. A heartbeat answer judges
	// only the exports its heartbeat could report: prepared no later than
	// the heartbeat left.
	prepared uint64
	// deadline is the export's known expiry as its data plane checks it
	// on every request (a driver that can passes it on: the block
	// driver's nbd.Export.Deadline, the memory driver's
	// donor.SetRegionDeadline, the accel driver's appliance.SetDeadline
	// and gateway.Credentials.SetDeadline, the NIC driver's
	// nic.LeaseSpec.Deadline), shared by every copy of the Export
	// and kept equal to Request.ExpiresAt (none while incoming) by
	// exportsChangedLocked; nil for an export not yet given one.
	deadline *clock.Deadline
}

// syncDeadline makes e's data-plane deadline its known expiry (none
// while it is incoming: the move's copy is not the lease's service).
func (e Export) syncDeadline() {
	switch {
	case e.deadline == nil:
	case e.incoming:
		e.deadline.Set(time.Time{})
	default:
		e.deadline.Set(e.Request.ExpiresAt)
	}
}

// serving reports whether the export's driver serves it.
func (e Export) serving() bool { return !e.held && !e.suspended && !e.incoming }

// Driver prepares and tears down exports of one resource kind. Prepare must
// be idempotent for the same export name; Teardown of an unknown export is
// not an error.
type Driver interface {
	Prepare(ctx context.Context, e Export) (api.PrepareResponse, error)
	Teardown(ctx context.Context, e Export) error
}

// Server is implemented by drivers with a data plane of their own: the
// agent opens a listener for the kind and runs Serve on it until ctx is
// cancelled. Its address is the kind's endpoint.
type Server interface {
	Serve(ctx context.Context, ln net.Listener) error
}

// Runner is implemented by drivers with data planes that bind their own
// listeners (an accelerator appliance's slots): the agent runs Run until
// ctx is cancelled.
type Runner interface {
	Run(ctx context.Context) error
}

// Opener is implemented by drivers that set up a device before it is
// lent (for instance creating a sparse backing file).
type Opener interface {
	Open(ctx context.Context, dev DeviceConfig) (DeviceConfig, error)
}

// TLSUser is implemented by drivers whose data planes speak TLS. An agent
// enrolled with the cluster CA (Config.CAFile) calls UseTLS before it
// opens devices. server is the data planes' server configuration (the node
// certificate, renewed in place; no client certificates, as the lease
// credential authenticates the borrower), nil when the data planes run in
// plaintext (Config.InsecureDataplane). client returns the configuration
// for dialling data planes that require TLS (the CA certificates in use
// and the revocation list the control plane hands out; the dialler sets
// ServerName): call it at each dial, as the CA certificates change at run
// time (a `rialto ca rotate`, then a retired CA dropped), and keep no
// configuration it returned for later dials. track registers each TLS
// connection dialled with such a configuration, once its handshake is
// done, with the agent's revocation list (pki.CRL.Tracker): a list the
// agent takes later that revokes the server's certificate, or CA
// certificates that no longer hold its CA (`rialto ca drop-old`), end
// it. Hand it to every such dial (nbd.WithTrack, the memory client's
// Options.Track, accel.WithTrack): a connection to a lender's data plane
// lives as long as a move or a gateway, past the handshake that checked
// the list of then. With a server configuration, URIs name the kind's
// TLS scheme (nbds://, rialto-mems://, rialto-accels://, rialto-nics://).
type TLSUser interface {
	UseTLS(server *tls.Config, client func() *tls.Config, track pki.TrackFunc)
}

// The built-in drivers whose data planes speak TLS: one whose UseTLS
// stopped matching TLSUser would silently serve plaintext.
var (
	_ TLSUser = (*BlockDriver)(nil)
	_ TLSUser = (*MemoryDriver)(nil)
	_ TLSUser = (*AccelDriver)(nil)
	_ TLSUser = (*NICDriver)(nil)
)

// Closer is implemented by drivers holding resources after Run ends.
type Closer interface {
	Close() error
}

// MetricsUser is implemented by drivers that publish metrics: the agent
// hands them its registry (served at /metrics) before it runs.
type MetricsUser interface {
	UseMetrics(reg *prometheus.Registry)
}

// Wiper is implemented by drivers whose devices keep a lease's bytes after
// its export is torn down (block): Wipe makes the export's range read as
// zeroes, durably, without touching any byte outside it. The agent records
// each wipe in its journal before the teardown and drops the entry only
// once Wipe has returned nil; a range with an entry is lent to no one.
// Drivers whose Teardown already destroys the data (memory, accelerator
// slots) do not implement it.
type Wiper interface {
	Wipe(ctx context.Context, e Export) error
}

// Suspender is implemented by drivers that can stop serving an export and
// keep its data (Suspend) and serve it again (Resume). The agent suspends
// the exports of leases whose known expiry passes while the control plane
// cannot confirm a renewal. A driver without it is torn down instead (its
// data lost) and prepared again on renewal. Suspend keeps the state of a
// move of the export (Mover): once resumed, a sealed move still holds its
// writes, and its commit retires the export whether it is served or not.
// Writes the source took then would be missing from the copy the commit
// makes the lease's.
type Suspender interface {
	Suspend(ctx context.Context, e Export) error
	Resume(ctx context.Context, e Export) error
}

// UsageReporter is implemented by drivers that count their devices'
// data-plane traffic: the agent reports the counters with every heartbeat
// (the control plane turns them into bandwidth per device, GET /v1/usage).
type UsageReporter interface {
	Usage() []api.DeviceCounters
}

// usage collects the counters of every driver that keeps them.
func (a *Agent) usage() []api.DeviceCounters {
	var out []api.DeviceCounters
	for _, d := range a.drivers {
		if u, ok := d.(UsageReporter); ok {
			out = append(out, u.Usage()...)
		}
	}
	return out
}
