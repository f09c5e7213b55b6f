package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/backoff"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/httpx"
	"github.com/rialto-project/rialto/internal/letgo"
	"github.com/rialto-project/rialto/internal/metrics"
	"github.com/rialto-project/rialto/internal/resource"
)

// Agent is a node agent. Create it with New and run it once with Run.
type Agent struct {
	// Faults injects failures (tests).
	Faults Faults

	cfg     Config
	log     *slog.Logger
	clock   clock.Clock
	hc      *http.Client // to the control plane
	peerHC  *http.Client // to peers' agent APIs (link probes); hc without Config.CAFile
	ownHC   bool         // hc's and peerHC's transports are the agent's own (Run closes their idle connections)
	tls     *nodeTLS     // nil without Config.CAFile; set by Run before anything runs
	drivers map[api.Kind]Driver
	reg     *prometheus.Registry // this agent's own (GET /metrics): several agents may share a process

	ran   atomic.Bool
	ready chan struct{}

	opMu sync.Mutex // serializes prepare, teardown and export persistence

	reserved portReservations // remembered ports, held while devices open

	// joined is closed once the agent holds the key the control plane
	// calls it with (the first join's answer): calls that arrive between
	// the control plane's answer and the agent's taking it wait for it.
	joined     chan struct{}
	joinedOnce sync.Once

	mu         sync.Mutex // guards the fields below
	id         identity
	devices    map[string]DeviceConfig
	exports    map[string]Export          // by export name
	lost       map[string]persistedExport // exports lost with a restart, until acknowledged (lost.go)
	endpoints  map[api.Kind]string
	agentURL   string
	host       string
	peers      []api.Node
	cpRTT      float64
	cpUp       bool // cpRTT was measured (a heartbeat was answered)
	interval   time.Duration
	lastBeatAt time.Time
	probeNext  int // rotation cursor over peers
	// cpAnswered: the last call to the control plane (a heartbeat, or a
	// join) was answered without an error, at cpAnsweredAt (the agent's
	// clock) the last time one was; what the logs of stops say.
	cpAnswered   bool
	cpAnsweredAt time.Time
	// check is the last check a heartbeat answer brought
	// (api.HeartbeatResponse.Check): the next heartbeat sends it back.
	check string

	wipes []*pendingWipe // the wipe journal (a.mu)

	prepares uint64 // exports the control plane asked for so far (Export.prepared)

	// The heartbeat loop's plan (see heartbeatLoop and
	// exportsChangedLocked): loopPlanned while it waits, having planned
	// for loopExpiry, the earliest known expiry of a served export then
	// (zero: none).
	loopPlanned bool
	loopExpiry  time.Time

	xfers transfers // parts moving to or from here (transfer.go)

	// bg runs the wipes of moved parts' old ranges, which the control
	// plane's commit does not wait for (CommitTransfer); Run stops it
	// before it returns.
	bg background

	// calls are the calls to the control plane under way that
	// untilExpiryRound bounds: an earlier expiry learned meanwhile
	// brings their bound earlier (exportsChangedLocked).
	calls map[*callBound]struct{}

	// wake wakes the heartbeat loop to plan again (buffer 1: a signal
	// sent while one is pending is the same).
	wake chan struct{}

	hbMu      sync.Mutex // serializes heartbeat rounds
	enforceMu sync.Mutex // serializes enforceExpiry
	wipeMu    sync.Mutex // serializes writes of the wipe journal

	mHeartbeats   *prometheus.CounterVec
	mPrepares     *prometheus.CounterVec
	mExports      prometheus.Gauge
	mWithheld     *prometheus.GaugeVec
	mRestored     *prometheus.CounterVec
	mWipes        *prometheus.CounterVec
	mPendingWipes prometheus.Gauge
	mSuspends     *prometheus.CounterVec
	mTransfers    *prometheus.CounterVec
	mMoved        *prometheus.CounterVec
	mSkipped      *prometheus.CounterVec
	mHeld         *prometheus.HistogramVec
}

// New checks cfg and returns an agent ready to Run.
func New(cfg Config) (*Agent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg.Clock = clock.Or(cfg.Clock)
	hc, ownHC := cfg.HTTPClient, false
	if hc == nil {
		hc, ownHC = &http.Client{Timeout: 10 * time.Second, Transport: http.DefaultTransport.(*http.Transport).Clone()}, true
	}
	a := &Agent{
		joined:   make(chan struct{}),
		wake:     make(chan struct{}, 1),
		cfg:      cfg,
		log:      cfg.Logger.With("agent", cfg.Name),
		clock:    cfg.Clock,
		hc:       hc,
		peerHC:   hc,
		ownHC:    ownHC,
		drivers:  map[api.Kind]Driver{},
		reg:      prometheus.NewRegistry(),
		ready:    make(chan struct{}),
		devices:  map[string]DeviceConfig{},
		exports:  map[string]Export{},
		lost:     map[string]persistedExport{},
		interval: cfg.HeartbeatInterval,
	}
	for k, mk := range builtinDrivers {
		a.drivers[k] = mk(a.log, cfg.Listen)
	}
	for k, d := range cfg.Drivers {
		a.drivers[k] = d
	}
	for _, d := range a.drivers {
		if m, ok := d.(MetricsUser); ok {
			m.UseMetrics(a.reg)
		}
		if b, ok := d.(*BlockDriver); ok {
			b.srv.MovePending = cfg.MovePendingBytes // before Serve
			b.srv.MaxExportConns = cfg.MaxExportConns
			b.srv.MaxHandshakes = cfg.MaxHandshakes
			b.srv.MaxHandshakesPerSource = cfg.MaxHandshakesPerSource
		}
	}
	if !cfg.OmitRuntimeMetrics {
		metrics.RegisterRuntime(a.reg)
	}
	a.registerMetrics(a.reg)
	return a, nil
}

// Ready is closed once the agent has joined and serves its APIs.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// NodeID is the node's ID ("" before the first join).
func (a *Agent) NodeID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.id.NodeID
}

