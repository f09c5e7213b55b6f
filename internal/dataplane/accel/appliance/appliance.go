package appliance

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rialto-project/rialto/internal/accept"

	"github.com/rialto-project/rialto/internal/backoff"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/letgo"
	"github.com/rialto-project/rialto/internal/metrics"
	"github.com/rialto-project/rialto/internal/pki"
)

// Errors.
var (
	ErrNoSlot   = errors.New("appliance: no such slot")
	ErrConfig   = errors.New("appliance: bad config")
	ErrRunning  = errors.New("appliance: already running")
	ErrNotReady = errors.New("appliance: not running")
)

// MaxTotalMemory bounds the memory of all slots together (it is reserved
// as one allocation; the kernel commits pages as they are touched).
const MaxTotalMemory = 64 << 30

// Config configures an appliance.
type Config struct {
	ID         string // appliance identity reported to the control plane; default "appliance"
	Slots      int    // number of slots (1..256)
	SlotMemory uint64 // bytes of memory per slot (>0, at most 4 GiB)
	Host       string // listen host for slots and management; default 127.0.0.1
	BasePort   int    // slot i listens on BasePort+i; 0: ephemeral ports
	// ManagementAddr, if set, is where Run serves Handler (e.g. "127.0.0.1:0").
	ManagementAddr string
	// ManagementToken, if set, is required as "Authorization: Bearer TOKEN"
	// by the management API.
	ManagementToken string
	// ManagedLeases says that lease credentials are set by a lease executor
	// (the agent, on the control plane's behalf) through SetCredential: the
	// management API then refuses to set or clear them.
	ManagedLeases bool
	Workers       int // concurrent invocations per slot; 0: GOMAXPROCS
	// UDPQueues, if positive, also serves each slot's UDP message path
	// (udp.go) on its mailbox's host and port, with that many sockets
	// (SO_REUSEPORT queues), each with a worker of its own.
	UDPQueues int
	// TLS, if set, makes every slot's mailbox require TLS with this server
	// configuration (its certificate must name Host). The UDP message path
	// carries no TLS (datagrams are not encrypted): leave UDPQueues 0 with
	// it, as the agent does.
	TLS *tls.Config
	// BlockTLS returns the client configuration a slot dials nbds://
	// block parts with (Load, Store, RunBlockTask), called at each
	// opening of a range's volume, so that the CA certificates it trusts
	// may change while the appliance runs; nil trusts the system's CAs.
	BlockTLS func() *tls.Config
	// BlockTrack, if set, is handed each TLS connection a slot opens to
	// a block part (stripe.OpenConfig.Track): a revocation list's Tracker
	// (the agent's) ends the connections to a lender whose certificate a
	// list it takes later revokes, and the LOAD, STORE or block task
	// reading through them fails (accel.ErrBlockIO).
	BlockTrack pki.TrackFunc
	MaxPayload uint32 // frame payload limit; 0: accel.DefaultMaxPayload
	Logger     *slog.Logger
	// Metrics, if set, gets the slots' metrics (appliances sharing one
	// registry share its families); the management API serves it at
	// /metrics when it is also a prometheus.Gatherer (a
	// *prometheus.Registry).
	Metrics prometheus.Registerer
	// Registrar, if set, is told about the appliance when Run starts and
	// receives a heartbeat every HeartbeatInterval (default 5 s).
	Registrar         Registrar
	HeartbeatInterval time.Duration
	// Clock times the registration's retries and the heartbeats, and
	// stamps health and loaded roles (nil: the real clock).
	Clock clock.Clock
}

// Registrar connects the shell to a control plane (boot, register,
// heartbeat). The control-plane integration implements it.
type Registrar interface {
	Register(ctx context.Context, info Info) error
	Heartbeat(ctx context.Context, h Health) error
}

// RegistrarFuncs adapts two functions to a Registrar; a nil function is a
// no-op.
type RegistrarFuncs struct {
	RegisterFunc  func(ctx context.Context, info Info) error
	HeartbeatFunc func(ctx context.Context, h Health) error
}

