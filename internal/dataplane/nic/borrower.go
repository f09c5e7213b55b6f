package nic

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/backoff"
	"github.com/rialto-project/rialto/internal/networds"
	"github.com/rialto-project/rialto/internal/pki"
	"github.com/vishvananda/netlink"
)

// Mode is how a bond spreads packets.
type Mode string

// Bond modes (docs/nic.md, "Bonding").
const (
	// ModeFlow pins each flow (addresses, protocol, ports) to one lender,
	// a new flow going to the lender with the fewest flows for its rate: a
	// connection keeps the address its lender translates it to, and the
	// bond's bandwidth adds over flows.
	ModeFlow Mode = "flow"
	// ModePacket stripes packets round robin over several connections to
	// each lender, the receiving end restoring their order; flows are
	// still hashed to lenders, since every lender translates to its own
	// address.
	ModePacket Mode = "packet"
)

// ParseMode parses "flow" or "packet" ("" is flow).
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeFlow:
		return ModeFlow, nil
	case ModePacket:
		return ModePacket, nil
	}
	return "", fmt.Errorf("nic: bond mode %q (want flow or packet)", s)
}

// Member is one lender of an attached interface: its tunnel endpoint
// ("host:port"), the lease's credential, and whether its tunnel runs
// under TLS (a rialto-nics:// URI: dialled with Config.TLS).
type Member struct {
	Addr       string
	Credential string
	TLS        bool
}

// String keeps the credential out of logs.
func (m Member) String() string { return m.Addr }

// Config configures Attach.
type Config struct {
	Members []Member // one per lender (required)
	Mode    Mode     // "" is ModeFlow
	// Conns is the number of connections to each lender (default 1 in
	// flow mode, 2 in packet mode).
	Conns int
	// Name is the TUN interface to create (default "rnic0").
	Name string
	// MTU asks for an MTU (default 1500; the lenders may lower it).
	MTU int
	// Window is the download credit granted on each connection (default
	// DefaultWindow).
	Window uint32
	// Routes, if set, replaces the prefixes the lenders reach as what is
	// routed through the interface.
	Routes []netip.Prefix
	// DefaultRoute also routes everything else through the interface
	// (0.0.0.0/1 and 128.0.0.0/1, the lenders themselves pinned to their
	// current routes), if a lender reaches 0.0.0.0/0 or Routes has it.
	DefaultRoute bool
	// Keepalive is the PING interval (default DefaultKeepalive).
	Keepalive time.Duration
	// Dial opens connections (default: a net.Dialer with a 5 s timeout).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLS returns the client configuration for members whose tunnel runs
	// under TLS (Member.TLS): one that trusts the cluster CA, which the
	// lender's node certificate must chain to (pki.LoadClientTLS, or
	// pki.Roots.ClientTLS for the CA certificates in use as they change).
	// It is called at each dial, a lost member's redials included, so
	// that the CA certificates it trusts may change while the interface
	// is attached (a `rialto attach` following a CA rotation). An empty
	// ServerName is the host of the member's address. TLS 1.3 is the
	// minimum. Attach refuses a TLS member without it.
	TLS func() *tls.Config
	// Track, if set, is handed each tunnel connection under TLS once its
	// handshake is done (pki.TrackFunc): normally the Tracker of the
	// revocation list TLS checks lenders with (pki.Roots.Tracker). When a
	// list it takes later revokes the lender's certificate, the
	// connection is ended at once (ErrTLS, wrapping pki.ErrRevoked), and
	// so the member's session; its redial fails the handshake against
	// the list, and the member is then dropped (MemberStatus.Dropped,
	// Err saying why), not redialled, unless Refresh has its lender
	// elsewhere now. A connection Track refuses (a list taken since its
	// handshake revokes the lender) fails as a failed handshake does.
	Track pki.TrackFunc
	// Refresh, if set, is asked for member k's current Member (Members'
	// index) when a redial of it is refused for its URI's scheme: a TLS
	// lender was sent a plaintext HELLO (ErrTLSRequired), or a plaintext
	// lender a TLS handshake. Its lender was restarted with the other
	// --insecure-dataplane setting, and its lease's URI changed scheme
	// (rialto-nic:// and rialto-nics://): the member is redialled with
	// what Refresh returns (normally the lease's current URI, read from
	// the control plane). It is called on the member's own goroutine.
	Refresh func(ctx context.Context, k int) (Member, error)
	Logger  *slog.Logger
}