// MachineID is the node's hardware identity.
func (a *Agent) MachineID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.id.MachineID
}

// AgentURL is the base URL of the lease-execution API ("" before Run binds it).
func (a *Agent) AgentURL() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.agentURL
}

// Endpoint is the "host:port" of a kind's data plane ("" if none).
func (a *Agent) Endpoint(k api.Kind) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.endpoints[k]
}

// Leases lists the IDs of the leases the agent keeps exports of: served,
// held (restored, awaiting the control plane's confirmation) or suspended
// (past their known expiry). Heartbeats report them all.
func (a *Agent) Leases() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.leasesLocked()
}

func (a *Agent) leasesLocked() []string {
	set := map[string]bool{}
	for _, e := range a.exports {
		if !e.incoming {
			set[e.Request.LeaseID] = true
		}
	}
	out := make([]string, 0, len(set))
	for id := range set {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// exportsLocked lists the exports of leasesLocked's leases, by part (api.
// Heartbeat.Exports): those a move brought with the move and the address
// they are served at, which a control plane whose database does not know
// the move may adopt them with; a.mu is held.
func (a *Agent) exportsLocked() []api.ServedExport {
	out := make([]api.ServedExport, 0, len(a.exports))
	for _, e := range a.exports {
		if e.incoming {
			continue
		}
		r := e.Request
		x := api.ServedExport{LeaseID: r.LeaseID, DeviceID: r.DeviceID, Offset: r.Offset, Length: r.Length, Move: r.Move}
		if r.Move != "" {
			x.URI = e.URI
			if e.Moved != "" {
				x.URI = e.Moved
			}
		}
		out = append(out, x)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].LeaseID != out[j].LeaseID {
			return out[i].LeaseID < out[j].LeaseID
		}
		if out[i].DeviceID != out[j].DeviceID {
			return out[i].DeviceID < out[j].DeviceID
		}
		return out[i].Offset < out[j].Offset
	})
	return out
}

// movedLocked lists the exports served at another address than their
// lease's URI; a.mu is held.
func (a *Agent) movedLocked() []api.MovedExport {
	var out []api.MovedExport
	for _, e := range a.exports {
		if e.Moved != "" && !e.held {
			out = append(out, api.MovedExport{LeaseID: e.Request.LeaseID, DeviceID: e.Request.DeviceID,
				Offset: e.Request.Offset, URI: e.Moved})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].URI < out[j].URI })
	return out
}

// recordMoved makes the moved URIs the control plane acknowledged (by
// lease) the exports' URIs, and persists them: a later restart binds those
// addresses again.
func (a *Agent) recordMoved(leases []string, sent []api.MovedExport) {
	acked := setOf(leases)
	a.opMu.Lock()
	defer a.opMu.Unlock()
	changed := 0
	a.mu.Lock()
	for name, e := range a.exports {
		if e.Moved == "" || !acked[e.Request.LeaseID] {
			continue
		}
		for _, m := range sent {
			if m.LeaseID == e.Request.LeaseID && m.URI == e.Moved {
				e.URI, e.Moved = e.Moved, ""
				a.exports[name] = e
				changed++
				break
			}
		}
	}
	a.mu.Unlock()
	if changed == 0 {
		return
	}
	a.log.Info("the control plane recorded the new addresses of restored exports", "exports", changed)
	if err := a.saveExportsLocked(); err != nil {
		a.log.Warn("persisting exports", "err", err)
	}
}