// Register calls RegisterFunc.
func (f RegistrarFuncs) Register(ctx context.Context, info Info) error {
	if f.RegisterFunc == nil {
		return nil
	}
	return f.RegisterFunc(ctx, info)
}

// Heartbeat calls HeartbeatFunc.
func (f RegistrarFuncs) Heartbeat(ctx context.Context, h Health) error {
	if f.HeartbeatFunc == nil {
		return nil
	}
	return f.HeartbeatFunc(ctx, h)
}

// Info is what the shell registers.
type Info struct {
	ID         string     `json:"id"`
	Management string     `json:"management,omitempty"` // management API address
	Roles      []string   `json:"roles"`                // roles it can load
	Slots      []SlotInfo `json:"slots"`
}

// SlotInfo describes a slot's fixed properties.
type SlotInfo struct {
	ID      int    `json:"id"`
	Addr    string `json:"addr"`     // host:port of its mailbox
	MemSize uint64 `json:"mem_size"` // bytes
	Base    uint64 `json:"base"`     // offset of its chunk in appliance memory
}

// SlotStatus is a slot's current state and counters.
type SlotStatus struct {
	SlotInfo
	Role       string    `json:"role,omitempty"`
	Entries    []string  `json:"entries,omitempty"`
	LoadedAt   time.Time `json:"loaded_at,omitzero"`
	Generation uint64    `json:"generation"` // incremented by every load, unload and reset
	Leased     bool      `json:"leased"`     // a credential is set
	Tasks      uint64    `json:"tasks"`
	Failed     uint64    `json:"failed"`
	Items      uint64    `json:"items"`
	BytesIn    uint64    `json:"bytes_in"`  // written into slot memory (by borrowers and roles)
	BytesOut   uint64    `json:"bytes_out"` // read from slot memory
	BlockIn    uint64    `json:"block_in"`  // of BytesIn, loaded from block leases (LOAD)
	BlockOut   uint64    `json:"block_out"` // of BytesOut, stored to block leases (STORE)
	BusySec    float64   `json:"busy_seconds"`
	InFlight   int64     `json:"in_flight"`
}

// Health is what a heartbeat carries.
type Health struct {
	ID      string       `json:"id"`
	Time    time.Time    `json:"time"`
	Healthy bool         `json:"healthy"`
	Uptime  float64      `json:"uptime_seconds"`
	Slots   []SlotStatus `json:"slots"`
}

// Appliance is the shell and its slots.
type Appliance struct {
	cfg     Config
	log     *slog.Logger
	mem     []byte  // all slot memory
	offsets []chunk // the memory virtualizer's offset table
	slots   []*slot
	mgmt    net.Listener
	started atomic.Int64 // unix nanoseconds when Run started
	running atomic.Bool
	closed  atomic.Bool

	mTasks *prometheus.CounterVec
	mBusy  *prometheus.CounterVec
}

type chunk struct{ base, size uint64 }

