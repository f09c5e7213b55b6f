package agent

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/dataplane/accel/gateway"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/metrics"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	builtinDrivers[api.KindAccel] = func(l *slog.Logger, host string) Driver { return NewAccelDriver(l, host) }
}

// DefaultSlotMemory is each accelerator slot's memory unless the device's
// "slot_memory" attribute says otherwise.
const DefaultSlotMemory = 16 << 20

// Defaults of a shared gateway's knobs (device attributes gateway_max_batch,
// gateway_max_delay, gateway_workers, gateway_queue_limit,
// gateway_lease_queue_limit, gateway_queue_timeout override them). A lease
// may hold at most half the queue unless gateway_lease_queue_limit says
// otherwise.
const (
	DefaultGatewayMaxBatch     = 64
	DefaultGatewayMaxDelay     = 200 * time.Microsecond
	DefaultGatewayQueueTimeout = 10 * time.Second
)

// AccelDriver lends accelerator slots: each accel device is an appliance
// (internal/dataplane/accel/appliance) whose slots listen on ports of their
// own. A dedicated lease's slots accept the lease's export name as
// credential and run the requested role. A shared lease (Gateway set in
// its prepare request) is served by a batching gateway
// (internal/dataplane/accel/gateway) that the driver runs in front of the
// slots of every shared lease of the same device, role and role config: the
// lease's slot joins the gateway's instances, and the gateway accepts the
// lease's export name until the lease ends.
//
// ManagementToken and Metrics are read when devices are opened and
// gateways started; set them before the agent runs.
type AccelDriver struct {
	log  *slog.Logger
	host string

	// ManagementToken, if set, is the bearer token each appliance's
	// management API (Appliance(name).Handler()) requires.
	ManagementToken string

	mu       sync.Mutex
	apps     map[string]*appliance.Appliance // by device name
	gwCfg    map[string]gwConfig             // by device name
	live     map[string]Export               // by export name
	gws      map[string]*sharedGateway       // by gateway key
	reg      *metrics.Registry
	gwSecret func() string
	gwSeq    int
}

// NewAccelDriver returns an accelerator driver whose slots bind host.
func NewAccelDriver(log *slog.Logger, host string) *AccelDriver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &AccelDriver{log: log, host: host, apps: map[string]*appliance.Appliance{}, gwCfg: map[string]gwConfig{},
		live: map[string]Export{}, gws: map[string]*sharedGateway{}, gwSecret: func() string { return resource.NewSecret("rgw") }}
}

