package agent

// The agent's gateway pool: the batching gateways that serve shared
// accelerator leases (AccelDriver keeps the appliances and their slots).

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/gateway"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/letgo"
	"github.com/rialto-project/rialto/internal/pki"
	"github.com/rialto-project/rialto/internal/resource"
)

// Defaults of a shared gateway's knobs (device attributes gateway_max_batch,
// gateway_max_delay, gateway_workers, gateway_queue_limit,
// gateway_lease_queue_limit, gateway_queue_timeout override them). A lease
// may hold at most its weighted part of the queue (gateway.Credentials),
// capped by gateway_lease_queue_limit if set.
const (
	DefaultGatewayMaxBatch     = 64
	DefaultGatewayMaxDelay     = 200 * time.Microsecond
	DefaultGatewayQueueTimeout = 10 * time.Second
)

// gwConfig is a device's gateway knobs.
type gwConfig struct {
	gateway.Config
	leaseLimit int // items one lease may have in the gateway (0: its weighted part of the queue)
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
	return g, nil
}

// gatewayPool is the shared gateways of an agent, one per device, role and
// role config (gatewayKey). Each runs a batching gateway in front of the
// slots its leases' shares fall in (a slot serves one gateway: owner), lets
// those leases' export names in as credentials, and stops when its last
// lease leaves.
//
// Its methods are not safe for concurrent use: AccelDriver's mu guards the
// pool. A gateway returned by takeAll is stopped outside that lock.
type gatewayPool struct {
	log     *slog.Logger
	host    string             // gateways listen on it
	srvTLS  *tls.Config        // gateways require TLS with it (nil: plaintext)
	slotTLS func() *tls.Config // gateways dial their slots with it, at each dial (nil: plaintext)
	// slotTrack registers the gateways' TLS connections to their slots
	// with the revocation list (gateway.Redialer.Track).
	slotTrack pki.TrackFunc
	secret    func() string // a new credential for a lease's slots
	gws       map[string]*sharedGateway
	owner     map[slotRef]string // the gateway (key) each held slot serves
	seq       int                // gateways named so far with a role config
}

// slotRef is a slot of a device.
type slotRef struct {
	device string
	slot   int
}

func newGatewayPool(log *slog.Logger, host string) *gatewayPool {
	return &gatewayPool{log: log, host: host, gws: map[string]*sharedGateway{}, owner: map[slotRef]string{},
		secret: func() string { return resource.NewSecret("rgw") }}
}

// slotSecret returns a new credential for a lease's slots, which only the
// gateway presents: borrowers reach the slots through the gateway alone.
func (p *gatewayPool) slotSecret() string { return p.secret() }

// uri returns the URI of the gateway e joins, if it runs.
func (p *gatewayPool) uri(e Export) (string, bool) {
	g := p.gws[gatewayKey(e.Request, e.Device.Name)]
	if g == nil {
		return "", false
	}
	return g.uri(e.Host, e.Request), true
}