// MemberStatus is one lender's state.
type MemberStatus struct {
	Addr string
	Up   bool
	// Dropped: the member was dropped for good (Interface.Drop): it is
	// neither used nor redialled.
	Dropped bool
	Rate    uint64 // bits/s its lease is capped at (0: none)
	Routes  []netip.Prefix
	Err     string // why it is down
	Stats   Stats
}

// Interface is an attached NIC lease: a TUN interface in the caller's
// network namespace whose packets travel to the lenders (docs/nic.md).
type Interface struct {
	cfg    Config
	log    *slog.Logger
	tun    *os.File
	addr   netip.Addr
	mtu    int
	routes []netip.Prefix
	ctr    counters
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	members []*member
}

type member struct {
	i   *Interface
	idx int
	m   Member

	mu      sync.Mutex
	sess    *session
	rate    uint64
	routes  []netip.Prefix
	err     error
	ctr     counters
	up      atomic.Bool
	cancel  context.CancelFunc // ends run (Drop, Close)
	dropped atomic.Bool
}

// Attach connects to the lenders, creates the TUN interface, gives it the
// address the lenders assign and routes what they reach through it. It
// returns once the first lender is connected; the others are connected in
// the background and reconnected whenever they are lost. Close removes the
// interface.
func Attach(ctx context.Context, cfg Config) (_ *Interface, err error) {
	if len(cfg.Members) == 0 {
		return nil, errors.New("nic: Attach needs at least one member")
	}
	if cfg.Mode, err = ParseMode(string(cfg.Mode)); err != nil {
		return nil, err
	}
	if cfg.Conns == 0 {
		cfg.Conns = 1
		if cfg.Mode == ModePacket {
			cfg.Conns = 2
		}
	}
	if cfg.Conns < 1 || cfg.Conns > MaxConns {
		return nil, fmt.Errorf("nic: %d connections per lender (1..%d)", cfg.Conns, MaxConns)
	}
	if cfg.Name == "" {
		cfg.Name = "rnic0"
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if cfg.MTU < MinMTU || cfg.MTU > MaxMTU {
		return nil, fmt.Errorf("nic: mtu %d outside %d..%d", cfg.MTU, MinMTU, MaxMTU)
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Window < uint32(4*cfg.MTU) {
		return nil, fmt.Errorf("nic: window %d below four mtus", cfg.Window)
	}
	if cfg.Keepalive == 0 {
		cfg.Keepalive = DefaultKeepalive
	}
	for _, m := range cfg.Members {
		if m.TLS && cfg.TLS == nil {
			return nil, fmt.Errorf("%w: lender %s serves its tunnel under TLS (%s://) and no cluster CA is configured to verify it", ErrNoCA, m.Addr, SchemeTLS)
		}
	}
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: 5 * time.Second}
		cfg.Dial = d.DialContext
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	i := &Interface{cfg: cfg, log: cfg.Logger}
	for k, m := range cfg.Members {
		i.members = append(i.members, &member{i: i, idx: k, m: m})
	}
	// The first lender that answers assigns the address; the others are
	// asked for the same.
	var first *session
	var w Welcome
	var firstM *member
	var errs []error
	for _, m := range i.members {
		s, ww, err := m.dial(ctx, netip.Addr{})
		if err == nil {
			first, w, firstM = s, ww, m
			break
		}
		errs = append(errs, fmt.Errorf("%s: %w", m.member().Addr, err))
		if errors.Is(err, ErrAuth) || ctx.Err() != nil {
			break
		}
	}
	if first == nil {
		return nil, fmt.Errorf("nic: no lender connected: %w", errors.Join(errs...))
	}
	i.addr, i.mtu = w.Addr, int(w.MTU)
	if i.tun, err = openTUN(cfg.Name); err != nil {
		first.close(ErrClosed)
		return nil, err
	}
	if err := i.configure(firstM, w); err != nil {
		first.close(ErrClosed)
		_ = closeTUN(i.tun, cfg.Name)
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	i.cancel = cancel
	for _, m := range i.members {
		var s *session
		if m == firstM {
			s = first
			m.setUp(s, w)
		}
		mctx, mcancel := context.WithCancel(rctx)
		m.cancel = mcancel
		i.wg.Add(1)
		go func() {
			defer i.wg.Done()
			defer mcancel()
			m.run(mctx, s)
		}()
	}
	i.wg.Add(1)
	go func() {
		defer i.wg.Done()
		i.upLoop()
	}()
	i.log.Info("nic: attached", "iface", cfg.Name, "addr", i.addr, "mtu", i.mtu, "lenders", len(cfg.Members), "mode", cfg.Mode)
	return i, nil
}

// configure gives the interface its MTU, address and routes.
func (i *Interface) configure(m *member, w Welcome) error {
	link, err := linkUp(i.cfg.Name, i.mtu, 500)
	if err != nil {
		return err
	}
	if err := netlink.AddrReplace(link, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(i.addr, 32))}); err != nil {
		return fmt.Errorf("nic: address %v on %s: %w", i.addr, i.cfg.Name, err)
	}
	routes := i.cfg.Routes
	if routes == nil {
		// Every member lends the same kind of reach in a composed lease;
		// the first one's routes are the interface's, the others' are
		// added as they connect.
		routes = w.Routes
	}
	return i.addRoutes(routes)
}