// New validates cfg, carves the memory into slot chunks and binds every
// slot's listener (and the management listener when configured).
func New(cfg Config) (*Appliance, error) {
	if cfg.Slots < 1 || cfg.Slots > 256 {
		return nil, fmt.Errorf("%w: %d slots, want 1..256", ErrConfig, cfg.Slots)
	}
	if cfg.SlotMemory == 0 || cfg.SlotMemory > 4<<30 {
		return nil, fmt.Errorf("%w: slot memory %d, want 1 B..4 GiB", ErrConfig, cfg.SlotMemory)
	}
	if total := uint64(cfg.Slots) * cfg.SlotMemory; total > MaxTotalMemory {
		return nil, fmt.Errorf("%w: %d slots × %d B = %d B above %d B", ErrConfig, cfg.Slots, cfg.SlotMemory, total, uint64(MaxTotalMemory))
	}
	if cfg.ID == "" {
		cfg.ID = "appliance"
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 5 * time.Second
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = accel.DefaultMaxPayload
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Appliance{cfg: cfg, log: log, mem: make([]byte, uint64(cfg.Slots)*cfg.SlotMemory)}
	if cfg.Metrics != nil {
		a.mTasks = metrics.Register(cfg.Metrics, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_accel_slot_tasks_total",
			Help: "Tasks run by appliance slots."}, []string{"slot", "outcome"}))
		a.mBusy = metrics.Register(cfg.Metrics, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_accel_slot_busy_seconds_total",
			Help: "Time slots spent running roles."}, []string{"slot"}))
		for i := range cfg.Slots {
			id := strconv.Itoa(i)
			a.mTasks.WithLabelValues(id, "ok")
			a.mTasks.WithLabelValues(id, "error")
			a.mBusy.WithLabelValues(id)
		}
	}
	for i := 0; i < cfg.Slots; i++ {
		c := chunk{base: uint64(i) * cfg.SlotMemory, size: cfg.SlotMemory}
		a.offsets = append(a.offsets, c)
		port := 0
		if cfg.BasePort > 0 {
			port = cfg.BasePort + i
		}
		// A slot's port is bound again where a lease was served
		// (Rebind, by the next agent): its listener lets go of it as it
		// closes, though a child process shares the socket.
		ln, err := letgo.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(port)))
		if err != nil {
			a.closeListeners()
			return nil, fmt.Errorf("appliance: slot %d listen: %w", i, err)
		}
		s := &slot{a: a, id: i, ln: ln, mem: a.mem[c.base : c.base+c.size : c.base+c.size],
			sem: make(chan struct{}, cfg.Workers)}
		s.lnSet = make(chan struct{})
		s.lease = newLease(nil)
		a.slots = append(a.slots, s)
		if cfg.UDPQueues > 0 {
			if s.udp, err = s.bindUDP(context.Background(), cfg.UDPQueues); err != nil {
				a.closeListeners()
				return nil, err
			}
		}
	}
	if cfg.ManagementAddr != "" {
		ln, err := letgo.Listen("tcp", cfg.ManagementAddr)
		if err != nil {
			a.closeListeners()
			return nil, fmt.Errorf("appliance: management listen: %w", err)
		}
		a.mgmt = ln
	}
	return a, nil
}

func (a *Appliance) closeListeners() {
	for _, s := range a.slots {
		s.closeListener()
		for _, c := range s.udpConns() {
			_ = c.Close()
		}
	}
	if a.mgmt != nil {
		_ = a.mgmt.Close()
	}
}

// Close releases the listeners and roles of an appliance that is not
// running (Run does this itself when it returns).
func (a *Appliance) Close() error {
	if a.running.Load() {
		return ErrRunning
	}
	if a.closed.Swap(true) {
		return nil
	}
	a.closeListeners()
	for _, s := range a.slots {
		s.setRole(nil, roles.Spec{})
	}
	return nil
}

// ManagementAddr returns the management listener's address, or "".
func (a *Appliance) ManagementAddr() string {
	if a.mgmt == nil {
		return ""
	}
	return a.mgmt.Addr().String()
}

// Addr returns slot id's mailbox address.
func (a *Appliance) Addr(id int) (string, error) {
	s, err := a.slot(id)
	if err != nil {
		return "", err
	}
	return s.listener().Addr().String(), nil
}

// Rebind moves slot id's mailbox to addr ("host:port"): it binds a
// listener there, then closes the slot's old one. Connections already
// accepted are not affected. An agent uses it to serve a lease again at
// the address a previous run served it at. If addr cannot be bound, the
// slot keeps its listener and Rebind returns the error.
func (a *Appliance) Rebind(id int, addr string) error {
	s, err := a.slot(id)
	if err != nil {
		return err
	}
	ln, err := letgo.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("appliance: slot %d rebind: %w", id, err)
	}
	s.lnMu.Lock()
	if s.lnClosed {
		s.lnMu.Unlock()
		_ = ln.Close()
		return fmt.Errorf("%w: slot %d rebind after close", ErrNotReady, id)
	}
	if s.udp != nil {
		// The UDP message path follows the mailbox.
		udp, err := s.bindUDPAt(context.Background(), ln.Addr().String(), len(s.udp))
		if err != nil {
			s.lnMu.Unlock()
			_ = ln.Close()
			return err
		}
		for _, c := range s.udp {
			_ = c.Close() // a running worker ends with its socket
		}
		s.udp = udp
		if s.udpServe != nil {
			// Run has taken the slot's sockets: it serves these too. Before
			// that, Run takes them from s.udp itself (and only from there:
			// both would serve one socket with two session tables).
			s.udpServe(udp)
		}
	}
	old := s.ln
	s.ln = ln
	close(s.lnSet) // serve's Accept on old fails: it takes the new one
	s.lnSet = make(chan struct{})
	s.lnMu.Unlock()
	_ = old.Close()
	a.log.Info("appliance: slot rebound", "slot", id, "addr", ln.Addr().String())
	return nil
}