// Devices lists the devices the agent lends, after setup.
func (a *Agent) Devices() []DeviceConfig {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]DeviceConfig, 0, len(a.devices))
	for _, d := range a.devices {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Metrics is the agent's metrics registry (also served at /metrics).
func (a *Agent) Metrics() *prometheus.Registry { return a.reg }

// apiStopTimeout bounds how long a stopping agent lets the requests its
// API is serving finish (their context is cancelled as the agent stops;
// a prepare or a teardown under way ends its wipe or gives it up).
const apiStopTimeout = 2 * time.Second

// Run joins the control plane, serves the agent API and the data planes
// and heartbeats until ctx is cancelled or the join is rejected. It
// returns after every goroutine it started has exited; a cancelled ctx is
// a clean stop (nil).
func (a *Agent) Run(ctx context.Context) error {
	if !a.ran.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Run called twice", ErrConfig)
	}
	// When the agent began to stop (zero: it never served; set and read
	// by Run's deferred calls).
	var stopping time.Time
	defer func() {
		// The connections kept to the control plane and the peers go
		// with the agent: their servers need not wait for them to close.
		if a.ownHC {
			a.hc.CloseIdleConnections()
			a.peerHC.CloseIdleConnections()
		}
		if !stopping.IsZero() {
			a.log.Info("agent stopped", "took", time.Since(stopping).Round(time.Millisecond))
		}
	}()
	if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("agent: state dir: %w", err)
	}
	// The state directory, then the block devices, are this agent's
	// alone until Run returns (instancelock.go): the locks go last, once
	// everything Run started has stopped.
	var locks instanceLocks
	defer locks.release()
	if err := a.lockStateDir(&locks); err != nil {
		return err
	}
	files, err := a.statStateFiles()
	if err != nil {
		return err
	}
	if err := a.loadIdentity(); err != nil {
		return err
	}
	lost := a.lostState(files)
	if err := a.setupTLS(); err != nil {
		return err
	}
	if a.tls != nil {
		timeout := a.hc.Timeout
		a.hc, a.peerHC = a.tls.cpClient(timeout), a.tls.peerClient(timeout)
		a.ownHC = true
		var srv *tls.Config
		if !a.cfg.InsecureDataplane {
			srv = a.tls.dataServerTLS()
		}
		cli, track := a.tls.dataClientTLS, a.tls.crl.Tracker(a.log)
		for _, d := range a.drivers {
			if u, ok := d.(TLSUser); ok {
				u.UseTLS(srv, cli, track)
			}
			if b, ok := d.(*BlockDriver); ok && srv != nil {
				b.usePSK(a.cfg.TLSPSK)
			}
		}
	}
	// Hold the ports the last run served at while devices open (fresh
	// accelerator slot ports could take one); each is released right
	// before its owner binds it again, the rest after the restore.
	saved, readable := a.savedExports()
	if !readable && !a.cfg.WipeLostExports {
		// The ranges it lists may hold tenants' bytes that only their
		// leases' teardowns would wipe: an agent that forgot them would
		// overwrite the file and lend the ranges on unwiped.
		return fmt.Errorf("agent: %s is unreadable: the ranges it lists may hold tenants' bytes; repair it, or start with --wipe-lost-exports to wipe every block device and set it aside",
			filepath.Join(a.cfg.StateDir, exportsFile))
	}
	// Before a device is opened, wiped or served; the files that
	// existed before may hold tenants' bytes (fresh.go).
	existed, err := a.lockBlockDevices(ctx, &locks)
	if err != nil {
		return err
	}
	if err := a.lockNICs(ctx, &locks); err != nil {
		return err
	}
	a.reserved.reserve(a.cfg.Listen, a.rememberedPorts(saved))
	defer a.reserved.releaseAll()
	if err := a.openDevices(ctx); err != nil {
		return err
	}
	defer a.closeDrivers()
	// Wipes a previous run left unfinished complete before anything is
	// served; a range whose wipe fails again stays refused, and the wipe
	// is retried with every heartbeat round.
	if err := a.loadWipes(); err != nil {
		return err
	}
	switch {
	case !readable:
		if err := a.wipeLostExports(); err != nil {
			return err
		}
	case lost != "":
		if err := a.wipeLostState(existed, lost); err != nil {
			return err
		}
	}
	// From here on exports.json exists as long as identity.json does: a
	// start that finds only the identity has lost it (fresh.go).
	if err := a.keepExportsRecord(); err != nil {
		return err
	}
	saved = a.loseEphemeral(saved)
	saved = a.withoutWiped(saved)
	saved, err = a.journalUnrestorable(saved)
	if err != nil {
		return err
	}
	if err := a.retryWipes(ctx); err != nil {
		a.log.Warn("unfinished wipes failed again; their ranges stay unlendable", "err", err)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Last, once nothing that starts them runs any more: the wipes under
	// way in the background are given up (their ranges stay in the
	// journal, wiped after a restart) and waited for.
	defer func() {
		if n := a.bg.underWay(); n > 0 {
			a.log.Info("agent stopping: giving up the wipes under way in the background (their ranges stay in the wipe journal, wiped after a restart)", "wipes", n)
		}
		a.bg.stop()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs before wg.Wait
	// The data planes serve until Run stops them, once the moves under
	// way are given up; the agent API stops taking requests then too
	// (apiStop: httpx.Conns.Stop).
	dctx, stopData := context.WithCancel(context.WithoutCancel(ctx))
	defer stopData()
	apiStop := make(chan struct{})
	defer close(apiStop)
	defer func() {
		// Before the data planes stop: a move under way is given up, its
		// part served here as before (until the process ends).
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		a.stopTransfers(sctx)
	}()
	up := false // the agent API and the data planes are served
	defer func() {
		if up {
			stopping = time.Now()
			a.log.Info("agent stopping")
		}
	}()

	// Every listener is bound, and the exports the last run kept are
	// held, before anything is served: no prepare on the API and no client
	// of a data plane is taken before the restored exports are known.
	apiLn, err := a.listen(a.cfg.APIPort, a.id.APIPort)
	if err != nil {
		return fmt.Errorf("agent: listen for the agent API: %w", err)
	}
	host := a.cfg.Listen
	if a.cfg.Advertise != "" {
		host = a.cfg.Advertise
	}
	apiPort := apiLn.Addr().(*net.TCPAddr).Port
	a.mu.Lock()
	a.host = host
	a.id.APIPort = apiPort
	scheme := "http"
	if a.tls != nil {
		scheme = "https"
	}
	a.agentURL = scheme + "://" + net.JoinHostPort(host, strconv.Itoa(apiPort))
	a.endpoints = map[api.Kind]string{}
	if a.id.DataPorts == nil {
		a.id.DataPorts = map[api.Kind]int{}
	}
	a.mu.Unlock()

	// Data planes: one listener per kind whose driver serves one.
	kinds := map[api.Kind]bool{}
	for _, d := range a.Devices() {
		kinds[d.Kind] = true
	}
	dataLns := map[api.Kind]net.Listener{}
	closeAll := func() {
		apiLn.Close()
		for _, ln := range dataLns {
			ln.Close()
		}
	}
	for k := range kinds {
		if _, ok := a.drivers[k].(Server); !ok {
			continue
		}
		ln, err := a.listen(a.cfg.DataPorts[k], a.id.DataPorts[k])
		if err != nil {
			closeAll()
			return fmt.Errorf("agent: listen for the %s data plane: %w", k, err)
		}
		dataLns[k] = ln
		port := ln.Addr().(*net.TCPAddr).Port
		a.mu.Lock()
		a.id.DataPorts[k] = port
		a.endpoints[k] = net.JoinHostPort(host, strconv.Itoa(port))
		a.mu.Unlock()
	}
	if err := a.saveIdentity(); err != nil {
		closeAll()
		return err
	}
	a.restoreExports(ctx, saved)

	var conns httpx.Conns
	srv := &http.Server{
		Handler:           a.Handler(),
		ConnState:         conns.Track,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelDebug),
	}
	serving := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(serving)
		var err error
		if a.tls != nil {
			srv.TLSConfig = a.tls.serverTLS()
			err = srv.ServeTLS(apiLn, "", "")
		} else {
			err = srv.Serve(apiLn)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("agent API stopped", "err", err)
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-apiStop
		// No new connection or request; the requests under way (their
		// context cancelled: their callers must expect the call to fail)
		// answer for up to apiStopTimeout; idle connections are closed
		// without waiting for clients to hang up.
		sctx, scancel := context.WithTimeout(context.Background(), apiStopTimeout)
		defer scancel()
		conns.Stop(sctx, srv, a.log, "agent API")
		<-serving
		a.log.Debug("agent API stopped")
	}()
	for k, ln := range dataLns {
		wg.Add(1)
		go func(k api.Kind, s Server, ln net.Listener) {
			defer wg.Done()
			if err := s.Serve(dctx, ln); err != nil && dctx.Err() == nil {
				a.log.Error("data plane stopped", "kind", k, "err", err)
			}
			a.log.Debug("data plane stopped", "kind", k)
		}(k, a.drivers[k].(Server), ln)
	}
	for k := range kinds {
		r, ok := a.drivers[k].(Runner)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(dctx); err != nil && dctx.Err() == nil {
				a.log.Error("data plane stopped", "kind", k, "err", err)
			}
			a.log.Debug("data plane stopped", "kind", k)
		}()
	}

	up = true
	if err := a.join(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	// The loop's first round confirms (serves) or tears down the
	// restored exports; the ports of those it did not serve are let go
	// after it. The loop stops exports at their expiry meanwhile too (the
	// control plane prepares on a node it has answered the join of).
	a.heartbeatLoop(ctx, func() {
		a.reserved.releaseAll()
		close(a.ready)
		a.log.Info("agent ready", "node", a.NodeID(), "url", a.AgentURL())
	})
	return nil
}