// addRoutes routes prefixes through the interface (0.0.0.0/0 only with
// DefaultRoute, as two halves).
func (i *Interface) addRoutes(ps []netip.Prefix) error {
	link, err := netlink.LinkByName(i.cfg.Name)
	if err != nil {
		return fmt.Errorf("nic: %s: %w", i.cfg.Name, err)
	}
	var add []netip.Prefix
	for _, p := range ps {
		if p.Bits() == 0 {
			if i.cfg.DefaultRoute {
				add = append(add, netip.MustParsePrefix("0.0.0.0/1"), netip.MustParsePrefix("128.0.0.0/1"))
			}
			continue
		}
		add = append(add, p)
	}
	for _, p := range add {
		if slices.Contains(i.routes, p) {
			continue
		}
		// The lenders must stay reachable the way they are now.
		for _, m := range i.cfg.Members {
			if err := pinHost(m.Addr, p); err != nil {
				return err
			}
		}
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: prefixNet(p), Src: net.IP(i.addr.AsSlice()), Scope: netlink.SCOPE_LINK}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("nic: route %v dev %s: %w", p, i.cfg.Name, err)
		}
		i.routes = append(i.routes, p)
	}
	return nil
}

// pinHost adds a host route for the lender at hostport through its current
// route if p would capture it.
func pinHost(hostport string, p netip.Prefix) error {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !p.Contains(a) {
		return nil
	}
	rs, err := netlink.RouteGet(net.IP(a.AsSlice()))
	if err != nil || len(rs) == 0 {
		return fmt.Errorf("nic: route to lender %v: %v", a, err)
	}
	r := &netlink.Route{LinkIndex: rs[0].LinkIndex, Dst: prefixNet(netip.PrefixFrom(a, 32)), Gw: rs[0].Gw}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("nic: pin route to lender %v: %w", a, err)
	}
	return nil
}

// Name is the TUN interface's name.
func (i *Interface) Name() string { return i.cfg.Name }

// Addr is the interface's address.
func (i *Interface) Addr() netip.Addr { return i.addr }

// MTU is the interface's MTU.
func (i *Interface) MTU() int { return i.mtu }

// Routes are the prefixes routed through the interface.
func (i *Interface) Routes() []netip.Prefix { return slices.Clone(i.routes) }

// Stats are the interface's counters (all lenders together).
func (i *Interface) Stats() Stats {
	s := i.ctr.snapshot()
	for _, m := range i.members {
		s = s.Add(m.ctr.snapshot())
	}
	return s
}

// Members reports each lender's state.
func (i *Interface) Members() []MemberStatus {
	out := make([]MemberStatus, len(i.members))
	for k, m := range i.members {
		m.mu.Lock()
		out[k] = MemberStatus{Addr: m.m.Addr, Up: m.up.Load(), Dropped: m.dropped.Load(), Rate: m.rate, Routes: slices.Clone(m.routes), Stats: m.ctr.snapshot()}
		if m.err != nil {
			out[k].Err = m.err.Error()
		}
		m.mu.Unlock()
	}
	return out
}

// Drop drops member k (Config.Members' index) for good: its session ends,
// it is not redialled, and the flows it carried move to the others — a
// bond that lost a lender goes on degraded (the control plane declared
// the lender's part lost). The interface keeps its address and routes.
// Dropping the last member leaves an interface that carries nothing.
func (i *Interface) Drop(k int) error {
	if k < 0 || k >= len(i.members) {
		return fmt.Errorf("nic: no member %d (of %d)", k, len(i.members))
	}
	m := i.members[k]
	if m.dropped.Swap(true) {
		return nil
	}
	if m.cancel != nil {
		m.cancel() // run ends: its session is closed, no redial
	}
	m.mu.Lock()
	s := m.sess
	m.mu.Unlock()
	if s != nil {
		s.close(ErrClosed)
	}
	m.up.Store(false)
	i.log.Warn("nic: lender dropped from the bond", "lender", m.member().Addr, "left", len(i.members)-i.droppedCount())
	return nil
}