func (a *Appliance) slot(id int) (*slot, error) {
	if id < 0 || id >= len(a.slots) {
		return nil, fmt.Errorf("%w: %d (have 0..%d)", ErrNoSlot, id, len(a.slots)-1)
	}
	return a.slots[id], nil
}

// Info returns what the shell registers with the control plane.
func (a *Appliance) Info() Info {
	info := Info{ID: a.cfg.ID, Management: a.ManagementAddr(), Roles: roles.Names()}
	for _, s := range a.slots {
		info.Slots = append(info.Slots, s.info())
	}
	return info
}

// Run serves every slot (and the management API when configured), registers
// with the Registrar and heartbeats, until ctx ends. It then closes the
// listeners, the connections and the roles, and waits for its goroutines.
func (a *Appliance) Run(ctx context.Context) error {
	if a.closed.Load() {
		return ErrNotReady
	}
	if a.running.Swap(true) {
		return ErrRunning
	}
	defer a.running.Store(false)
	defer a.closed.Store(true)
	a.started.Store(a.cfg.Clock.Now().UnixNano())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	// udpWG counts the slots' UDP servers, started here or by Rebind (under
	// the slot's lnMu, while its udpServe is set): closeListener clears
	// udpServe before udpWG.Wait, so no Add follows the Wait.
	var udpWG sync.WaitGroup
	errc := make(chan error, len(a.slots)+2)
	for _, s := range a.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.serve(ctx); err != nil {
				errc <- err
				cancel()
			}
		}()
		s.lnMu.Lock()
		if s.udp != nil && !s.lnClosed {
			s.udpServe = func(conns []net.PacketConn) {
				udpWG.Add(1)
				go func() {
					defer udpWG.Done()
					s.serveUDP(ctx, conns)
				}()
			}
			s.udpServe(s.udp)
		}
		s.lnMu.Unlock()
	}
	if a.mgmt != nil {
		hs := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second}
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := hs.Serve(a.mgmt); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("appliance: management: %w", err)
				cancel()
			}
		}()
		go func() {
			defer wg.Done()
			<-ctx.Done()
			sctx, c := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer c()
			_ = hs.Shutdown(sctx)
		}()
	}
	if a.cfg.Registrar != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.register(ctx)
		}()
	}
	attrs := []any{"id", a.cfg.ID, "slots", len(a.slots)}
	if m := a.ManagementAddr(); m != "" {
		// Else there is none, or its owner serves it (`rialto appliance`
		// says where).
		attrs = append(attrs, "management", m)
	}
	a.log.Info("appliance: running", attrs...)
	<-ctx.Done()
	for _, s := range a.slots {
		s.closeListener() // Rebind refuses from here on: nothing left to serve
	}
	wg.Wait()
	udpWG.Wait()
	for _, s := range a.slots {
		s.setRole(nil, roles.Spec{})
	}
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// register boots the shell into the control plane: Register (retried with
// backoff) then a Heartbeat every interval.
func (a *Appliance) register(ctx context.Context) {
	r := a.cfg.Registrar
	retry := backoff.Backoff{Min: 100 * time.Millisecond, Max: 10 * time.Second, Clock: a.cfg.Clock}
	for {
		err := r.Register(ctx, a.Info())
		if err == nil {
			break
		}
		a.log.Warn("appliance: register failed", "err", err)
		if retry.Wait(ctx) != nil {
			return
		}
	}
	tick := a.cfg.Clock.NewTicker(a.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		if err := r.Heartbeat(ctx, a.Health()); err != nil && ctx.Err() == nil {
			a.log.Warn("appliance: heartbeat failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
	}
}

// Slots returns the status of every slot.
func (a *Appliance) Slots() []SlotStatus {
	out := make([]SlotStatus, len(a.slots))
	for i, s := range a.slots {
		out[i] = s.status()
	}
	return out
}

// Slot returns one slot's status.
func (a *Appliance) Slot(id int) (SlotStatus, error) {
	s, err := a.slot(id)
	if err != nil {
		return SlotStatus{}, err
	}
	return s.status(), nil
}

// Health reports the shell's health and every slot's status.
func (a *Appliance) Health() Health {
	h := Health{ID: a.cfg.ID, Time: a.cfg.Clock.Now().UTC(), Healthy: a.running.Load(), Slots: a.Slots()}
	if t := a.started.Load(); t != 0 {
		h.Uptime = a.cfg.Clock.Since(time.Unix(0, t)).Seconds()
	}
	return h
}

// Load builds the role spec names and loads it into slot id, replacing the
// current role. Tasks running on the old role finish on it; other slots are
// not touched. On error the slot keeps its current role.
func (a *Appliance) Load(ctx context.Context, id int, spec roles.Spec) error {
	s, err := a.slot(id)
	if err != nil {
		return err
	}
	r, err := roles.New(ctx, spec)
	if err != nil {
		return fmt.Errorf("appliance: slot %d: %w", id, err)
	}
	s.setRole(r, spec)
	a.log.Info("appliance: role loaded", "slot", id, "role", spec.Name)
	return nil
}

// Unload removes slot id's role; later tasks fail with accel.ErrNoRole.
func (a *Appliance) Unload(_ context.Context, id int) error {
	s, err := a.slot(id)
	if err != nil {
		return err
	}
	s.setRole(nil, roles.Spec{})
	a.log.Info("appliance: role unloaded", "slot", id)
	return nil
}

// Reset zeroes slot id's memory and reloads its role from its spec (a
// fresh instance), keeping the lease.
func (a *Appliance) Reset(ctx context.Context, id int) error {
	s, err := a.slot(id)
	if err != nil {
		return err
	}
	s.memMu.Lock()
	clear(s.mem)
	s.memGen++
	s.memMu.Unlock()
	cur := s.role.Load()
	if cur == nil {
		s.gen.Add(1)
		return nil
	}
	r, err := roles.New(ctx, cur.spec)
	if err != nil {
		return fmt.Errorf("appliance: slot %d reset: %w", id, err)
	}
	s.setRole(r, cur.spec)
	return nil
}

// SetCredential sets the lease credential slot id accepts, ending the
// previous lease: its connections are closed and its running tasks
// interrupted, and SetCredential returns once they have stopped. An empty
// credential leaves the slot unleased; either way, unless credential is
// the one already set, the slot's memory is zeroed, so the next borrower
// sees nothing of the last one.
func (a *Appliance) SetCredential(id int, credential []byte) error {
	s, err := a.slot(id)
	if err != nil {
		return err
	}
	if cur := s.currentLease(); !bytes.Equal(credential, cur.cred) {
		s.deadline.Store(nil) // the last lease's, not the next one's
	}
	old := s.swapLease(newLease(credential))
	// Close the old lease's connections and wait for their tasks, so that
	// no late task output lands in memory after it is wiped.
	old.end()
	// A new lease (or none) starts with zeroed memory; setting the same
	// credential again keeps the lease's bytes.
	if len(credential) == 0 || !bytes.Equal(credential, old.cred) {
		s.memMu.Lock()
		clear(s.mem)
		s.memGen, s.memo = s.memGen+1, nil
		s.memMu.Unlock()
	}
	return nil
}

// SetDeadline makes dl the deadline of slot id's current lease (nil:
// none; a new credential clears it): a memory access (WRITE, READ), a
// task (on any path: the mailbox, UDP, HTTP) or a block move (LOAD,
// STORE) that reaches the slot once dl has passed is refused with
// accel.ErrLeaseExpired without touching its memory or role, whether or
// not the lease has ended yet; moving dl (clock.Deadline.Set: a renewal)
// serves them again.
func (a *Appliance) SetDeadline(id int, dl *clock.Deadline) error {
	s, err := a.slot(id)
	if err != nil {
		return err
	}
	s.deadline.Store(dl)
	return nil
}

// expired refuses a request once the slot's deadline has passed: one
// atomic load, and one clock reading while a deadline is set.
func (s *slot) expired() error {
	if s.deadline.Load().Passed() {
		return fmt.Errorf("%w (slot %d)", accel.ErrLeaseExpired, s.id)
	}
	return nil
}

// lease is one credential and the lifetime of its connections.
type lease struct {
	cred []byte

	mu      sync.Mutex
	ended   bool
	cancels map[int]context.CancelFunc // the users' (guarded by mu)
	nextID  int
	users   sync.WaitGroup // connections and HTTP calls under this lease
}

// enter registers a user of the lease, whose work cancel stops when the
// lease ends; the user calls exit when done. It fails once the lease has
// ended.
func (l *lease) enter(cancel context.CancelFunc) (exit func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return nil, false
	}
	id := l.nextID
	l.nextID++
	l.cancels[id] = cancel
	l.users.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.cancels, id)
			l.mu.Unlock()
			l.users.Done()
		})
	}, true
}