// listen binds the configured port, else the remembered one if it is
// free, else any free port. The listener lets go of its port as it
// closes, though a child process shares its socket (letgo): the next
// agent (a restart in this process) binds the port again.
func (a *Agent) listen(configured, remembered int) (net.Listener, error) {
	if configured != 0 {
		return letgo.Listen("tcp", net.JoinHostPort(a.cfg.Listen, strconv.Itoa(configured)))
	}
	if remembered != 0 {
		a.reserved.release(strconv.Itoa(remembered))
		if ln, err := letgo.Listen("tcp", net.JoinHostPort(a.cfg.Listen, strconv.Itoa(remembered))); err == nil {
			return ln, nil
		}
		a.log.Warn("remembered port is busy; using a new one", "port", remembered)
	}
	return letgo.Listen("tcp", net.JoinHostPort(a.cfg.Listen, "0"))
}

func (a *Agent) loadIdentity() error {
	var id identity
	path := filepath.Join(a.cfg.StateDir, identityFile)
	if err := readJSON(path, &id); err != nil {
		return err
	}
	if a.cfg.MachineID != "" {
		id.MachineID = a.cfg.MachineID
	}
	if len(id.MachineID) > api.MaxMachineIDLen {
		// A hand-edited or damaged file: the control plane refuses (400)
		// every join presenting it. The derived one is what this host
		// and name had, unless an earlier configuration set another.
		a.log.Warn("identity.json: its machine_id is longer than the control plane takes; using the one derived from this host and the node name",
			"file", path, "len", len(id.MachineID), "max_len", api.MaxMachineIDLen)
		id.MachineID = ""
	}
	if id.MachineID == "" {
		id.MachineID = MachineID(a.cfg.SysRoot, a.cfg.Name)
	}
	if len(id.Credential) > api.MaxCredentialLen {
		// A hand-edited or damaged file: the control plane issues none
		// that long, and refuses (400) every join presenting one. Without
		// it the join is unproven (unless a previous credential or the
		// node certificate proves it), as an agent's whose identity lost
		// its credential. Its length only: it is a secret.
		a.log.Warn("identity.json: dropped its current credential, longer than the control plane takes; joining without it (unless a previous credential or the node certificate proves the join, the node is taken over once it is down, its leases lost)",
			"file", path, "len", len(id.Credential), "max_len", api.MaxCredentialLen)
		id.Credential = ""
	}
	if kept, dropped := validPreviousCredentials(id.Credential, id.PreviousCredentials); dropped > 0 {
		// A hand-edited or damaged file: a join presenting them all would
		// be refused (400), for good. The count only: they are secrets.
		a.log.Warn("identity.json: dropped previous credentials a join cannot present (empty, repeated, the current one, longer than the control plane takes, or beyond the newest it takes)",
			"dropped", dropped, "kept", len(kept), "max", api.MaxPreviousCredentials, "max_len", api.MaxCredentialLen)
		id.PreviousCredentials = kept
	}
	a.mu.Lock()
	a.id = id
	a.mu.Unlock()
	return nil
}

func (a *Agent) saveIdentity() error {
	a.mu.Lock()
	id := a.id
	a.mu.Unlock()
	return writeJSON(filepath.Join(a.cfg.StateDir, identityFile), id)
}

// openDevices sets up every configured device with its driver. The block
// devices are open and locked already (lockBlockDevices), which refused
// two names on one file: it would be lent twice, the ranges of each name
// being kept apart, not those of the file.
func (a *Agent) openDevices(ctx context.Context) error {
	for _, d := range a.cfg.Devices {
		if d.Kind == api.KindBlock && !filepath.IsAbs(d.Path) {
			d.Path = filepath.Join(a.cfg.StateDir, d.Path)
		}
		if d.Sharing == "" {
			// Block and memory lend byte ranges, accelerators lend slots:
			// each lease takes a part unless the device is declared
			// exclusive.
			d.Sharing = "partitionable"
		}
		if o, ok := a.drivers[d.Kind].(Opener); ok {
			nd, err := o.Open(ctx, d)
			if err != nil {
				return fmt.Errorf("agent: device %s: %w", d.Name, err)
			}
			d = nd
		}
		a.mu.Lock()
		a.devices[d.Name] = d
		a.mu.Unlock()
	}
	return nil
}

func (a *Agent) closeDrivers() {
	if !a.opMu.TryLock() {
		a.log.Info("agent stopping: waiting for the lease operation under way (a prepare, or a teardown and its wipe)")
		a.opMu.Lock()
	}
	defer a.opMu.Unlock()
	for _, d := range a.drivers {
		if c, ok := d.(Closer); ok {
			if err := c.Close(); err != nil {
				a.log.Warn("closing driver", "err", err)
			}
		}
	}
}