// join lets lease e (a share of slot, which listens at addr) in at the
// gateway for its role, starting that gateway with the device's knobs gc
// if it does not run, and returns the lease's URI. A slot serves one
// gateway: a slot another gateway holds is refused (ErrOverlap). When the
// slot is new to the gateway, load(secret) loads the role into it with a
// credential only the gateway presents, and the slot joins the gateway's
// instances; a slot the gateway holds already takes only the lease's
// credential. On error the lease is not in the pool, a slot it brought is
// unloaded (unload) and a gateway it started is stopped.
func (p *gatewayPool) join(ctx context.Context, e Export, slot int, addr string, load func(secret []byte) error, unload func(),
	gc gwConfig, reg *prometheus.Registry) (string, error) {
	r := e.Request
	key := gatewayKey(r, e.Device.Name)
	ref := slotRef{e.Device.Name, slot}
	if k, ok := p.owner[ref]; ok && k != key {
		return "", fmt.Errorf("%w: slot %d of %s serves another gateway (another role or role config)", ErrOverlap, slot, e.Device.Name)
	}
	g := p.gws[key]
	if g == nil {
		var err error
		g, err = p.start(ctx, e, gc, reg, p.gatewayName(r, e.Device.Name))
		if err != nil {
			return "", err
		}
		p.gws[key] = g
	}
	if !g.holds(slot) {
		secret := []byte(p.slotSecret())
		if err := load(secret); err != nil {
			p.stopIfIdle(key, g)
			return "", err
		}
		rd := gateway.NewRedialer(addr, secret)
		rd.TLS, rd.Track = p.slotTLS, p.slotTrack
		g.addSlot(slot, &slotBackend{r: rd, calls: map[int]context.CancelFunc{}})
		p.owner[ref] = key
	}
	g.addLease(r.Export, slot)
	// The lease's share (slot units) is its weight at the gateway's fair
	// queue; labelled by the lease ID (never the export name, a
	// credential).
	// Its calls are refused from its known expiry on (e.deadline),
	// whether its credential has been revoked yet or not.
	err := g.creds.AddWeighted([]byte(r.Export), r.LeaseID, int(max(r.Length, 1)))
	if err == nil {
		err = g.creds.SetDeadline([]byte(r.Export), e.deadline)
	}
	if err != nil {
		g.creds.Revoke([]byte(r.Export))
		if p.drop(g, ref, r.Export) {
			unload()
		}
		p.stopIfIdle(key, g)
		return "", err
	}
	return g.uri(e.Host, r), nil
}

// setDeadline makes the deadline of lease e at its gateway e's (its
// known expiry, e.deadline).
func (p *gatewayPool) setDeadline(e Export) error {
	g := p.gws[gatewayKey(e.Request, e.Device.Name)]
	if g == nil {
		return fmt.Errorf("%w: the lease's gateway does not run", ErrNoDevice)
	}
	return g.creds.SetDeadline([]byte(e.Request.Export), e.deadline)
}

// leave revokes the lease's export name at its gateway (closing its
// connections and cancelling its queued and running work, on the slots
// too) and stops the gateway if it was the last lease. When the lease held
// the last share of its slot, the slot leaves the gateway's rotation (the
// other leases' executions running there are cancelled and run again on
// another slot) and leave reports true: the caller frees the slot (wipes
// it, unloads the role). It reports false while other shares keep the
// slot, or when another gateway holds it.
func (p *gatewayPool) leave(r api.PrepareRequest, device string, slot int) bool {
	key := gatewayKey(r, device)
	ref := slotRef{device, slot}
	g := p.gws[key]
	if g == nil {
		_, held := p.owner[ref]
		return !held
	}
	g.creds.Revoke([]byte(r.Export))
	freed := p.drop(g, ref, r.Export)
	p.stopIfIdle(key, g)
	return freed
}

// drop takes lease export out of gateway g; if it held the last share of
// slot ref, the slot leaves g's rotation (removeSlot) and drop reports
// true.
func (p *gatewayPool) drop(g *sharedGateway, ref slotRef, export string) bool {
	if !g.removeLease(export) {
		return false
	}
	g.removeSlot(ref.slot)
	delete(p.owner, ref)
	return true
}

// stopIfIdle stops gateway g (key) once it has no lease.
func (p *gatewayPool) stopIfIdle(key string, g *sharedGateway) {
	if g.leases() == 0 {
		delete(p.gws, key)
		g.stop()
	}
}

// takeAll empties the pool and returns its gateways, for the caller to
// stop.
func (p *gatewayPool) takeAll() []*sharedGateway {
	out := make([]*sharedGateway, 0, len(p.gws))
	for _, g := range p.gws {
		out = append(out, g)
	}
	p.gws = map[string]*sharedGateway{}
	p.owner = map[slotRef]string{}
	return out
}