// end cancels the lease's users and waits for them.
func (l *lease) end() {
	l.mu.Lock()
	l.ended = true
	cancels := make([]context.CancelFunc, 0, len(l.cancels))
	for _, c := range l.cancels {
		cancels = append(cancels, c)
	}
	l.mu.Unlock()
	for _, c := range cancels {
		c()
	}
	l.users.Wait()
}

func newLease(cred []byte) *lease {
	return &lease{cred: append([]byte(nil), cred...), cancels: map[int]context.CancelFunc{}}
}

// loaded is a role in a slot with a count of the tasks using it; a
// replaced role is closed when its last task ends.
type loaded struct {
	role     roles.Role
	spec     roles.Spec
	at       time.Time
	mu       sync.Mutex
	users    int
	retired  bool
	isClosed bool
}

func (l *loaded) acquire() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.retired {
		return false
	}
	l.users++
	return true
}

func (l *loaded) release() {
	l.mu.Lock()
	l.users--
	closeNow := l.retired && l.users == 0 && !l.isClosed
	if closeNow {
		l.isClosed = true
	}
	l.mu.Unlock()
	if closeNow {
		_ = l.role.Close(context.Background())
	}
}

func (l *loaded) retire() {
	l.mu.Lock()
	l.retired = true
	closeNow := l.users == 0 && !l.isClosed
	if closeNow {
		l.isClosed = true
	}
	l.mu.Unlock()
	if closeNow {
		_ = l.role.Close(context.Background())
	}
}