func (i *Interface) droppedCount() int {
	n := 0
	for _, m := range i.members {
		if m.dropped.Load() {
			n++
		}
	}
	return n
}

// Close disconnects from the lenders and deletes the interface.
func (i *Interface) Close() error {
	i.once.Do(func() {
		i.cancel()
		_ = closeTUN(i.tun, i.cfg.Name) // ends upLoop's read; deletes the interface
		for _, m := range i.members {
			m.mu.Lock()
			s := m.sess
			m.mu.Unlock()
			if s != nil {
				s.close(ErrClosed)
			}
		}
		i.wg.Wait()
	})
	return nil
}

// upLoop carries packets the kernel routes into the interface to a lender.
func (i *Interface) upLoop() {
	buf := make([]byte, MaxPacket)
	eligible := make([]int, 0, len(i.members))
	flows := newFlowTable(len(i.members))
	weight := func(k int) float64 { return i.members[k].weight() }
	for {
		n, err := i.tun.Read(buf)
		if err != nil {
			return
		}
		pkt := buf[:n]
		_, dst, ok := ipv4(pkt)
		if !ok {
			i.ctr.filter.Add(1)
			continue
		}
		eligible = eligible[:0]
		for k, m := range i.members {
			if m.up.Load() && m.reaches(dst) {
				eligible = append(eligible, k)
			}
		}
		if len(eligible) == 0 {
			i.ctr.nopath.Add(1)
			continue
		}
		h := flowHash(pkt)
		best := i.members[eligible[0]]
		if len(i.members) > 1 {
			best = i.members[flows.pick(h, eligible, weight, time.Now())]
		}
		best.mu.Lock()
		s := best.sess
		best.mu.Unlock()
		if s != nil && s.send(pkt, h) {
			best.ctr.txP.Add(1)
			best.ctr.txB.Add(uint64(n))
		}
	}
}

func (m *member) reaches(dst netip.Addr) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.routes {
		if p.Contains(dst) {
			return true
		}
	}
	return false
}

func (m *member) weight() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rate == 0 {
		return 1e9
	}
	return float64(m.rate)
}

// deliver writes a packet from a lender into the interface.
func (m *member) deliver(pkt []byte) error {
	if _, dst, ok := ipv4(pkt); !ok || dst != m.i.addr {
		m.ctr.filter.Add(1)
		return nil
	}
	if _, err := m.i.tun.Write(pkt); err != nil {
		m.ctr.filter.Add(1)
		return nil
	}
	m.ctr.rxP.Add(1)
	m.ctr.rxB.Add(uint64(len(pkt)))
	return nil
}