// fingerprint describes the host.
func (a *Agent) fingerprint() api.Fingerprint {
	cores, mem, blocks, nics := FingerprintHost(a.cfg.SysRoot)
	host, _ := os.Hostname()
	return api.Fingerprint{
		MachineID:    a.MachineID(),
		Hostname:     host,
		Cores:        cores,
		MemoryBytes:  mem,
		BlockDevices: blocks,
		NICs:         nics,
	}
}

func (a *Agent) joinRequest() api.JoinRequest {
	req := api.JoinRequest{
		Name:        a.cfg.Name,
		Version:     a.cfg.Version,
		Labels:      a.cfg.Labels,
		Fingerprint: a.fingerprint(),
	}
	a.mu.Lock()
	req.Address = a.host
	req.AgentURL = a.agentURL
	req.LostExports = a.id.LostExports
	// The node's current credential proves that this is its agent, not
	// another machine claiming its machine ID (a known machine's live
	// node is taken over only with it): it goes in the body, never in a
	// log line or an argument. So do the credentials earlier joins
	// answered, while the control plane holds one of them as the node's
	// (its database restored from a backup older than the last join).
	req.Credential = a.id.Credential
	req.PreviousCredentials = slices.Clone(a.id.PreviousCredentials)
	if len(a.endpoints) > 0 {
		req.Endpoints = map[api.Kind]string{}
		for k, v := range a.endpoints {
			req.Endpoints[k] = v
		}
	}
	a.mu.Unlock()
	for _, d := range a.Devices() {
		req.Devices = append(req.Devices, api.DeviceSpec{
			Name: d.Name, Kind: d.Kind, Capacity: d.Size, Model: d.Model,
			Attributes: d.Attributes, Sharing: d.Sharing,
		})
	}
	return req
}