// UseMetrics implements MetricsUser: slot and gateway metrics go to reg.
func (d *AccelDriver) UseMetrics(reg *metrics.Registry) {
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
	reg := d.reg
	d.mu.Unlock()
	app, err := appliance.New(appliance.Config{ID: dev.Name, Slots: int(dev.Size), SlotMemory: mem, Host: d.host, Logger: d.log,
		Metrics: reg, ManagementToken: d.ManagementToken, ManagedLeases: true})
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

// gwConfig is a device's gateway knobs.
type gwConfig struct {
	gateway.Config
	leaseLimit int // items one lease may have in the gateway
}

// gatewayConfig reads a device's gateway knobs from its attributes.
func gatewayConfig(dev DeviceConfig) (gwConfig, error) {
	var g gwConfig
	c := &g.Config
	*c = gateway.Config{MaxBatch: DefaultGatewayMaxBatch, MaxQueueDelay: DefaultGatewayMaxDelay,
		Workers: max(int(dev.Size), 1), QueueTimeout: DefaultGatewayQueueTimeout}
	num := func(k string, p *int) error {
		if s := dev.Attributes[k]; s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 {
				return fmt.Errorf("bad %s %q: want a positive integer", k, s)
			}
			*p = n
		}
		return nil
	}
	dur := func(k string, p *time.Duration) error {
		if s := dev.Attributes[k]; s != "" {
			v, err := time.ParseDuration(s)
			if err != nil || v < 0 {
				return fmt.Errorf("bad %s %q: want a duration", k, s)
			}
			*p = v
		}
		return nil
	}
	for _, err := range []error{num("gateway_max_batch", &c.MaxBatch), num("gateway_workers", &c.Workers),
		num("gateway_queue_limit", &c.QueueLimit), num("gateway_lease_queue_limit", &g.leaseLimit),
		dur("gateway_max_delay", &c.MaxQueueDelay), dur("gateway_queue_timeout", &c.QueueTimeout)} {
		if err != nil {
			return g, err
		}
	}
	if c.QueueLimit == 0 {
		c.QueueLimit = 64 * c.MaxBatch
	}
	if g.leaseLimit == 0 {
		g.leaseLimit = max(c.QueueLimit/2, 1)
	}
	return g, nil
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

func (d *AccelDriver) stopGateways() {
	d.mu.Lock()
	gws := d.gws
	d.gws = map[string]*sharedGateway{}
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

// slotAddrs returns the addresses of the lease's slots, with e.Host as host.
func slotAddrs(app *appliance.Appliance, e Export) ([]string, error) {
	var addrs []string
	for i := e.Request.Offset; i < e.Request.Offset+e.Request.Length; i++ {
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
	uri := accel.URI{Slots: addrs, Credential: e.Request.Export}.String()
	if _, ok := d.live[e.Request.Export]; ok {
		return api.PrepareResponse{URI: uri}, nil
	}
	if err := d.load(ctx, app, e, []byte(e.Request.Export)); err != nil {
		return api.PrepareResponse{}, err
	}
	d.live[e.Request.Export] = e
	return api.PrepareResponse{URI: uri}, nil
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
	if int64(len(ports)) != e.Request.Length {
		return
	}
	for i, port := range ports {
		id := int(e.Request.Offset) + i
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

// gatewayPort returns the port a shared export's previous URI (e.URI)
// names for its gateway, or "".
func gatewayPort(e Export) string {
	if p := uriPorts(e.URI); len(p) > 0 && isGatewayURI(e.URI) {
		return p[0]
	}
	return ""
}

// isGatewayURI reports whether uri is a shared lease's (its gateway's).
func isGatewayURI(uri string) bool {
	u, err := url.Parse(uri)
	return err == nil && u.Query().Has("gateway")
}

// load loads the lease's role into its slots and sets their credential;
// on error it leaves them cleared.
func (d *AccelDriver) load(ctx context.Context, app *appliance.Appliance, e Export, cred []byte) error {
	r := e.Request
	for i := r.Offset; i < r.Offset+r.Length; i++ {
		if r.Role != "" {
			if err := app.Load(ctx, int(i), spec(r)); err != nil {
				d.clear(app, r.Offset, i)
				return roleError(err)
			}
		}
		if err := app.SetCredential(int(i), cred); err != nil {
			d.clear(app, r.Offset, i+1)
			return err
		}
	}
	return nil
}

// gatewayKey is the gateway a shared lease joins: same device, role and
// role config (by digest; the config itself may be a key).
func gatewayKey(r api.PrepareRequest, device string) string {
	h := sha256.New()
	h.Write([]byte(r.Role))
	if c := r.RoleConfig; c != nil {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(c.Config)))
		h.Write(n[:])
		h.Write(c.Config)
		h.Write(c.Module)
		binary.LittleEndian.PutUint64(n[:], uint64(c.WasmMemoryPages))
		h.Write(n[:])
	}
	return device + "\x00" + hex.EncodeToString(h.Sum(nil))
}

// gatewayName names a new gateway in metrics and listings: device and
// role, and a sequence number when the role has a config (never anything
// derived from the config, which may be a key).
func (d *AccelDriver) gatewayName(r api.PrepareRequest, device string) string {
	name := device + "/" + r.Role
	if r.RoleConfig != nil {
		d.gwSeq++
		name += "/" + strconv.Itoa(d.gwSeq)
	}
	return name
}

func (d *AccelDriver) prepareShared(ctx context.Context, app *appliance.Appliance, e Export) (api.PrepareResponse, error) {
	r := e.Request
	if r.Role == "" {
		return api.PrepareResponse{}, fmt.Errorf("%w: a shared accel lease needs a role", ErrBadRequest)
	}
	addrs, err := slotAddrs(app, e)
	if err != nil {
		return api.PrepareResponse{}, err
	}
	key := gatewayKey(r, e.Device.Name)
	if old, ok := d.live[r.Export]; ok {
		if g := d.gws[key]; g != nil && old.Request.Gateway {
			return api.PrepareResponse{URI: g.uri(e.Host, r)}, nil
		}
	}
	// The slots take a credential of the gateway's own: borrowers reach
	// them only through the gateway.
	secret := d.gwSecret()
	if err := d.load(ctx, app, e, []byte(secret)); err != nil {
		return api.PrepareResponse{}, err
	}
	var backs []*slotBackend
	for _, a := range addrs {
		backs = append(backs, &slotBackend{r: gateway.NewRedialer(a, []byte(secret))})
	}
	g := d.gws[key]
	if g == nil {
		g, err = d.startGateway(ctx, app, e, d.gatewayName(r, e.Device.Name))
		if err != nil {
			for _, b := range backs {
				b.r.Close()
			}
			d.clear(app, r.Offset, r.Offset+r.Length)
			return api.PrepareResponse{}, err
		}
		d.gws[key] = g
	}
	g.add(r.Export, backs)
	if err := g.creds.Add([]byte(r.Export)); err != nil {
		g.remove(r.Export, nil)
		d.clear(app, r.Offset, r.Offset+r.Length)
		return api.PrepareResponse{}, err
	}
	d.live[r.Export] = e
	return api.PrepareResponse{URI: g.uri(e.Host, r)}, nil
}

// startGateway starts the gateway for a role on a device.
func (d *AccelDriver) startGateway(ctx context.Context, app *appliance.Appliance, e Export, name string) (*sharedGateway, error) {
	r, err := roles.New(ctx, spec(e.Request))
	if err != nil {
		return nil, roleError(err)
	}
	entries := r.Entries()
	_ = r.Close(ctx)
	gc := d.gwCfg[e.Device.Name]
	cfg := gc.Config
	cfg.Name, cfg.Role, cfg.Entries, cfg.Metrics = name, e.Request.Role, entries, d.reg
	cfg.Logger = d.log.With("gateway", name)
	sg := &sharedGateway{name: name, device: e.Device.Name, role: e.Request.Role, slots: map[string][]*slotBackend{},
		drain: cfg.QueueTimeout}
	if sg.drain <= 0 {
		sg.drain = DefaultGatewayQueueTimeout
	}
	sg.creds.Limit = gc.leaseLimit
	// The gateway has no slot yet: executions pick from sg's current slots.
	g, err := gateway.New(cfg, []gateway.Backend{sg})
	if err != nil {
		return nil, err
	}
	// A gateway started for a restored lease listens where it did before,
	// if it can.
	var ln net.Listener
	if port := gatewayPort(e); port != "" {
		if ln, err = net.Listen("tcp", net.JoinHostPort(d.host, port)); err != nil {
			d.log.Warn("cannot serve a restored gateway at its previous port", "gateway", name, "port", port, "err", err)
			ln = nil
		}
	}
	if ln == nil {
		if ln, err = net.Listen("tcp", net.JoinHostPort(d.host, "0")); err != nil {
			return nil, fmt.Errorf("accel: gateway listen: %w", err)
		}
	}
	sg.g, sg.ln = g, ln
	gctx, cancel := context.WithCancel(context.Background())
	sg.cancel = cancel
	sg.wg.Add(2)
	go func() {
		defer sg.wg.Done()
		_ = g.Run(gctx)
	}()
	go func() {
		defer sg.wg.Done()
		srv := &accel.Server{Target: g.SharedTarget(&sg.creds), Logger: cfg.Logger}
		if err := srv.Serve(gctx, ln); err != nil {
			d.log.Error("gateway stopped", "gateway", name, "err", err)
		}
	}()
	d.log.Info("gateway started", "gateway", name, "addr", ln.Addr().String())
	return sg, nil
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
// credential is revoked at the gateway (its connections closed), its slots
// leave the gateway once their running executions finish (interrupted
// after the gateway's queue timeout: the borrower's role may never
// return), and the gateway stops with its last lease.
func (d *AccelDriver) Teardown(_ context.Context, e Export) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	old, ok := d.live[e.Request.Export]
	if !ok {
		return nil
	}
	delete(d.live, e.Request.Export)
	app := d.apps[e.Device.Name]
	if old.Request.Gateway {
		key := gatewayKey(old.Request, e.Device.Name)
		if g := d.gws[key]; g != nil {
			g.creds.Revoke([]byte(old.Request.Export))
			g.remove(old.Request.Export, func() {
				if app != nil {
					d.clear(app, old.Request.Offset, old.Request.Offset+old.Request.Length)
				}
			})
			if g.leases() == 0 {
				delete(d.gws, key)
				g.stop()
			}
		}
	}
	if app == nil {
		return nil
	}
	return d.clear(app, old.Request.Offset, old.Request.Offset+old.Request.Length)
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

// GatewayStatus describes a shared gateway.
type GatewayStatus struct {
	Name   string        `json:"name"`
	Device string        `json:"device"`
	Role   string        `json:"role"`
	Addr   string        `json:"addr"`
	Leases int           `json:"leases"`
	Slots  int           `json:"slots"`
	Stats  gateway.Stats `json:"stats"`
}

// Gateways lists the shared gateways, by name.
func (d *AccelDriver) Gateways() []GatewayStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]GatewayStatus, 0, len(d.gws))
	for _, g := range d.gws {
		out = append(out, GatewayStatus{Name: g.name, Device: g.device, Role: g.role, Addr: g.ln.Addr().String(),
			Leases: g.creds.Len(), Slots: len(g.backends()), Stats: g.g.Stats()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// sharedGateway is a gateway shared by the leases of one role on one
// device. It is the gateway's only Backend: each execution goes to the next
// of the leases' slots, so that a slot leaves without failing a batch.
type sharedGateway struct {
	name, device, role string
	g                  *gateway.Gateway
	ln                 net.Listener
	creds              gateway.Credentials
	drain              time.Duration // how long remove waits for running executions
	cancel             context.CancelFunc
	wg                 sync.WaitGroup

	mu    sync.Mutex
	slots map[string][]*slotBackend // by export name
	order []*slotBackend
	next  int
}

// slotBackend is one slot behind the gateway. Its lock is held for reading
// by running executions, so that removing it waits for them.
type slotBackend struct {
	r       *gateway.Redialer
	mu      sync.RWMutex
	removed bool
}

func (sg *sharedGateway) uri(host string, r api.PrepareRequest) string {
	a := sg.ln.Addr().String()
	if _, port, err := net.SplitHostPort(a); err == nil && host != "" {
		a = net.JoinHostPort(host, port)
	}
	return accel.URI{Slots: []string{a}, Credential: r.Export, Gateway: r.Role}.String()
}

func (sg *sharedGateway) add(export string, bs []*slotBackend) {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	sg.slots[export] = bs
	sg.order = append(sg.order, bs...)
}

// remove takes the lease's slots out of rotation and waits for the
// executions running on them; if some still run after sg.drain, it calls
// interrupt (if not nil), which must make them fail, and waits on.
func (sg *sharedGateway) remove(export string, interrupt func()) {
	sg.mu.Lock()
	bs := sg.slots[export]
	delete(sg.slots, export)
	kept := sg.order[:0]
	for _, b := range sg.order {
		gone := false
		for _, x := range bs {
			gone = gone || x == b
		}
		if !gone {
			kept = append(kept, b)
		}
	}
	clear(sg.order[len(kept):])
	sg.order = kept
	sg.mu.Unlock()
	drained := make(chan struct{})
	go func() {
		for _, b := range bs {
			b.mu.Lock()
			b.removed = true
			b.mu.Unlock()
		}
		close(drained)
	}()
	if interrupt != nil {
		t := time.NewTimer(sg.drain)
		select {
		case <-drained:
		case <-t.C:
			interrupt()
		}
		t.Stop()
	}
	<-drained
	for _, b := range bs {
		b.r.Close()
	}
}

func (sg *sharedGateway) leases() int {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	return len(sg.slots)
}

func (sg *sharedGateway) backends() []*slotBackend {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	return append([]*slotBackend(nil), sg.order...)
}

// CallBatch implements gateway.Backend: the next slot runs the batch.
func (sg *sharedGateway) CallBatch(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	for {
		sg.mu.Lock()
		if len(sg.order) == 0 {
			sg.mu.Unlock()
			return nil, fmt.Errorf("%w: gateway %s has no slots", accel.ErrUnavailable, sg.name)
		}
		b := sg.order[sg.next%len(sg.order)]
		sg.next++
		b.mu.RLock()
		sg.mu.Unlock()
		if b.removed { // taken out between the two locks; pick again
			b.mu.RUnlock()
			continue
		}
		outs, err := b.r.CallBatch(ctx, entry, ins)
		b.mu.RUnlock()
		return outs, err
	}
}

// stop stops the gateway and closes its listener and slot connections.
func (sg *sharedGateway) stop() {
	sg.cancel()
	sg.wg.Wait()
	for _, b := range sg.backends() {
		b.r.Close()
	}
}