// slot is one virtual accelerator: a listener, a memory chunk and a role.
type slot struct {
	a  *Appliance
	id int

	lnMu     sync.Mutex
	ln       net.Listener     // replaced by Rebind
	lnSet    chan struct{}    // closed (and replaced) when ln is replaced
	lnClosed bool             // ln is closed for good: Rebind refuses
	udp      []net.PacketConn // the UDP message path's sockets (Config.UDPQueues), guarded by lnMu
	// udpServe, set by Run while it serves the slot (guarded by lnMu),
	// serves sockets Rebind binds; nil when Run has not taken s.udp yet or
	// has stopped.
	udpServe func([]net.PacketConn)

	mem   []byte // a.mem[base:base+size:base+size]: the only memory it can reach
	memMu sync.RWMutex
	// memGen counts writes to mem and memo is the output a LOAD computed
	// while its bytes landed (blockio.go), both guarded by memMu.
	memGen uint64
	memo   *memo
	sem    chan struct{}
	role   atomic.Pointer[loaded]
	gen    atomic.Uint64

	leaseMu sync.Mutex
	lease   *lease
	// deadline, if set, is when the current lease stops being served
	// (SetDeadline; cleared with a new credential): checked by every
	// memory access, task and block move of the slot.
	deadline atomic.Pointer[clock.Deadline]

	tasks, failed, items, bytesIn, bytesOut, busyNs atomic.Uint64
	blockIn, blockOut                               atomic.Uint64
	inflight                                        atomic.Int64
}

