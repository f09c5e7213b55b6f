package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/pki"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	builtinDrivers[api.KindAccel] = func(l *slog.Logger, host string) Driver { return NewAccelDriver(l, host) }
}

// DefaultSlotMemory is each accelerator slot's memory unless the device's
// "slot_memory" attribute says otherwise.
const DefaultSlotMemory = 16 << 20

// AccelDriver lends accelerator slots: each accel device is an appliance
// (internal/dataplane/accel/appliance) whose slots listen on ports of their
// own. Prepare requests count slot units (api.SlotUnits a slot). A
// dedicated lease's range is whole slots, which accept the lease's export
// name as credential and run the requested role. A shared lease (Gateway
// set in its prepare request) holds a share of one slot and is served by a
// batching gateway (internal/dataplane/accel/gateway) that the driver runs
// for every shared lease of the same device, role and role config: the
// gateway owns the slots its leases' shares fall in (the first share of a
// slot loads the role there), and accepts the lease's export name, weighted
// by its share, until the lease ends.
//
// ManagementToken and Metrics are read when devices are opened and
// gateways started; set them before the agent runs.
type AccelDriver struct {
	log  *slog.Logger
	host string

	// ManagementToken, if set, is the bearer token each appliance's
	// management API (Appliance(name).Handler()) requires.
	ManagementToken string

	mu     sync.Mutex
	srvTLS *tls.Config                     // slots and gateways require TLS with it (UseTLS)
	cliTLS func() *tls.Config              // for dialling TLS data planes (UseTLS)
	track  pki.TrackFunc                   // registers those connections with the revocation list (UseTLS)
	apps   map[string]*appliance.Appliance // by device name
	gwCfg  map[string]gwConfig             // by device name
	live   map[string]Export               // by export name
	gws    *gatewayPool                    // the shared leases' gateways
	reg    *prometheus.Registry
}

// NewAccelDriver returns an accelerator driver whose slots bind host.
func NewAccelDriver(log *slog.Logger, host string) *AccelDriver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &AccelDriver{log: log, host: host, apps: map[string]*appliance.Appliance{}, gwCfg: map[string]gwConfig{},
		live: map[string]Export{}, gws: newGatewayPool(log, host)}
}

// UseMetrics implements MetricsUser: slot and gateway metrics go to reg.
func (d *AccelDriver) UseMetrics(reg *prometheus.Registry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reg = reg
}

// Appliance returns the appliance of an opened device, or nil.
func (d *AccelDriver) Appliance(device string) *appliance.Appliance {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.apps[device]
}

// UseTLS implements TLSUser: with a server configuration every slot's
// mailbox and every gateway require TLS (URIs are rialto-accels://), the
// gateways dial their slots over TLS, and slots serve no UDP message path
// (datagrams are not encrypted); slots dial block leases with client.
// Those connections, the gateways' to their slots and the slots' to
// block parts, are registered with track: a later revocation list that
// revokes the certificate of their server ends them. Call it before
// Open.
func (d *AccelDriver) UseTLS(server *tls.Config, client func() *tls.Config, track pki.TrackFunc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.srvTLS, d.cliTLS, d.track = server, client, track
	d.gws.srvTLS = server
	if server != nil {
		d.gws.slotTLS, d.gws.slotTrack = client, track
	}
}