// dial opens a session of Conns connections to the member's lender.
func (m *member) dial(ctx context.Context, want netip.Addr) (*session, Welcome, error) {
	cfg := m.i.cfg
	mm := m.member()
	var sid [8]byte
	_, _ = rand.Read(sid[:])
	id := binary.BigEndian.Uint64(sid[:]) | 1
	s := newSession(id, cfg.Conns, cfg.Mode == ModePacket && cfg.Conns > 1, &m.ctr, m.deliver)
	var first Welcome
	var qps []*qp
	fail := func(err error) (*session, Welcome, error) {
		for _, q := range qps {
			q.fail(err)
		}
		return nil, Welcome{}, err
	}
	for k := range cfg.Conns {
		c, err := cfg.Dial(ctx, "tcp", mm.Addr)
		if err != nil {
			return fail(fmt.Errorf("%w: %v", ErrLost, err))
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		_ = c.SetDeadline(time.Now().Add(helloTimeout))
		if mm.TLS {
			base := cfg.TLS()
			if base == nil {
				c.Close()
				return fail(fmt.Errorf("%w: lender %s serves its tunnel under TLS (%s://) and no cluster CA is configured to verify it", ErrNoCA, mm.Addr, SchemeTLS))
			}
			tc := tls.Client(c, clientTLS(base, mm.Addr))
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return fail(tlsDialErr(mm.Addr, err))
			}
			c = tc
		}
		h := Hello{Conns: uint8(cfg.Conns), Index: uint8(k), Session: id, Window: cfg.Window, MTU: uint16(cfg.MTU), Addr: want, Lease: LeaseID(mm.Credential)}
		hb := h.Encode(nil)
		if _, err := c.Write(hb); err != nil {
			c.Close()
			return fail(fmt.Errorf("%w: %v", ErrLost, err))
		}
		challenge, refused, err := ReadChallenge(c)
		if err != nil {
			c.Close()
			return fail(fmt.Errorf("%w: challenge: %v", ErrLost, err))
		}
		var w Welcome
		if refused != nil {
			w = *refused
		} else {
			proof := Proof(mm.Credential, challenge, hb)
			if _, err := c.Write(proof[:]); err != nil {
				c.Close()
				return fail(fmt.Errorf("%w: %v", ErrLost, err))
			}
			if w, err = ReadWelcome(c); err != nil {
				c.Close()
				return fail(fmt.Errorf("%w: welcome: %v", ErrLost, err))
			}
		}
		if w.Status != StatusOK {
			c.Close()
			e := StatusErr(w.Status)
			if w.Message != "" {
				e = fmt.Errorf("%w (%s)", e, w.Message)
			}
			return fail(e)
		}
		if want.IsValid() && w.Addr != want {
			c.Close()
			return fail(fmt.Errorf("%w: lender gave %v, the interface has %v", ErrAddr, w.Addr, want))
		}
		want = w.Addr
		_ = c.SetDeadline(time.Time{})
		q := newQP(c, w.Window, cfg.Window, cfg.Keepalive)
		if tc, ok := c.(*tls.Conn); ok && cfg.Track != nil {
			// A list taken since the handshake is checked here: nothing
			// was carried on the connection yet.
			untrack, err := cfg.Track(mm.Addr, tc.ConnectionState(), func(why error) {
				q.fail(fmt.Errorf("%w: lender %s: %w", ErrTLS, mm.Addr, why))
			})
			if err != nil {
				c.Close()
				return fail(tlsDialErr(mm.Addr, err))
			}
			q.setUntrack(untrack)
		}
		qps = append(qps, q)
		s.join(k, q)
		if k == 0 {
			first = w
		}
	}
	return s, first, nil
}

// run keeps the member connected until ctx ends: it serves the session s
// (if given, else dials one), and after a loss dials again with backoff.
func (m *member) run(ctx context.Context, s *session) {
	retry := backoff.Backoff{Min: 50 * time.Millisecond, Max: 2 * time.Second}
	refreshed := false // since the member was last up
	for ctx.Err() == nil {
		if s == nil {
			var w Welcome
			var err error
			s, w, err = m.dial(ctx, m.i.addr)
			if err != nil {
				m.setDown(err)
				if errors.Is(err, pki.ErrRevoked) && !m.refresh(ctx, "its part's URI changed since its certificate was found revoked") {
					// No redial will verify this lender (its node
					// removed, its certificate revoked by an operator).
					m.dropped.Store(true)
					m.i.log.Error("nic: the lender presents a revoked certificate: dropped from the bond, not redialled",
						"lender", m.member().Addr, "left", len(m.i.members)-m.i.droppedCount(), "err", err)
					return
				}
				if !refreshed && refusedForScheme(err) && m.refresh(ctx, "its URI changed scheme") {
					// The lease's URI changed scheme: redial it at once
					// (once: a second refusal waits like any other).
					refreshed = true
					continue
				}
				refreshed = false
				if retry.Wait(ctx) != nil {
					return
				}
				continue
			}
			if m.i.cfg.Routes == nil {
				if err := m.i.addRoutes(w.Routes); err != nil {
					m.i.log.Warn("nic: routes of a lender", "lender", m.member().Addr, "err", err)
				}
			}
			m.setUp(s, w)
		}
		retry.Reset()
		err := m.serve(ctx, s)
		m.setDown(err)
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, ErrGone):
			// The lender ended the session and says why (an ERROR of
			// StatusGone): the lease ended there, or its known expiry
			// passed ("lease L expired at T"). Redialled: a renewal
			// serves it again.
			m.i.log.Warn("nic: the lender ended the lease's session", "lender", m.member().Addr, "err", err)
		default:
			m.i.log.Warn("nic: lender lost", "lender", m.member().Addr, "err", err)
		}
		s = nil
	}
}

// member is the member's lender as last given (Config.Members, then
// Config.Refresh).
func (m *member) member() Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.m
}