func (s *slot) info() SlotInfo {
	c := s.a.offsets[s.id]
	return SlotInfo{ID: s.id, Addr: s.listener().Addr().String(), MemSize: c.size, Base: c.base}
}

// listener is the slot's current listener.
func (s *slot) listener() net.Listener {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	return s.ln
}

// closeListener closes the slot's listener for good (Rebind refuses from
// then on and no longer hands sockets to Run).
func (s *slot) closeListener() {
	s.lnMu.Lock()
	s.lnClosed = true
	s.udpServe = nil
	ln := s.ln
	s.lnMu.Unlock()
	_ = ln.Close()
}

func (s *slot) status() SlotStatus {
	st := SlotStatus{SlotInfo: s.info(), Generation: s.gen.Load(), Tasks: s.tasks.Load(),
		Failed: s.failed.Load(), Items: s.items.Load(), BytesIn: s.bytesIn.Load(), BytesOut: s.bytesOut.Load(),
		BlockIn: s.blockIn.Load(), BlockOut: s.blockOut.Load(),
		BusySec: float64(s.busyNs.Load()) / 1e9, InFlight: s.inflight.Load()}
	if l := s.role.Load(); l != nil {
		st.Role, st.Entries, st.LoadedAt = l.spec.Name, l.role.Entries(), l.at
	}
	s.leaseMu.Lock()
	st.Leased = len(s.lease.cred) > 0
	s.leaseMu.Unlock()
	return st
}

func (s *slot) setRole(r roles.Role, spec roles.Spec) {
	var nl *loaded
	if r != nil {
		nl = &loaded{role: r, spec: spec, at: s.a.cfg.Clock.Now().UTC()}
	}
	old := s.role.Swap(nl)
	s.gen.Add(1)
	if old != nil {
		old.retire()
	}
}

func (s *slot) swapLease(l *lease) *lease {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	old := s.lease
	s.lease = l
	return old
}

func (s *slot) currentLease() *lease {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return s.lease
}