// Open builds the device's appliance with dev.Size slots.
func (d *AccelDriver) Open(_ context.Context, dev DeviceConfig) (DeviceConfig, error) {
	mem := uint64(DefaultSlotMemory)
	if s := dev.Attributes["slot_memory"]; s != "" {
		n, err := resource.ParseSize(s)
		if err != nil || n <= 0 {
			return dev, fmt.Errorf("bad slot_memory %q", s)
		}
		mem = uint64(n)
	}
	gc, err := gatewayConfig(dev)
	if err != nil {
		return dev, err
	}
	d.mu.Lock()
	reg, srvTLS, cliTLS, track := d.reg, d.srvTLS, d.cliTLS, d.track
	d.mu.Unlock()
	// Without TLS every slot also serves its requests as UDP datagrams on
	// its mailbox's port, one socket (queue) per worker; datagrams carry
	// no TLS, so slots that require it serve none.
	udp := runtime.GOMAXPROCS(0)
	if srvTLS != nil {
		udp = 0
	}
	app, err := appliance.New(appliance.Config{ID: dev.Name, Slots: int(dev.Size), SlotMemory: mem, Host: d.host, Logger: d.log,
		Metrics: registerer(reg), ManagementToken: d.ManagementToken, ManagedLeases: true, UDPQueues: udp, TLS: srvTLS,
		BlockTLS: cliTLS, BlockTrack: track})
	if err != nil {
		return dev, err
	}
	// A copy: the caller's map (its Config.Devices) is not ours to write.
	attrs := make(map[string]string, len(dev.Attributes)+3)
	maps.Copy(attrs, dev.Attributes)
	dev.Attributes = attrs
	dev.Attributes["slot_memory"] = strconv.FormatUint(mem, 10)
	dev.Attributes["roles"] = strings.Join(roles.Names(), ",")
	dev.Attributes["modes"] = "dedicated,shared"
	d.mu.Lock()
	defer d.mu.Unlock()
	if old := d.apps[dev.Name]; old != nil {
		old.Close()
	}
	d.apps[dev.Name] = app
	d.gwCfg[dev.Name] = gc
	return dev, nil
}