// refusedForScheme reports whether a dial failed for the scheme of the
// member's URI: a TLS lender sent a plaintext HELLO, or a plaintext lender
// a TLS handshake.
func refusedForScheme(err error) bool {
	var ws wrongScheme
	return errors.Is(err, ErrTLSRequired) || errors.As(err, &ws)
}

// refresh asks Config.Refresh for the member's current lender after a
// dial refused for its scheme, or for its certificate revoked, and
// reports whether it changed (then the member is redialled with it;
// what says how, in the log).
func (m *member) refresh(ctx context.Context, what string) bool {
	cfg := m.i.cfg
	if cfg.Refresh == nil {
		return false
	}
	old := m.member()
	nm, err := cfg.Refresh(ctx, m.idx)
	if err != nil {
		m.i.log.Warn("nic: a lender refused its URI's scheme, and the lease could not be read again", "lender", old.Addr, "err", err)
		return false
	}
	if nm == old {
		return false
	}
	if nm.TLS && cfg.TLS == nil {
		m.setDown(fmt.Errorf("%w: lender %s now serves its tunnel under TLS (%s://) and no cluster CA is configured to verify it", ErrNoCA, nm.Addr, SchemeTLS))
		return false
	}
	m.mu.Lock()
	m.m = nm
	m.mu.Unlock()
	m.i.log.Info("nic: redialling a lender: "+what, "lender", nm.Addr, "tls", nm.TLS)
	return true
}

func (m *member) setUp(s *session, w Welcome) {
	m.mu.Lock()
	m.sess, m.err = s, nil
	if w.Status == StatusOK && w.MTU != 0 {
		m.rate, m.routes = w.Rate, w.Routes
	}
	m.mu.Unlock()
	m.up.Store(!m.dropped.Load())
}

func (m *member) setDown(err error) {
	m.up.Store(false)
	m.mu.Lock()
	m.sess, m.err = nil, err
	m.mu.Unlock()
}

// serve runs the session's connections until one ends or ctx does.
func (m *member) serve(ctx context.Context, s *session) error {
	stop := context.AfterFunc(ctx, func() { s.close(ErrClosed) })
	defer stop()
	qs := s.conns()
	errc := make(chan error, len(qs))
	for _, q := range qs {
		go func() { errc <- q.run(func(seq uint32, pkt []byte) error { return s.recv(q, seq, pkt) }) }()
	}
	err := <-errc
	s.close(err)
	for range len(qs) - 1 {
		<-errc
	}
	return err
}

// clientTLS is cfg for dialling the lender at addr: its host as
// ServerName when cfg names none, TLS 1.3 at least.
func clientTLS(cfg *tls.Config, addr string) *tls.Config {
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = addr
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
	}
	if cfg.MinVersion < tls.VersionTLS13 {
		cfg.MinVersion = tls.VersionTLS13
	}
	return cfg
}

// tlsDialErr is a failed TLS handshake with the lender at addr, in words
// (networds): a certificate not accepted or a lender that does not speak
// TLS is ErrTLS, the lender is not who the URI says (or not the lender
// the borrower can trust); anything else is a lost connection.
func tlsDialErr(addr string, err error) error {
	kind, words := networds.Describe(err)
	switch kind {
	case networds.PeerCertificate:
		return fmt.Errorf("%w: lender %s's certificate was not accepted (%s): %w", ErrTLS, addr, words, err)
	case networds.NotTLS:
		return wrongScheme{fmt.Errorf("%w: lender %s does not speak TLS (the lease's URI is %s://, its tunnel is plaintext): %w", ErrTLS, addr, SchemeTLS, err)}
	case networds.OwnCertificate:
		return fmt.Errorf("%w: lender %s refused the TLS handshake (%s): %w", ErrTLS, addr, words, err)
	case networds.Unreachable, networds.Broken:
		return fmt.Errorf("%w: TLS handshake with lender %s: %s: %w", ErrLost, addr, words, err)
	}
	return fmt.Errorf("%w: TLS handshake with lender %s: %w", ErrLost, addr, err)
}

// wrongScheme is a dial that failed because the lender does not speak
// TLS although its URI says it does (refusedForScheme).
type wrongScheme struct{ err error }

func (e wrongScheme) Error() string { return e.err.Error() }
func (e wrongScheme) Unwrap() error { return e.err }

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func netlinkByName(name string) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("nic: %s: %w", name, err)
	}
	return l, nil
}