// serve accepts mailbox connections; each lives at most as long as the lease
// that was current when it was accepted (and must present its credential).
func (s *slot) serve(ctx context.Context) error {
	// A task's input is at most the slot's memory: two slots' worth of
	// queued tasks' inputs is enough to keep the workers busy, and bounds
	// what a lease's queued tasks make the appliance hold.
	// Likewise a READ's reply is at most the slot's memory (and a frame):
	// two of them queued, and not yet written to a socket, is enough to
	// keep a reading client busy, and bounds what a client that stops
	// reading makes the appliance hold (at least 1 MiB, for pipelined
	// small reads of a small slot).
	reply := max(min(int64(len(s.mem)), int64(s.a.cfg.MaxPayload)), 512<<10)
	srv := &accel.Server{Target: (*slotTarget)(s), Logger: s.a.log.With("slot", s.id), MaxPayload: s.a.cfg.MaxPayload, TLS: s.a.cfg.TLS,
		MaxTaskInput: 2 * int64(max(len(s.mem), 1)), MaxQueuedReplies: 2 * reply}
	stop := context.AfterFunc(ctx, s.closeListener)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	var retry accept.Backoff
	for {
		s.lnMu.Lock()
		ln, rebound := s.ln, s.lnSet
		s.lnMu.Unlock()
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			select {
			case <-rebound: // Rebind closed ln: accept on its successor
				continue
			default:
			}
			// A timeout, or out of descriptors or memory for now.
			if retry.Retry(ctx, err, s.a.log) {
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("appliance: slot %d accept: %w", s.id, err)
		}
		retry.Reset()
		cctx, cancel := context.WithCancel(ctx)
		exit, ok := s.currentLease().enter(cancel)
		if !ok { // ended between the two calls: the new one is current
			if exit, ok = s.currentLease().enter(cancel); !ok {
				cancel()
				_ = nc.Close()
				continue
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer exit()
			defer cancel()
			srv.ServeConn(cctx, nc)
		}()
	}
}

// slotTarget is a slot seen by the accel server.
type slotTarget slot

func (t *slotTarget) Authenticate(cred []byte) error {
	return t.authenticate((*slot)(t).currentLease(), cred)
}

// authenticate checks cred against lease l of the slot.
func (t *slotTarget) authenticate(l *lease, cred []byte) error {
	s := (*slot)(t)
	if len(l.cred) == 0 {
		return fmt.Errorf("%w: slot %d is not leased", accel.ErrAuth, s.id)
	}
	if subtle.ConstantTimeCompare(cred, l.cred) != 1 {
		return fmt.Errorf("%w: wrong credential for slot %d", accel.ErrAuth, s.id)
	}
	return nil
}

func (t *slotTarget) Info() accel.Info {
	s := (*slot)(t)
	info := accel.Info{MemSize: uint64(len(s.mem))}
	if l := s.role.Load(); l != nil {
		info.Role, info.Entries = l.spec.Name, l.role.Entries()
	}
	return info
}

// bounds is the memory virtualizer's check: [addr, addr+n) must lie in the
// slot's own chunk.
func (s *slot) bounds(addr, n uint64) error {
	size := uint64(len(s.mem))
	if addr > size || n > size-addr {
		return fmt.Errorf("%w: slot %d [%#x, +%d) outside its %d-byte memory", accel.ErrOutOfRange, s.id, addr, n, size)
	}
	return nil
}

func (t *slotTarget) WriteMem(addr uint64, p []byte) error {
	s := (*slot)(t)
	if err := s.expired(); err != nil {
		return err
	}
	if err := s.bounds(addr, uint64(len(p))); err != nil {
		return err
	}
	s.memMu.Lock()
	copy(s.mem[addr:], p)
	s.memGen++
	s.memMu.Unlock()
	s.bytesIn.Add(uint64(len(p)))
	return nil
}

func (t *slotTarget) ReadMem(addr uint64, n uint32) ([]byte, error) {
	s := (*slot)(t)
	if err := s.expired(); err != nil {
		return nil, err
	}
	if err := s.bounds(addr, uint64(n)); err != nil {
		return nil, err
	}
	s.memMu.RLock()
	out := append([]byte(nil), s.mem[addr:addr+uint64(n)]...)
	s.memMu.RUnlock()
	s.bytesOut.Add(uint64(n))
	return out, nil
}

func (t *slotTarget) Execute(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	s := (*slot)(t)
	if err := s.expired(); err != nil {
		return nil, err
	}
	outs, err := s.execute(ctx, entry, ins)
	outcome := "ok"
	s.tasks.Add(1)
	if err != nil {
		outcome = "error"
		s.failed.Add(1)
	}
	if s.a.mTasks != nil {
		s.a.mTasks.WithLabelValues(strconv.Itoa(s.id), outcome).Inc()
	}
	return outs, err
}

func (s *slot) execute(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	var l *loaded
	for {
		l = s.role.Load()
		if l == nil {
			return nil, fmt.Errorf("%w in slot %d", accel.ErrNoRole, s.id)
		}
		if l.acquire() {
			break
		}
	}
	defer l.release()
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-s.sem }()
	// Arrived before the lease's deadline, perhaps started after it
	// (it waited for the slot).
	if err := s.expired(); err != nil {
		return nil, err
	}
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	t0 := time.Now()
	// Outputs come back in a reply (up to MaxPayload) or go to the slot's
	// memory (a mailbox task): either must fit.
	outs, err := roles.RunBatch(ctx, l.role, entry, ins, max(int(s.a.cfg.MaxPayload), len(s.mem)))
	d := time.Since(t0)
	s.busyNs.Add(uint64(d))
	if s.a.mBusy != nil {
		s.a.mBusy.WithLabelValues(strconv.Itoa(s.id)).Add(d.Seconds())
	}
	s.items.Add(uint64(len(ins)))
	if s.a.log.Enabled(ctx, slog.LevelDebug) { // tasks can be many and small (UDP messages)
		s.a.log.Debug("appliance: ran a task", "slot", s.id, "entry", entry, "items", len(ins), "seconds", d.Seconds())
	}
	if err != nil {
		if accel.CodeOf(err) == accel.CodeInternal {
			err = fmt.Errorf("%w: %v", accel.ErrRoleFailed, err)
		}
		return nil, err
	}
	return outs, nil
}