// status lists the gateways, by name.
func (p *gatewayPool) status() []GatewayStatus {
	out := make([]GatewayStatus, 0, len(p.gws))
	for _, g := range p.gws {
		out = append(out, GatewayStatus{Name: g.name, Device: g.device, Role: g.role, Addr: g.ln.Addr().String(),
			Leases: g.creds.Len(), Slots: len(g.backends()), Stats: g.g.Stats(), LeaseStats: g.g.Leases()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
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
	// LeaseStats are each lease's counters at the gateway (weight, queued,
	// served, cancelled, failed, service, share), by lease ID: never the
	// lease's credential.
	LeaseStats []gateway.LeaseStats `json:"lease_stats"`
}

// gatewayKey is the gateway a shared lease joins: same device, role and
// role config (by digest; the config itself may be a key). Leases of
// different tenants uploading the same Wasm module share the gateway and
// its slots' instances of the module; they share no memory: a batch is one
// lease's, and the wasm role runs each execution on a fresh instance
// (internal/dataplane/accel/roles).
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
func (p *gatewayPool) gatewayName(r api.PrepareRequest, device string) string {
	name := device + "/" + r.Role
	if r.RoleConfig != nil {
		p.seq++
		name += "/" + strconv.Itoa(p.seq)
	}
	return name
}

// start starts the gateway for e's role on e's device, with the device's
// knobs gc; it listens where e's previous URI says if it can.
func (p *gatewayPool) start(ctx context.Context, e Export, gc gwConfig, reg *prometheus.Registry, name string) (*sharedGateway, error) {
	r, err := roles.New(ctx, spec(e.Request))
	if err != nil {
		return nil, roleError(err)
	}
	entries := r.Entries()
	_ = r.Close(ctx)
	cfg := gc.Config
	cfg.Name, cfg.Role, cfg.Entries, cfg.Metrics = name, e.Request.Role, entries, registerer(reg)
	cfg.Logger = p.log.With("gateway", name)
	sg := &sharedGateway{name: name, device: e.Device.Name, role: e.Request.Role, slots: map[int]*heldSlot{}, leaseSlot: map[string]int{},
		tls: p.srvTLS != nil}
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
		if ln, err = letgo.Listen("tcp", net.JoinHostPort(p.host, port)); err != nil {
			p.log.Warn("cannot serve a restored gateway at its previous port", "gateway", name, "port", port, "err", err)
			ln = nil
		}
	}
	if ln == nil {
		if ln, err = letgo.Listen("tcp", net.JoinHostPort(p.host, "0")); err != nil {
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
		srv := &accel.Server{Target: g.SharedTarget(&sg.creds), Logger: cfg.Logger, TLS: p.srvTLS}
		if err := srv.Serve(gctx, ln); err != nil {
			p.log.Error("gateway stopped", "gateway", name, "err", err)
		}
	}()
	p.log.Info("gateway started", "gateway", name, "addr", ln.Addr().String())
	return sg, nil
}

// gatewayPort returns the port a shared export's previous URI (e.URI)
// names for its gateway, or "".
func gatewayPort(e Export) string {
	if p := uriPorts(e.URI); len(p) > 0 && isGatewayURI(e.URI) {
		return p[0]
	}
	return ""
}

// sharedGateway is a gateway shared by the leases of one role on one
// device. It is the gateway's only Backend: each execution goes to the next
// of the slots its leases' shares fall in, so that a slot leaves without
// failing a batch.
type sharedGateway struct {
	name, device, role string
	g                  *gateway.Gateway
	ln                 net.Listener
	creds              gateway.Credentials
	tls                bool // requires TLS: its URIs are rialto-accels://
	cancel             context.CancelFunc
	wg                 sync.WaitGroup

	mu        sync.Mutex
	slots     map[int]*heldSlot // by slot index
	leaseSlot map[string]int    // each lease's slot, by export name
	order     []*slotBackend
	next      int
}

// heldSlot is a slot the gateway holds and the leases sharing it.
type heldSlot struct {
	b      *slotBackend
	shares map[string]bool // export names
}

// slotBackend is one slot behind the gateway, with the cancels of the
// executions running on it: removing the slot (its lease ended, the slot
// reassigned) cancels them, and they run again on another slot.
type slotBackend struct {
	r       *gateway.Redialer
	mu      sync.Mutex
	removed bool
	calls   map[int]context.CancelFunc
	nextID  int
	running sync.WaitGroup
}

// call runs a batch on the slot; moved reports that the slot was removed
// before or during the call, which must then run elsewhere.
func (b *slotBackend) call(ctx context.Context, entry string, ins [][]byte) (outs [][]byte, moved bool, err error) {
	b.mu.Lock()
	if b.removed {
		b.mu.Unlock()
		return nil, true, nil
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	id := b.nextID
	b.nextID++
	b.calls[id] = cancel
	b.running.Add(1)
	b.mu.Unlock()
	defer b.running.Done()
	outs, err = b.r.CallBatch(cctx, entry, ins)
	b.mu.Lock()
	delete(b.calls, id)
	removed := b.removed
	b.mu.Unlock()
	if err != nil && removed && ctx.Err() == nil {
		return nil, true, nil
	}
	return outs, false, err
}

// busy is the number of executions running on the slot.
func (b *slotBackend) busy() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.calls)
}

func (sg *sharedGateway) uri(host string, r api.PrepareRequest) string {
	a := sg.ln.Addr().String()
	if _, port, err := net.SplitHostPort(a); err == nil && host != "" {
		a = net.JoinHostPort(host, port)
	}
	return accel.URI{Slots: []string{a}, Credential: r.Export, Gateway: r.Role, TLS: sg.tls}.String()
}

// holds reports whether the gateway holds slot.
func (sg *sharedGateway) holds(slot int) bool {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	return sg.slots[slot] != nil
}

// addSlot puts a slot into rotation.
func (sg *sharedGateway) addSlot(slot int, b *slotBackend) {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	sg.slots[slot] = &heldSlot{b: b, shares: map[string]bool{}}
	sg.order = append(sg.order, b)
}

// addLease records a lease's share of slot (which the gateway holds).
func (sg *sharedGateway) addLease(export string, slot int) {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	sg.slots[slot].shares[export] = true
	sg.leaseSlot[export] = slot
}

// removeLease forgets a lease's share and reports whether it was the last
// share of its slot.
func (sg *sharedGateway) removeLease(export string) bool {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	slot, ok := sg.leaseSlot[export]
	if !ok {
		return false
	}
	delete(sg.leaseSlot, export)
	hs := sg.slots[slot]
	delete(hs.shares, export)
	return len(hs.shares) == 0
}

// removeSlot takes a slot out of rotation and cancels the executions
// running on it (on the slot too: the accel client sends CANCEL), which
// run again on another slot; it waits for the cancelled calls to return,
// which they do at once.
func (sg *sharedGateway) removeSlot(slot int) {
	sg.mu.Lock()
	hs := sg.slots[slot]
	delete(sg.slots, slot)
	if hs == nil {
		sg.mu.Unlock()
		return
	}
	b := hs.b
	kept := sg.order[:0]
	for _, x := range sg.order {
		if x != b {
			kept = append(kept, x)
		}
	}
	clear(sg.order[len(kept):])
	sg.order = kept
	sg.mu.Unlock()
	b.mu.Lock()
	b.removed = true
	for _, cancel := range b.calls {
		cancel()
	}
	b.mu.Unlock()
	b.running.Wait()
	b.r.Close()
}

func (sg *sharedGateway) leases() int {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	return len(sg.leaseSlot)
}

func (sg *sharedGateway) backends() []*slotBackend {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	return append([]*slotBackend(nil), sg.order...)
}

// CallBatch implements gateway.Backend: the slot with the fewest
// executions under way (ties: in turn) runs the batch, so that a slot held
// by a long execution does not delay the others' batches; a batch whose
// slot leaves runs again on another.
func (sg *sharedGateway) CallBatch(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	for {
		sg.mu.Lock()
		if len(sg.order) == 0 {
			sg.mu.Unlock()
			return nil, fmt.Errorf("%w: gateway %s has no slots", accel.ErrUnavailable, sg.name)
		}
		start := sg.next % len(sg.order)
		sg.next++
		b := sg.order[start]
		for i := 1; i < len(sg.order) && b.busy() > 0; i++ {
			if c := sg.order[(start+i)%len(sg.order)]; c.busy() < b.busy() {
				b = c
			}
		}
		sg.mu.Unlock()
		outs, moved, err := b.call(ctx, entry, ins)
		if moved {
			continue
		}
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