// previousCredentials returns the credentials to keep after a join
// replaced the node credential cur with next: cur, then those kept
// before (prev, newest first), without next or repeats, at most
// api.MaxPreviousCredentials.
func previousCredentials(cur string, prev []string, next string) []string {
	out := make([]string, 0, api.MaxPreviousCredentials)
	for _, c := range append([]string{cur}, prev...) {
		if len(out) == api.MaxPreviousCredentials {
			break
		}
		if c != "" && c != next && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// validPreviousCredentials returns the previous credentials prev (newest
// first), as identity.json holds them, that a join can present
// (api.JoinRequest.PreviousCredentials): the newest
// api.MaxPreviousCredentials of those that are neither empty, nor longer
// than api.MaxCredentialLen, nor the current credential cur, nor a repeat;
// and how many it dropped.
func validPreviousCredentials(cur string, prev []string) (kept []string, dropped int) {
	kept = make([]string, 0, min(len(prev), api.MaxPreviousCredentials))
	for _, c := range prev {
		if c == "" || len(c) > api.MaxCredentialLen || c == cur || slices.Contains(kept, c) || len(kept) == api.MaxPreviousCredentials {
			dropped++
			continue
		}
		kept = append(kept, c)
	}
	return kept, dropped
}

// join registers with the control plane, retrying transient failures
// until ctx ends. A rejected bootstrap token is returned as an error.
func (a *Agent) join(ctx context.Context) error {
	cl := api.NewClient(a.cfg.ControlPlane, a.cfg.BootstrapToken, a.hc)
	retry := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second, Clock: a.clock}
	for {
		if before := a.Faults.BeforeJoin.Load(); before != nil {
			(*before)(ctx)
		}
		req := a.joinRequest()
		if a.tls != nil {
			csr, err := a.csr(req.Address)
			if err != nil {
				return err
			}
			req.CSR = csr
		}
		// A served export's known expiry bounds the call (a rejoin after
		// a 401 while exports are served), as it does a heartbeat's.
		jctx, jcancel := a.untilExpiryRound(ctx)
		resp, err := cl.Join(jctx, req)
		jcancel()
		if hold := a.Faults.HoldJoinAnswer.Load(); err == nil && hold != nil {
			select {
			case <-*hold:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err == nil && a.tls != nil {
			// In memory first: the control plane may call as soon as it
			// has answered; the file is written below.
			if resp.Certificate == "" {
				return fmt.Errorf("agent: the control plane issued no node certificate (it runs without a cluster CA, and this agent was given one)")
			}
			a.useCA(resp.CACertificate)
			if err := a.useCert(resp.Certificate); err != nil {
				return err
			}
			a.useCRL(resp.CRL)
		}
		if err == nil {
			a.mu.Lock()
			a.id.NodeID = resp.NodeID
			a.id.PreviousCredentials = previousCredentials(a.id.Credential, a.id.PreviousCredentials, resp.Credential)
			a.id.Credential = resp.Credential
			a.id.AgentKey = resp.AgentKey
			if req.LostExports {
				// Told (a control plane that predates the field ignores
				// it: its leases here stay until they expire).
				a.id.LostExports = false
				if len(resp.LostLeases) > 0 {
					a.log.Warn("the control plane recorded the leases of the lost exports lost", "leases", len(resp.LostLeases))
				}
			}
			if a.cfg.HeartbeatInterval == 0 && resp.HeartbeatSeconds > 0 {
				a.interval = time.Duration(resp.HeartbeatSeconds * float64(time.Second))
			}
			a.peers = a.otherPeers(resp.ControlPlaneNodes, resp.NodeID)
			a.answeredLocked(true)
			a.mu.Unlock()
			a.joinedOnce.Do(func() { close(a.joined) })
			a.log.Info("joined", "node", resp.NodeID, "credential", resource.Fingerprint(resp.Credential))
			if a.tls != nil {
				if err := a.saveCert(resp.Certificate); err != nil {
					return err
				}
			}
			return a.saveIdentity()
		}
		if api.IsCode(err, api.CodeUnauthorized) || api.IsCode(err, api.CodeForbidden) || api.IsCode(err, api.CodeInvalid) {
			return fmt.Errorf("agent: join rejected: %w", err)
		}
		if err := plainRefusal(a.cfg.ControlPlane, err); err != nil {
			return err
		}
		wait := retry.Next()
		a.mu.Lock()
		a.answeredLocked(false)
		a.mu.Unlock()
		a.enforceExpiry(ctx, false)
		if next, ok := a.nextExpiry(); ok {
			// Try again by the next known expiry, not after it.
			wait = min(wait, max(next.Sub(a.clock.Now()), 50*time.Millisecond))
		}
		if api.IsCode(err, api.CodeConflict) {
			// This machine's node is live, and this join could not prove
			// it is that node's agent (its state directory was lost, or
			// the node was taken over meanwhile): it is accepted once the
			// node is down, or removed.
			a.log.Warn("join refused: this machine's node is live and this agent does not hold its credential; retrying until the node is down or removed",
				"err", err, "in", wait)
		} else {
			a.log.Warn("join failed; retrying", "err", err, "in", wait)
		}
		if err := retry.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// plainRefusal is the error a join ends with when err, the join's, is a
// plain 400 (api.Error.Plain: a body that is not the API's) from the
// control plane's address cp: not the control plane refusing the join but
// the address being wrong, which no retry mends. The commonest is Go's
// HTTPS server answering plain HTTP ("Client sent an HTTP request to an
// HTTPS server."): the address says http:// where the control plane
// serves HTTPS. nil for any other err.
func plainRefusal(cp string, err error) error {
	var ae *api.Error
	if !errors.As(err, &ae) || !ae.Plain || ae.Status != http.StatusBadRequest {
		return nil
	}
	if strings.Contains(ae.Message, "HTTP request to an HTTPS server") {
		return fmt.Errorf("agent: join: the control plane serves HTTPS: write its address (%s, --addr or RIALTO_ADDR) with https://: %w", cp, err)
	}
	return fmt.Errorf("agent: join: the server at the control plane's address (%s) answered 400 in words that are not the API's: is it the control plane's address? %w", cp, err)
}

func (a *Agent) otherPeers(nodes []api.Node, self string) []api.Node {
	var out []api.Node
	for _, n := range nodes {
		if n.ID != self && n.AgentURL != "" {
			out = append(out, n)
		}
	}
	return out
}

// expiryAskAhead is how long before a served export's known expiry the
// heartbeat loop asks the control plane about its lease (a heartbeat
// round), so that a renewal reaches the agent before the export stops.
const expiryAskAhead = 2 * time.Second

// expiryRoundTimeout is how long after the earliest known expiry of a
// served export a call to the control plane under way (a heartbeat round,
// a join) is given up (untilExpiryRound).
const expiryRoundTimeout = 2 * time.Second

// heartbeatInterval is the time between heartbeat rounds.
func (a *Agent) heartbeatInterval() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.interval <= 0 {
		return 5 * time.Second
	}
	return a.interval
}

// heartbeatLoop runs the heartbeat rounds, each on a goroutine of its
// own, one at a time (the loop waits for the last before it returns), and
// stops serving exports at their known expiry:
//
//   - a round at once (Run's first: firstDone is called once it has
//     ended, or as the loop returns);
//   - a round every heartbeat interval, timed from the end of the last;
//   - a round expiryAskAhead before the earliest known expiry of a served
//     export, unless one began since then, so that a renewal the control
//     plane has by then reaches the agent before the expiry;
//   - likewise for an export prepared (or moved here) after the last
//     round began, once that round has ended, whenever it began: the
//     answer to a round judges only the exports prepared before its
//     heartbeat left (reconcile), so a part whose move committed during
//     a round that began in the last expiryAskAhead before its expiry
//     was stopped at that expiry though the lease had been renewed, and
//     served again only after the next round;
//   - at the instant that expiry passes, it stops serving the exports
//     whose known expiry has passed (enforceExpiry), whether a round is
//     under way or not, then asks again (a round, at once or once the one
//     under way ends): an answer that shows a lease renewed serves its
//     exports again;
//   - a round once an incoming transfer's expiry passes (the round gives
//     it up: expireTransfers).
//
// It plans each wait when it wakes; a change that brings the earliest
// known expiry of a served export before the one it planned for (a
// prepare, an answer that shortens a lease) wakes it to plan again
// (exportsChangedLocked), as does an incoming transfer.
func (a *Agent) heartbeatLoop(ctx context.Context, firstDone func()) {
	var (
		done    chan struct{} // closed when the round under way ends; nil: none
		again   = true        // a round is wanted once the one under way ends
		beatDue bool          // the interval since the last round has passed
		began   time.Time     // when the last round began
		// The exports prepared (or moved here) up to when the last round
		// began (Export.prepared): its answer judges no later one.
		beganMark uint64
	)
	// The interval is timed, not compared with the time: on a clock
	// whose time moves apart from its timers (clock.FakeNow) rounds
	// still come every interval.
	beat := a.clock.NewTimer(a.heartbeatInterval()) // armed while no round runs
	defer func() {
		beat.Stop()
		if done != nil {
			<-done
		}
		if firstDone != nil {
			firstDone()
		}
	}()
	for {
		a.mu.Lock()
		a.loopPlanned = false // what changes from here on wakes the loop
		a.mu.Unlock()
		now := a.clock.Now()
		// Only the exports whose known expiry passed (keepUnknown: those
		// of unknown expiry stop after a round the control plane did
		// not answer); asked again, an answer may serve them again.
		if a.enforceExpiry(ctx, true) > 0 {
			again = true
		}
		exp, hasExp := a.nextExpiry()
		ask := exp.Add(-expiryAskAhead)
		if hasExp && !now.Before(ask) && began.Before(ask) {
			again = true
		}
		// An export prepared after the last round began (a part whose
		// move committed while it was under way) was not asked about by
		// it, whenever it began: asked expiryAskAhead before its expiry,
		// once that round has ended.
		uexp, hasU := a.nextExpiryAfter(beganMark)
		uask := uexp.Add(-expiryAskAhead)
		if hasU && !now.Before(uask) {
			again = true
		}
		xfer, hasXfer := a.nextTransferExpiry()
		if done == nil && (again || beatDue || (hasXfer && !now.Before(xfer) && began.Before(xfer))) {
			a.mu.Lock()
			beganMark = a.prepares
			a.mu.Unlock()
			again, beatDue, began, hasU = false, false, now, false
			beat.Stop()
			done = make(chan struct{})
			go func(done chan<- struct{}) {
				defer close(done)
				if err := a.Heartbeat(ctx); err != nil && ctx.Err() == nil {
					a.log.Warn("heartbeat failed", "err", err)
				}
			}(done)
		}

		// When to wake next, besides the interval, a signal and the
		// round's end (zero: none).
		var at time.Time
		switch {
		case !hasExp:
		case !exp.After(now):
			// enforceExpiry could not stop it (and warned): again soon.
			at = now.Add(50 * time.Millisecond)
		case done == nil && began.Before(ask):
			at = ask // after now: the round would have begun
		default:
			at = exp
		}
		if done == nil && hasXfer && began.Before(xfer) && (at.IsZero() || xfer.Before(at)) {
			at = xfer
		}
		if done == nil && hasU && (at.IsZero() || uask.Before(at)) {
			at = uask
		}
		a.mu.Lock()
		a.loopPlanned, a.loopExpiry = true, exp
		a.mu.Unlock()
		var timer <-chan time.Time
		var t clock.Timer
		if !at.IsZero() {
			t = clock.TimerAt(a.clock, at)
			timer = t.C()
		}
		select {
		case <-ctx.Done():
		case <-a.wake:
		case <-timer:
		case <-beat.C():
			beatDue = true
		case <-done:
			done = nil
			beat.Reset(a.heartbeatInterval())
			if firstDone != nil {
				firstDone()
				firstDone = nil
			}
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// Heartbeat runs one heartbeat round now: it probes peers, reports health,
// links and the leases it holds exports of (all of them, with the ranges
// it wipes and the exports it lost: api.Heartbeat.LeasesComplete, made
// after it read the last answer, whose check it sends back, so that the
// control plane may take a lease they do not list as not served here;
// and the exports of those leases, by part: api.Heartbeat.Exports),
// tears down what the answer
// lists, serves the held exports the answer confirms, records the leases'
// expiries, stops serving any export whose lease's known expiry has passed
// (and serves it again once an answer shows it renewed), and retries
// unfinished wipes. While Faults.PauseHeartbeats is set it sends nothing
// and acts as if the control plane were unreachable. A node credential the
// control plane no longer knows makes the agent join again.
func (a *Agent) Heartbeat(ctx context.Context) error {
	a.hbMu.Lock()
	defer a.hbMu.Unlock()
	defer func() {
		a.expireTransfers(ctx)
		if err := a.retryWipes(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("unfinished wipes failed again; their ranges stay unlendable", "err", err)
		}
	}()
	if a.Faults.PauseHeartbeats.Load() {
		a.mu.Lock()
		a.answeredLocked(false)
		a.mu.Unlock()
		a.enforceExpiry(ctx, false)
		return nil
	}
	a.mu.Lock()
	nodeID, cred := a.id.NodeID, a.id.Credential
	peers := a.peers
	cpRTT, cpUp := a.cpRTT, a.cpUp
	measured := !a.lastBeatAt.IsZero()
	leases := a.leasesLocked()
	exports := a.exportsLocked()
	wiping := a.wipingLocked() // with the leases: a range leaves one for the other under a.mu
	moved := a.movedLocked()
	lost := a.lostLocked()
	check := a.check
	// The answer says what the control plane wanted when it read the
	// leases, which may be before a prepare that arrives meanwhile: it
	// judges only the exports prepared by now.
	mark := a.prepares
	a.mu.Unlock()
	if nodeID == "" {
		return ErrNotJoined
	}
	hb := api.Heartbeat{Health: a.health(), Leases: leases, Wiping: wiping, Moved: moved, Lost: lost, Links: a.probePeers(ctx, a.probeRound(peers)), Usage: a.usage(),
		CRLNumber: a.crlNumber(), CAHash: a.caHash(), Version: a.cfg.Version, LeasesComplete: true, Check: check, Exports: exports, ExportsComplete: true}
	if measured && cpUp {
		hb.Links = append(hb.Links, api.LinkReport{To: "controlplane", RTTMicros: cpRTT, Up: true})
	}
	cl := api.NewClient(a.cfg.ControlPlane, cred, a.hc)
	sent := a.clock.Now()
	start := time.Now()
	hctx, cancel := a.untilExpiryRound(ctx)
	resp, err := cl.Heartbeat(hctx, nodeID, hb)
	cancel()
	rtt := float64(time.Since(start).Nanoseconds()) / 1e3
	// The link to the control plane is reported up with the round trip of
	// the last heartbeat it answered, even with an error (401 for a
	// forgotten node or a revoked certificate, 503): a report reaches the
	// control plane only over that link. Reported down after a failed
	// round (the first heartbeat after a join, or after the control plane
	// was unreachable), it would cut the node off placement's fabric
	// graph until one more heartbeat.
	var ae *api.Error
	a.mu.Lock()
	a.lastBeatAt = a.clock.Now()
	if err == nil || errors.As(err, &ae) {
		a.cpRTT, a.cpUp = rtt, true
	}
	a.answeredLocked(err == nil)
	a.mu.Unlock()
	if err != nil {
		a.mHeartbeats.WithLabelValues("error").Inc()
		a.enforceExpiry(ctx, false)
		if ae != nil && !ae.Plain && (ae.Code == api.CodeUnauthorized || ae.Code == api.CodeNotFound) {
			a.log.Warn("control plane does not know this node; joining again", "code", ae.Code)
			return a.join(ctx)
		}
		return err
	}
	a.mHeartbeats.WithLabelValues("ok").Inc()
	a.useCA(resp.CACertificate)
	a.useCRL(resp.CRL)
	a.mu.Lock()
	if resp.Peers != nil {
		a.peers = a.otherPeers(resp.Peers, nodeID)
	}
	if a.cfg.HeartbeatInterval == 0 && resp.HeartbeatSeconds > 0 {
		// The control plane spreads heartbeats as the cluster grows.
		a.interval = time.Duration(resp.HeartbeatSeconds * float64(time.Second))
	}
	if resp.Check != "" {
		a.check = resp.Check
	}
	a.mu.Unlock()
	if len(resp.Moved) > 0 {
		a.recordMoved(resp.Moved, moved)
	}
	if len(resp.Lost) > 0 {
		a.recordLost(resp.Lost)
	}
	for _, id := range resp.Teardown {
		if err := a.teardownAnswered(ctx, id, mark); err != nil {
			a.log.Warn("teardown requested by the control plane failed", "lease", id, "err", err)
		}
	}
	a.reconcile(ctx, resp.Leases, resp.Now, sent, mark)
	a.enforceExpiry(ctx, true)
	if err := a.renewCert(ctx, nodeID, cred); err != nil && ctx.Err() == nil {
		a.log.Warn("node certificate not renewed; retrying with the next heartbeat", "err", err)
	}
	return nil
}

// answeredLocked records the outcome of a call to the control plane (a
// heartbeat or a join): ok, answered without an error. a.mu is held.
func (a *Agent) answeredLocked(ok bool) {
	a.cpAnswered = ok
	if ok {
		a.cpAnsweredAt = a.clock.Now()
	}
}

// untilExpiryRound bounds a call to the control plane to end
// expiryRoundTimeout after the earliest known expiry of a served export
// (on the agent's clock), or after the call began if that expiry had
// passed by then. The heartbeat loop stops serving the export at
// that expiry whatever the call, and asks the control plane again once the
// round under way ends: a control plane that stopped answering in the
// middle of a round (or of a join) holds that back no longer than this.
//
// The bound follows the expiries learned while the call is under way: an
// export prepared meanwhile whose expiry is earlier than the one known
// when the call began (or the first one) brings it earlier.
func (a *Agent) untilExpiryRound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	b := &callBound{cancel: cancel, start: a.clock.Now()}
	a.mu.Lock()
	if a.calls == nil {
		a.calls = map[*callBound]struct{}{}
	}
	a.calls[b] = struct{}{}
	a.boundCallLocked(b)
	a.mu.Unlock()
	return ctx, func() {
		a.mu.Lock()
		delete(a.calls, b)
		if b.t != nil {
			b.t.Stop()
		}
		a.mu.Unlock()
		cancel()
	}
}

// callBound is a call to the control plane that untilExpiryRound bounds.
type callBound struct {
	cancel context.CancelFunc // gives the call up
	start  time.Time          // when the call began
	t      clock.Timer        // calls cancel at at (nil: no bound yet)
	at     time.Time
}

// boundCallLocked makes b's call end expiryRoundTimeout after the
// earliest known expiry of a served export (or after the call began, if
// that expiry had passed by then), if that is earlier than its bound so
// far; a.mu is held.
func (a *Agent) boundCallLocked(b *callBound) {
	next, ok := a.nextExpiryLocked()
	if !ok {
		return
	}
	at := maxTime(next, b.start).Add(expiryRoundTimeout)
	if b.t != nil {
		if !at.Before(b.at) {
			return
		}
		b.t.Stop()
	}
	b.at = at
	b.t = clock.AfterFuncAt(a.clock, at, b.cancel)
}

// maxTime is the later of x and y.
func maxTime(x, y time.Time) time.Time {
	if x.After(y) {
		return x
	}
	return y
}

// PauseHeartbeats sets Faults.PauseHeartbeats and, when pausing, waits
// for a heartbeat in flight to finish, so that none is sent after it
// returns.
func (a *Agent) PauseHeartbeats(pause bool) {
	a.Faults.PauseHeartbeats.Store(pause)
	if pause {
		a.hbMu.Lock()
		//lint:ignore SA2001 an empty critical section waits for the round in flight
		a.hbMu.Unlock()
	}
}

// health reports "ok" or what is wrong with the lent devices.
func (a *Agent) health() string {
	for _, d := range a.Devices() {
		if d.Kind == api.KindBlock {
			if _, err := os.Stat(d.Path); err != nil {
				return fmt.Sprintf("device %s: backing file unavailable", d.Name)
			}
		}
	}
	return "ok"
}

// MaxProbesPerBeat bounds the peers probed in one heartbeat round; with
// more peers the agent rotates through them, so each link is measured
// every ceil(peers/MaxProbesPerBeat) heartbeats.
const MaxProbesPerBeat = 16

// probeRound picks this round's peers.
func (a *Agent) probeRound(peers []api.Node) []api.Node {
	if len(peers) <= MaxProbesPerBeat {
		return peers
	}
	a.mu.Lock()
	start := a.probeNext % len(peers)
	a.probeNext = start + MaxProbesPerBeat
	a.mu.Unlock()
	out := make([]api.Node, 0, MaxProbesPerBeat)
	for i := range MaxProbesPerBeat {
		out = append(out, peers[(start+i)%len(peers)])
	}
	return out
}

// probePeers measures the round-trip time to each peer's agent API.
func (a *Agent) probePeers(ctx context.Context, peers []api.Node) []api.LinkReport {
	if len(peers) == 0 {
		return nil
	}
	out := make([]api.LinkReport, len(peers))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i] = a.probe(ctx, p)
		}()
	}
	wg.Wait()
	return out
}

func (a *Agent) probe(ctx context.Context, p api.Node) api.LinkReport {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	rep := api.LinkReport{To: p.ID}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.AgentURL+"/agent/v1/ping", nil)
	if err != nil {
		return rep
	}
	start := time.Now()
	resp, err := a.peerHC.Do(req)
	if err != nil {
		return rep
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	rep.RTTMicros = float64(time.Since(start).Nanoseconds()) / 1e3
	rep.Up = resp.StatusCode == http.StatusOK
	return rep
}
