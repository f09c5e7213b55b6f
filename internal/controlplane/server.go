package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/ui"
	"github.com/rialto-project/rialto/internal/metrics"
	"github.com/rialto-project/rialto/internal/pki"
)

// Lender is how the control plane reaches lender agents. The default
// (nil in Config) speaks HTTP to node.AgentURL + "/agent/v1/prepare" and
// "/agent/v1/teardown" with "Authorization: Bearer <AgentKey>".
type Lender interface {
	Prepare(ctx context.Context, node api.Node, agentKey string, req api.PrepareRequest) (api.PrepareResponse, error)
	Teardown(ctx context.Context, node api.Node, agentKey string, req api.TeardownRequest) error
}

// Token is an API token to ensure present at New. Tenant tokens with Admin
// see and change every tenant's leases.
type Token struct {
	Token  string
	Tenant string
	Admin  bool
}

// Config configures a Server. Store is required.
type Config struct {
	Store  store.Store
	Logger *slog.Logger // nil: discard
	Clock  clock.Clock  // nil: the real clock; times liveness, expiry, the sweep and the event stream
	Lender Lender       // nil: HTTP to the agents (TLSLender with a CA)

	// CA, if set, is the cluster CA: joining agents must send a CSR and
	// get a node certificate (NodeCertLifetime, default 24h), their own
	// calls (heartbeats, renewals) must present it over mutual TLS, and
	// the default Lender calls them over mutual TLS (TLSLender). The HTTP
	// server must then ask clients for certificates
	// (tls.VerifyClientCertIfGiven with the CA's pool).
	CA               *pki.CA
	NodeCertLifetime time.Duration

	BootstrapToken string  // lets agents join; empty: joining is impossible
	Tokens         []Token // tenant API tokens, stored hashed

	HeartbeatInterval time.Duration // default 1s
	SuspectAfter      time.Duration // default 3s of silence
	DownAfter         time.Duration // default 10s of silence: the grace period
	// MaxHeartbeatsPerSecond caps the heartbeats the agents send in all
	// (default 100, in the spirit of HashiCorp Nomad's
	// max_heartbeats_per_second; negative: no cap): with more than
	// MaxHeartbeatsPerSecond × HeartbeatInterval nodes, each agent is told
	// a longer interval, and SuspectAfter and DownAfter stretch by the
	// same factor (replica.go, docs/operations.md).
	MaxHeartbeatsPerSecond float64
	PrepareTimeout         time.Duration // default 2s
	DefaultTTL             time.Duration // default 1h
	MaxTTL                 time.Duration // default 30 days
	// Quotas bound each tenant's reserved and active leases (placement
	// enforces them); beyond them lease creation answers 429.
	Quotas Quotas

	// WipeWait bounds how long a lease request that finds no room waits
	// for lenders to confirm the wipes of block ranges that would fit
	// (default 15s: within a client's usual 30s; docs/placement.md,
	// "Ranges being wiped").
	WipeWait time.Duration

	// Version is the control plane's release version (rialto version):
	// agents of another major version, an older minor than the previous
	// one or a newer minor are refused at join and heartbeat
	// (CheckAgentVersion). "" or "devel": every agent is accepted.
	Version string

	// AdvertiseURL is this replica's API address as the other replicas
	// reach it (https://HOST:PORT). With a store shared by replicas
	// (PostgreSQL), the elected replica records it, places every lease,
	// and the others forward lease creations and releases to it
	// (forward.go). "": this replica neither advertises nor forwards.
	AdvertiseURL string
	// PeerTLS verifies the placement leader's certificate when
	// forwarding to it; nil: the cluster CA's (CA), else the system's.
	PeerTLS *tls.Config

	// BodyTimeout bounds how long a request's body takes to arrive once
	// its headers have (default 30s): a client that sends a body slowly
	// or not at all is cut off rather than holding a connection and a
	// handler for ever (http.Server.ReadHeaderTimeout bounds the headers
	// only, and ReadTimeout would also end the event streams).
	BodyTimeout time.Duration

	// RetainHistory is how long ended leases (released, expired, lost,
	// failed) and events are kept: the sweep prunes older ones
	// (retain.go, docs/operations.md "History retention"). 0 keeps them
	// for ever; `rialto server` defaults to 7 days.
	RetainHistory time.Duration
}