// Run serves every appliance until ctx ends, then stops the gateways.
func (d *AccelDriver) Run(ctx context.Context) error {
	d.mu.Lock()
	apps := make([]*appliance.Appliance, 0, len(d.apps))
	for _, a := range d.apps {
		apps = append(apps, a)
	}
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, a := range apps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Run(ctx); err != nil && ctx.Err() == nil {
				d.log.Error("appliance stopped", "err", err)
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
	d.stopGateways()
	return nil
}

// stopGateways stops every gateway (outside the lock: a gateway's stop
// waits for its goroutines).
func (d *AccelDriver) stopGateways() {
	d.mu.Lock()
	gws := d.gws.takeAll()
	d.mu.Unlock()
	for _, g := range gws {
		g.stop()
	}
}

// spec is the role spec a prepare request asks for.
func spec(r api.PrepareRequest) roles.Spec {
	s := roles.Spec{Name: r.Role}
	if c := r.RoleConfig; c != nil {
		s.Config, s.Module, s.WasmMemoryPages = c.Config, c.Module, c.WasmMemoryPages
	}
	return s
}

// slotRange returns the slots [from, to) a prepare request's range (in
// slot units, api.SlotUnits a slot) falls in: a dedicated lease's range is
// whole slots; a shared lease's share lies inside one slot.
func slotRange(r api.PrepareRequest) (from, to int64, err error) {
	const u = api.SlotUnits
	switch {
	case r.Length <= 0 || r.Offset < 0:
		return 0, 0, fmt.Errorf("%w: no slots", ErrOutOfRange)
	case r.Gateway && r.Offset/u != (r.Offset+r.Length-1)/u:
		return 0, 0, fmt.Errorf("%w: a share (offset %d, length %d) must lie inside one slot of %d units", ErrBadRequest, r.Offset, r.Length, u)
	case r.Gateway:
		return r.Offset / u, r.Offset/u + 1, nil
	case r.Offset%u != 0 || r.Length%u != 0:
		return 0, 0, fmt.Errorf("%w: a dedicated range (offset %d, length %d) must be whole slots of %d units", ErrBadRequest, r.Offset, r.Length, u)
	}
	return r.Offset / u, (r.Offset + r.Length) / u, nil
}

// slotAddrs returns the addresses of the lease's slots, with e.Host as host.
func slotAddrs(app *appliance.Appliance, e Export) ([]string, error) {
	from, to, err := slotRange(e.Request)
	if err != nil {
		return nil, err
	}
	var addrs []string
	for i := from; i < to; i++ {
		a, err := app.Addr(int(i))
		if err != nil {
			return nil, err
		}
		if _, port, err := net.SplitHostPort(a); err == nil && e.Host != "" {
			a = net.JoinHostPort(e.Host, port)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no slots", ErrOutOfRange)
	}
	return addrs, nil
}

// roleError marks errors of the requested role or its config as the
// borrower's (the agent answers 400).
func roleError(err error) error {
	for _, s := range []error{roles.ErrUnknownRole, roles.ErrBadConfig, roles.ErrBadModule} {
		if errors.Is(err, s) {
			return fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
	}
	return err
}

// Prepare loads the role (with its config) into the lease's slots. A
// dedicated lease's slots take its export name as credential; the URI
// names the first slot, further slots follow in a "slots" query parameter.
// A shared lease's slots join the gateway for its role, whose URI carries
// "gateway=ROLE".
func (d *AccelDriver) Prepare(ctx context.Context, e Export) (api.PrepareResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	app := d.apps[e.Device.Name]
	if app == nil {
		return api.PrepareResponse{}, fmt.Errorf("%w: %s has no appliance", ErrNoDevice, e.Device.Name)
	}
	if c := e.Request.RoleConfig; c != nil && len(c.Config)+len(c.Module) > api.MaxRoleConfig {
		return api.PrepareResponse{}, fmt.Errorf("%w: role config above %d bytes", ErrBadRequest, api.MaxRoleConfig)
	}
	if e.Request.Gateway {
		return d.prepareShared(ctx, app, e)
	}
	if _, ok := d.live[e.Request.Export]; !ok {
		d.restoreSlotPorts(app, e)
	}
	addrs, err := slotAddrs(app, e)
	if err != nil {
		return api.PrepareResponse{}, err
	}
	uri := accel.URI{Slots: addrs, Credential: e.Request.Export, TLS: d.srvTLS != nil}.String()
	from, to, _ := slotRange(e.Request) // slotAddrs checked it
	if _, ok := d.live[e.Request.Export]; ok {
		if err := setSlotDeadlines(app, e, from, to); err != nil {
			return api.PrepareResponse{}, err
		}
		return api.PrepareResponse{URI: uri}, nil
	}
	if err := d.load(ctx, app, e.Request, from, to, []byte(e.Request.Export)); err != nil {
		return api.PrepareResponse{}, err
	}
	if err := setSlotDeadlines(app, e, from, to); err != nil {
		d.clear(app, from, to)
		return api.PrepareResponse{}, err
	}
	d.live[e.Request.Export] = e
	return api.PrepareResponse{URI: uri}, nil
}

// setSlotDeadlines makes the export's deadline (its known expiry,
// e.deadline) that of its slots [from, to): they refuse its requests from
// then on, whether the lease has ended there yet or not.
func setSlotDeadlines(app *appliance.Appliance, e Export, from, to int64) error {
	for i := from; i < to; i++ {
		if err := app.SetDeadline(int(i), e.deadline); err != nil {
			return err
		}
	}
	return nil
}

// previousPorts returns the ports a dedicated export's previous URI
// (e.URI) named for its slots, in slot order, or nil if there is none
// (or it is a gateway's).
func previousPorts(e Export) []string {
	if isGatewayURI(e.URI) {
		return nil
	}
	return uriPorts(e.URI)
}

// restoreSlotPorts moves the slots of a dedicated export being restored
// back to the ports its previous URI names. A port that cannot be bound
// leaves its slot where it is (the agent warns that the URI changed).
func (d *AccelDriver) restoreSlotPorts(app *appliance.Appliance, e Export) {
	ports := previousPorts(e)
	from, to, err := slotRange(e.Request)
	if err != nil || int64(len(ports)) != to-from {
		return
	}
	for i, port := range ports {
		id := int(from) + i
		cur, err := app.Addr(id)
		if err != nil {
			return
		}
		if _, p, err := net.SplitHostPort(cur); err == nil && p == port {
			continue
		}
		if err := app.Rebind(id, net.JoinHostPort(d.host, port)); err != nil {
			d.log.Warn("cannot serve a restored slot at its previous port", "device", e.Device.Name, "slot", id, "port", port, "err", err)
		}
	}
}

// isGatewayURI reports whether uri is a shared lease's (its gateway's).
func isGatewayURI(uri string) bool {
	u, err := url.Parse(uri)
	return err == nil && u.Query().Has("gateway")
}

// load loads the lease's role into slots [from, to) and sets their
// credential; on error it leaves them cleared.
func (d *AccelDriver) load(ctx context.Context, app *appliance.Appliance, r api.PrepareRequest, from, to int64, cred []byte) error {
	for i := from; i < to; i++ {
		if r.Role != "" {
			if err := app.Load(ctx, int(i), spec(r)); err != nil {
				d.clear(app, from, i)
				return roleError(err)
			}
		}
		if err := app.SetCredential(int(i), cred); err != nil {
			d.clear(app, from, i+1)
			return err
		}
	}
	return nil
}

// prepareShared lets a shared lease in at the gateway for its role and
// role config on its device. Its range is a share of one slot (in slot
// units); the slot serves that gateway only. The first share of a slot
// brings the slot into the gateway: the role is loaded into it with a
// credential of the gateway's own (borrowers reach slots only through the
// gateway). A later share of the same slot only adds the lease's
// credential, weighted by its share.
func (d *AccelDriver) prepareShared(ctx context.Context, app *appliance.Appliance, e Export) (api.PrepareResponse, error) {
	r := e.Request
	if r.Role == "" {
		return api.PrepareResponse{}, fmt.Errorf("%w: a shared accel lease needs a role", ErrBadRequest)
	}
	addrs, err := slotAddrs(app, e)
	if err != nil {
		return api.PrepareResponse{}, err
	}
	if old, ok := d.live[r.Export]; ok && old.Request.Gateway {
		if uri, ok := d.gws.uri(e); ok {
			if err := d.gws.setDeadline(e); err != nil {
				return api.PrepareResponse{}, err
			}
			return api.PrepareResponse{URI: uri}, nil
		}
	}
	slot := r.Offset / api.SlotUnits
	load := func(secret []byte) error { return d.load(ctx, app, r, slot, slot+1, secret) }
	unload := func() { d.clear(app, slot, slot+1) }
	uri, err := d.gws.join(ctx, e, int(slot), addrs[0], load, unload, d.gwCfg[e.Device.Name], d.reg)
	if err != nil {
		return api.PrepareResponse{}, err
	}
	d.live[r.Export] = e
	return api.PrepareResponse{URI: uri}, nil
}

// clear ends the lease on slots [from, to) and unloads their roles.
func (d *AccelDriver) clear(app *appliance.Appliance, from, to int64) error {
	var first error
	for i := from; i < to; i++ {
		if err := app.SetCredential(int(i), nil); err != nil && first == nil {
			first = err
		}
		if err := app.Unload(context.Background(), int(i)); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Teardown ends the lease: a dedicated lease's slots close their
// connections, wipe their memory and unload their role; a shared lease's
// credential is revoked at the gateway (its connections closed, its queued
// and running work cancelled, on the slots too: a role that never returns
// is stopped); when it held the last share of its slot, the slot leaves
// the gateway (other leases' executions on it are cancelled and run again
// elsewhere) and is wiped and unloaded; the gateway stops with its last
// lease.
func (d *AccelDriver) Teardown(_ context.Context, e Export) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	old, ok := d.live[e.Request.Export]
	if !ok {
		return nil
	}
	delete(d.live, e.Request.Export)
	app := d.apps[e.Device.Name]
	from, to, err := slotRange(old.Request)
	if err != nil {
		return err
	}
	if old.Request.Gateway {
		// The slot is freed (wiped, role unloaded) with its last share.
		if !d.gws.leave(old.Request, e.Device.Name, int(from)) {
			return nil
		}
	}
	if app == nil {
		return nil
	}
	return d.clear(app, from, to)
}

// Close releases the appliances' listeners and stops the gateways.
func (d *AccelDriver) Close() error {
	d.stopGateways()
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, a := range d.apps {
		a.Close()
		delete(d.apps, name)
	}
	d.live = map[string]Export{}
	return nil
}

// Gateways lists the shared gateways, by name.
func (d *AccelDriver) Gateways() []GatewayStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gws.status()
}