// Server is a control plane.
type Server struct {
	st     store.Store
	log    *slog.Logger
	clock  clock.Clock
	lender Lender
	cfg    Config
	reg    *prometheus.Registry // this server's own: several servers may share a process
	m      serverMetrics
	h      http.Handler
	peers  peerCache

	openapi []byte
	res     *reserver  // placement's view, its index and its lock
	movedMu sync.Mutex // serializes recordMoved's read-modify-write of part URIs
	nodes   nodeCache
	started time.Time // silence before this does not count (restarts)
	rep     replicaState
	auth    authCache
	bus     replicaBus // replicas' broadcast channel (revoke.go)
	beats   beatBatcher
	live    liveness // heartbeats kept in memory (liveness.go)
	leases  leaseBatcher
	events  eventHub // the event stream's tail of the store (stream.go)
	usage   usageTracker
	ui      *ui.UI // the dashboard (ui.go)

	xfer   transferLender // the agents' transfer API, when Lender has none (lender_move.go)
	mv     movers         // lease part moves (move.go)
	drains drains         // node drains (drain.go)

	reloadMu sync.Mutex // serializes Reload (reload.go)

	releases releaseFlights // the lease releases under way (lease.go)

	removed removedCalls // the teardowns and aborts under way to removed nodes' agents (noderemove.go)
	// unrecorded are the serials of certificates removals revoked after
	// their commit that the store did not take yet, those found again at
	// start among them (noderemove.go).
	unrecorded unrecordedRevoked
	// removalCommitted, set by tests, is called once a removal of node
	// id committed, before its second revocation pass: an error ends the
	// removal there, as a replica that stops then (noderemove.go).
	removalCommitted func(ctx context.Context, id string) error
	crl              crlSync // signing the revocation list from the store (crlstore.go)

	// unserved are the active leases the nodes' heartbeats did not list
	// (unserved.go).
	unserved unservedWatch

	fwd *forwarder // the route to the placement leader (forward.go); nil: none

	lastPrune atomic.Int64 // when the sweep last pruned history to the end (retain.go; Unix ns)
}

// New returns a Server; it stores the configured tokens (hashed) within
// ctx.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("controlplane: Config.Store is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = time.Second
	}
	if cfg.SuspectAfter <= 0 {
		cfg.SuspectAfter = 3 * time.Second
	}
	if cfg.DownAfter <= 0 {
		cfg.DownAfter = 10 * time.Second
	}
	if cfg.DownAfter < cfg.SuspectAfter {
		return nil, fmt.Errorf("controlplane: DownAfter (%v) is shorter than SuspectAfter (%v)", cfg.DownAfter, cfg.SuspectAfter)
	}
	if cfg.MaxHeartbeatsPerSecond == 0 {
		cfg.MaxHeartbeatsPerSecond = 100
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = defaultBodyTimeout
	}
	if cfg.PrepareTimeout <= 0 {
		cfg.PrepareTimeout = 2 * time.Second
	}
	if cfg.WipeWait <= 0 {
		cfg.WipeWait = 15 * time.Second
	}
	if cfg.DefaultTTL <= 0 {
		cfg.DefaultTTL = time.Hour
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = 30 * 24 * time.Hour
	}
	if cfg.MaxTTL < cfg.DefaultTTL {
		cfg.MaxTTL = cfg.DefaultTTL
	}
	if cfg.Lender == nil && cfg.CA != nil {
		l, err := NewTLSLender(cfg.CA)
		if err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
		cfg.Lender = l
	}
	if cfg.Lender == nil {
		cfg.Lender = NewHTTPLender(nil)
	}
	s := &Server{st: cfg.Store, log: cfg.Logger, clock: cfg.Clock, lender: cfg.Lender, cfg: cfg, reg: prometheus.NewRegistry(),
		res: newReserver(cfg.Store, cfg.Quotas)}
	s.auth.life = s.authLifetime // auth.go
	// Its name on the replicas' broadcast channel (revoke.go), before
	// finishRemovals below may broadcast: a message without one is
	// dropped by every other replica.
	s.bus.id = newBusID()
	ts, err := s.storedTokens(Settings{BootstrapToken: cfg.BootstrapToken, Tokens: cfg.Tokens})
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	if err := s.putTokens(ctx, ts); err != nil {
		return nil, fmt.Errorf("controlplane: store tokens: %w", err)
	}
	// Those a removal did not revoke after its commit, its replica
	// stopped first (noderemove.go); a failure is tried again by the
	// sweep.
	if err := s.finishRemovals(ctx); err != nil {
		s.log.Warn("revoking the certificates issued to removed nodes that no revocation names; tried again at the next sweep", "err", err)
	}
	// Those a removal revoked after its commit that a replica held when
	// it stopped (noderemove.go); a failure is tried again by the
	// background duties.
	if err := s.recoverLateRevoked(ctx); err != nil {
		s.log.Warn("finding the certificates revoked during a node's removal that the store did not take; tried again at the next sweep", "err", err)
	}
	s.started = s.now()
	s.res.shared, s.res.seed = s.shared(), rand.Uint64()
	if s.res.shared {
		// A store over the network: writes wait a little to share
		// transactions (batch.go).
		s.beats.g.linger, s.beats.g.clock = sharedLinger, s.clock
		// Lease writes: creations and transitions apart, each lingering
		// only for the writers of its last batch (batch.go, leaseBatcher).
		s.leases.split = true
		for _, g := range []*groupCommit[store.LeaseOp, api.Lease]{&s.leases.g, &s.leases.creates} {
			g.linger, g.clock, g.rejoin = sharedLinger, s.clock, true
		}
	}
	metrics.RegisterRuntime(s.reg)
	s.m = newServerMetrics(s.reg)
	switch x, ok := cfg.Lender.(transferLender); {
	case ok:
		s.xfer = x
	case cfg.CA != nil:
		// A Lender without the transfer API (a test's wrapper): moves
		// still call agents over mutual TLS.
		l, err := NewTLSLender(cfg.CA)
		if err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
		s.xfer = l
	default:
		s.xfer = NewHTTPLender(nil)
	}
	s.mv.init(s.reg)
	s.leases.size, s.beats.size = s.m.batchSize.WithLabelValues("lease"), s.m.batchSize.WithLabelValues("heartbeat")
	if s.res.shared {
		s.fwd = newForwarder(s)
	}
	s.h = s.bodyDeadline(s.routes())
	return s, nil
}

func (s *Server) now() time.Time { return s.clock.Now().UTC() }

// Handler serves /v1/..., /v1/openapi.json, /metrics and /healthz.
func (s *Server) Handler() http.Handler { return s.h }

// Run calls Sweep every HeartbeatInterval until ctx is done; it returns
// ctx's error. Sweep errors are logged, not fatal. With a store shared by
// several replicas (store.Leader), only the elected replica sweeps
// (replica.go).
func (s *Server) Run(ctx context.Context) error {
	if b, ok := s.st.(store.Broadcaster); ok {
		bctx, cancel := context.WithCancel(ctx)
		wait := s.runBus(bctx, b)
		defer wait()
		defer cancel()
	}
	// Heartbeats kept in memory are written every flushPeriod (liveness.go).
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.flushLoop(fctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	if el, ok := s.st.(store.Leader); ok {
		return s.runReplica(ctx, el)
	}
	s.rep.leading.Store(true)
	defer s.rep.leading.Store(false)
	t := s.clock.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	var damaged bool
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C():
			if err := s.Sweep(ctx); ctx.Err() == nil {
				s.swept(err, &damaged)
			}
		}
	}
}

// swept logs the end of a sweep. A failure is logged at WARN, or, when
// the store reports its database damaged (store.ErrCorrupt), at ERROR,
// err saying what to do (restore a backup; for a PostgreSQL index,
// REINDEX): once, since every sweep after fails the same way until the
// database is repaired (*damaged). The first sweep that succeeds after
// says so at INFO and clears *damaged: damage found later is logged at
// ERROR again.
func (s *Server) swept(err error, damaged *bool) {
	switch {
	case err == nil:
		if *damaged {
			*damaged = false
			s.log.Info("sweep: the database answers again: sweeps succeed")
		}
	case !errors.Is(err, store.ErrCorrupt):
		s.log.Warn("sweep", "err", err)
	case !*damaged:
		*damaged = true
		s.log.Error("sweep: the database is damaged: see err for what to do; further sweeps failing so are not logged until one succeeds", "err", err)
	}
}
