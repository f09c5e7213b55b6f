package nic

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/rialto-project/rialto/internal/accept"
	"github.com/rialto-project/rialto/internal/clock"
)

// Defaults.
const (
	// DefaultWindow is the credit window of each connection, both ways.
	DefaultWindow = 512 << 10
	// DefaultKeepalive is the interval of PINGs; a connection silent for
	// three intervals is dead.
	DefaultKeepalive = time.Second
	// helloTimeout bounds the handshake.
	helloTimeout = 10 * time.Second
)

// DefaultPool is the prefix borrower addresses come from (RFC 6598 shared
// address space, meant for addresses behind a carrier's NAT).
var DefaultPool = netip.MustParsePrefix("100.64.0.0/10")

// LenderConfig configures a Lender.
type LenderConfig struct {
	// Iface is the lent interface (required). Borrowers' traffic leaves
	// through it, translated to its address.
	Iface string
	// Rate is what the lender lends in total, in bits/s; a lease's rate is
	// capped at it. 0: no cap.
	Rate uint64
	// Pool is where borrower addresses come from (default DefaultPool).
	Pool netip.Prefix
	// Window is each connection's upload credit (default DefaultWindow).
	Window uint32
	// Keepalive is the PING interval (default DefaultKeepalive).
	Keepalive time.Duration
	// TLS, if set, is the server configuration of the tunnel (the node
	// certificate): Serve runs every connection under TLS 1.3 before its
	// HELLO, and leases' URIs are rialto-nics://. Nil: plaintext.
	TLS    *tls.Config
	Logger *slog.Logger
}

// LeaseSpec is one NIC lease at a lender.
type LeaseSpec struct {
	ID         string
	Credential string // what borrowers present (secret)
	// Rate caps the lease in bits/s, each direction (0: the lender's Rate).
	Rate uint64
	// Addr fixes the borrower's address (a bond's members share one). If
	// unset, the first session may ask for one in the pool, or the lender
	// picks one.
	Addr netip.Addr
	// Deadline, if set, is the lease's known expiry from the moment the
	// lease exists, as SetLeaseDeadline sets it: a HELLO that finds the
	// lease as soon as AddLease has made it findable is judged against
	// it (a lease whose deadline has passed is refused from its first
	// HELLO on). Moving it (clock.Deadline.Set: a renewal) moves the
	// lease's. Not part of what makes two specs of a lease the same.
	Deadline *clock.Deadline `json:"-"`
}

// LeaseInfo is a lease's state.
type LeaseInfo struct {
	ID     string
	Iface  string // its TUN interface at the lender
	Addr   netip.Addr
	Rate   uint64
	Active bool // a borrower session is connected
	Stats  Stats
}

// Lender lends one network interface to borrowers (docs/nic.md).
type Lender struct {
	cfg  LenderConfig
	log  *slog.Logger
	host *hostNet
	mtu  int

	mu     sync.Mutex
	leases map[string]*lease            // by ID
	byCred map[[LeaseIDSize]byte]*lease // by LeaseID of the credential
	closed bool
	wg     sync.WaitGroup

	// hook, if set (tests), is called at the named points of a HELLO and
	// of a lease's removal, to order them.
	hook func(point string)
}

type lease struct {
	l       *Lender
	spec    LeaseSpec
	fixed   bool // the address may not change
	used    bool // a session has run: the address is settled
	addr    netip.Addr
	tunName string
	tun     *os.File
	rate    uint64
	up      *rate.Limiter
	down    *rate.Limiter
	ctr     counters
	done    chan struct{} // closed, under l.mu, when the lease ends

	mu   sync.Mutex
	sess *session

	// deadline, if set, is the lease's known expiry (LeaseSpec.Deadline,
	// SetLeaseDeadline):
	// checked as each packet is forwarded, either way, and at each HELLO.
	deadline atomic.Pointer[clock.Deadline]
}

// expiredError is why a lease's packet or HELLO is refused once its
// deadline has passed: StatusGone on the wire (an ERROR frame on each of
// the session's connections, or a WELCOME refusing a HELLO), whose
// message is this error's.
type expiredError struct {
	id string
	at time.Time
}

func (e expiredError) Error() string {
	return fmt.Sprintf("lease %s expired at %s", e.id, e.at.UTC().Format(time.RFC3339Nano))
}

func (e expiredError) Unwrap() error { return ErrGone }

// isExpired reports whether err is a lease's expiry (expiredError).
func isExpired(err error) bool {
	var e expiredError
	return errors.As(err, &e)
}

// expired reports whether the lease's deadline has passed: a packet
// forwarded then, either way, is dropped and ends the session. One atomic
// load, and one clock reading while a deadline is set.
func (ls *lease) expired() bool {
	return ls.deadline.Load().Passed()
}

// expiredErr is the error that refuses the lease's packets and HELLOs
// once its deadline has passed.
func (ls *lease) expiredErr() error {
	return expiredError{id: ls.spec.ID, at: ls.deadline.Load().At()}
}

// expire drops a packet of the lease forwarded once its deadline has
// passed and ends its session, if it has one, telling the borrower why
// (an ERROR frame of StatusGone on each connection).
func (ls *lease) expire() {
	ls.ctr.expired.Add(1)
	ls.mu.Lock()
	s := ls.sess
	ls.sess = nil
	ls.mu.Unlock()
	if s != nil {
		ls.endExpired(s, ls.expiredErr())
	}
}

// endExpired ends the lease's session s for err (expiredError), telling
// the borrower why on each of its connections; the first call for s logs it.
func (ls *lease) endExpired(s *session, err error) {
	if s.closeWith(err) {
		ls.l.log.Info("nic: lease's known expiry passed: its session ended, its packets dropped", "lease", ls.spec.ID, "err", err)
	}
}

// NewLender configures the kernel for lending cfg.Iface. Close undoes it.
func NewLender(ctx context.Context, cfg LenderConfig) (*Lender, error) {
	if cfg.Iface == "" {
		return nil, errors.New("nic: LenderConfig.Iface is required")
	}
	if !cfg.Pool.IsValid() {
		cfg.Pool = DefaultPool
	}
	if !cfg.Pool.Addr().Is4() || cfg.Pool.Bits() > 30 {
		return nil, fmt.Errorf("nic: address pool %v (want an IPv4 prefix of at most /30)", cfg.Pool)
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Keepalive == 0 {
		cfg.Keepalive = DefaultKeepalive
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h, err := setupHostNet(ctx, cfg.Iface)
	if err != nil {
		return nil, err
	}
	mtu := h.link.Attrs().MTU
	if mtu < MinMTU {
		h.close(ctx)
		return nil, fmt.Errorf("nic: %s has mtu %d, below %d", cfg.Iface, mtu, MinMTU)
	}
	if cfg.Window < uint32(4*min(mtu, MaxMTU)) {
		h.close(ctx)
		return nil, fmt.Errorf("nic: window %d below four mtus", cfg.Window)
	}
	return &Lender{cfg: cfg, log: cfg.Logger, host: h, mtu: min(mtu, MaxMTU),
		leases: map[string]*lease{}, byCred: map[[LeaseIDSize]byte]*lease{}}, nil
}

// Iface is the lent interface.
func (l *Lender) Iface() string { return l.cfg.Iface }

// Routes are the prefixes the lent interface reaches.
func (l *Lender) Routes() []netip.Prefix { return append([]netip.Prefix(nil), l.host.routes...) }

// tunName names a lease's TUN interface: "rn" and 10 hex digits of a hash
// of the lease and the lent interface.
func tunName(iface, id string) string {
	s := sha256.Sum256([]byte(iface + "\x00" + id))
	return "rn" + hex.EncodeToString(s[:5])
}

// AddLease creates the lease's TUN interface and admits its credential,
// its deadline (spec.Deadline) in place before a HELLO can find it.
// Adding a lease that exists with the same spec is not an error: its
// deadline becomes spec.Deadline.
func (l *Lender) AddLease(ctx context.Context, spec LeaseSpec) error {
	if spec.ID == "" || spec.Credential == "" || len(spec.Credential) > MaxCredential {
		return fmt.Errorf("nic: a lease needs an ID and a credential of 1..%d bytes", MaxCredential)
	}
	if spec.Addr.IsValid() && !l.cfg.Pool.Contains(spec.Addr) {
		return fmt.Errorf("%w: %v is outside the pool %v", ErrAddr, spec.Addr, l.cfg.Pool)
	}
	r := spec.Rate
	if l.cfg.Rate > 0 && (r == 0 || r > l.cfg.Rate) {
		r = l.cfg.Rate
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	// The lease's deadline is ls.deadline; its spec keeps none, and
	// specs are compared without.
	dl := spec.Deadline
	spec.Deadline = nil
	if old, ok := l.leases[spec.ID]; ok {
		if old.spec == spec {
			old.deadline.Store(dl)
			return nil
		}
		return fmt.Errorf("nic: lease %s exists with another spec", spec.ID)
	}
	if _, ok := l.byCred[LeaseID(spec.Credential)]; ok {
		return fmt.Errorf("nic: credential of lease %s already in use", spec.ID)
	}
	addr := spec.Addr
	if addr.IsValid() {
		if l.addrInUse(addr) {
			return fmt.Errorf("%w: %v is another lease's", ErrAddr, addr)
		}
	} else {
		var err error
		if addr, err = l.freeAddr(spec.ID); err != nil {
			return err
		}
	}
	ls := &lease{l: l, spec: spec, fixed: spec.Addr.IsValid(), addr: addr, tunName: tunName(l.cfg.Iface, spec.ID), rate: r}
	ls.deadline.Store(dl)
	if r > 0 {
		bps := float64(r) / 8
		burst := max(int(bps*0.005), 128<<10)
		ls.up, ls.down = rate.NewLimiter(rate.Limit(bps), burst), rate.NewLimiter(rate.Limit(bps), burst)
	}
	tun, err := openTUN(ls.tunName)
	if err != nil {
		return err
	}
	ls.tun = tun
	if _, err := linkUp(ls.tunName, l.mtu, 256); err != nil {
		_ = closeTUN(tun, ls.tunName)
		return err
	}
	if err := l.host.syncRoutes(); err != nil {
		_ = closeTUN(tun, ls.tunName)
		return err
	}
	if err := l.host.addTUN(ctx, ls.tunName, addr); err != nil {
		_ = closeTUN(tun, ls.tunName)
		return err
	}
	ls.done = make(chan struct{})
	l.leases[spec.ID] = ls
	l.byCred[LeaseID(spec.Credential)] = ls
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		ls.downLoop()
	}()
	l.log.Info("nic: lease added", "lease", spec.ID, "tun", ls.tunName, "addr", addr, "rate_bps", r)
	return nil
}

func (l *Lender) addrInUse(a netip.Addr) bool {
	for _, o := range l.leases {
		if o.addr == a {
			return true
		}
	}
	return false
}

// freeAddr picks an unused address of the pool (not its first or last,
// nor one ending in .0 or .255): first the lease's own (LeaseAddr), so
// that every lender of a bond gives it the same address without asking
// one another, else a random one (the borrower's first session may then
// ask for the bond's, see join).
func (l *Lender) freeAddr(id string) (netip.Addr, error) {
	if a := LeaseAddr(l.cfg.Pool, id); a.Is4() && !a.IsUnspecified() && !l.addrInUse(a) {
		return a, nil
	}
	size := uint32(1) << (32 - l.cfg.Pool.Bits())
	for range 1000 {
		var b [4]byte
		_, _ = rand.Read(b[:])
		if addr, ok := poolAddr(l.cfg.Pool, binary.BigEndian.Uint32(b[:])%size); ok && !l.addrInUse(addr) {
			return addr, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%w: no free address in %v", ErrAddr, l.cfg.Pool)
}

// poolAddr is the address at offset off of the IPv4 pool, and whether a
// borrower may have it: not the pool's first or last, nor one ending in .0
// or .255.
func poolAddr(pool netip.Prefix, off uint32) (netip.Addr, bool) {
	size := uint32(1) << (32 - pool.Bits())
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], binary.BigEndian.Uint32(pool.Addr().AsSlice())+off)
	return netip.AddrFrom4(a), off != 0 && off != size-1 && a[3] != 0 && a[3] != 255
}

// LeaseAddr is the address in pool that lease id's borrower gets when it
// is free: derived from the lease ID, the same at every lender, and one a
// borrower may have (the first such of a sequence derived from the ID;
// 0.0.0.0 for a pool that is not IPv4 or has none). Before, an ID whose
// address ended in .255 or .0 got a random one at each lender.
func LeaseAddr(pool netip.Prefix, id string) netip.Addr {
	if !pool.Addr().Is4() {
		return netip.IPv4Unspecified()
	}
	size := uint32(1) << (32 - pool.Bits())
	for k := range 64 {
		key := id
		if k > 0 {
			key = fmt.Sprintf("%s\x00%d", id, k)
		}
		if a, ok := poolAddr(pool, leaseOffset(key, size)); ok {
			return a
		}
	}
	return netip.IPv4Unspecified()
}

// leaseOffset is lease id's address offset in a pool of size addresses.
func leaseOffset(id string, size uint32) uint32 {
	h := sha256.Sum256([]byte("rialto-nic-addr\x00" + id))
	return uint32(binary.BigEndian.Uint64(h[:8]) % uint64(size))
}

// RemoveLease ends the lease's session and deletes its TUN interface.
// Removing an unknown lease is not an error.
func (l *Lender) RemoveLease(ctx context.Context, id string) error {
	l.mu.Lock()
	ls, ok := l.leases[id]
	if ok {
		delete(l.leases, id)
		delete(l.byCred, LeaseID(ls.spec.Credential))
		// Under l.mu, as join checks it: a HELLO that found the lease
		// before it was removed either started its session before this
		// (end closes it) or sees the lease ended.
		close(ls.done)
	}
	l.mu.Unlock()
	if !ok {
		return nil
	}
	l.at("remove.unlocked")
	ls.end(ctx)
	l.log.Info("nic: lease removed", "lease", id)
	return nil
}

// at calls the test hook.
func (l *Lender) at(point string) {
	if l.hook != nil {
		l.hook(point)
	}
}

// end closes the session and the TUN interface of a lease whose done
// channel its caller closed under l.mu.
func (ls *lease) end(ctx context.Context) {
	ls.mu.Lock()
	s := ls.sess
	ls.sess = nil
	ls.mu.Unlock()
	ls.l.at("end.taken")
	if s != nil {
		s.close(fmt.Errorf("%w: lease %s ended", ErrGone, ls.spec.ID))
	}
	ls.l.host.removeTUN(ctx, ls.tunName)
	_ = closeTUN(ls.tun, ls.tunName) // deletes the interface and its routes
}

// SetLeaseDeadline makes dl the deadline of lease id (nil: none), as
// LeaseSpec.Deadline does from the lease's start (which leaves no moment
// when the lease takes a HELLO without it): a
// packet of the lease forwarded once dl has passed, either way (from the
// borrower into the lender's kernel, or from the kernel to the borrower),
// is dropped (Stats.ExpiredDrops) and ends the lease's session, its
// borrower told why (an ERROR frame of StatusGone on each connection);
// a HELLO is refused likewise (a WELCOME of StatusGone). This holds from
// dl on, though the lease's removal (RemoveLease: the agent's stop at the
// expiry, which can come late) has not come yet. Moving dl
// (clock.Deadline.Set: a renewal) serves the lease again: the borrower's
// next session is welcome.
func (l *Lender) SetLeaseDeadline(id string, dl *clock.Deadline) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls, ok := l.leases[id]
	if !ok {
		return fmt.Errorf("%w: no lease %s", ErrGone, id)
	}
	ls.deadline.Store(dl)
	return nil
}

// Lease returns a lease's state.
func (l *Lender) Lease(id string) (LeaseInfo, bool) {
	l.mu.Lock()
	ls, ok := l.leases[id]
	var info LeaseInfo
	if ok {
		info = LeaseInfo{ID: id, Iface: ls.tunName, Addr: ls.addr, Rate: ls.rate, Stats: ls.ctr.snapshot()}
	}
	l.mu.Unlock()
	if ok {
		ls.mu.Lock()
		info.Active = ls.sess != nil
		ls.mu.Unlock()
	}
	return info, ok
}

// Close ends every lease and undoes the kernel configuration. Serve
// returns once its listener is closed by its caller or its ctx ends.
func (l *Lender) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	leases := l.leases
	l.leases, l.byCred = map[string]*lease{}, map[[LeaseIDSize]byte]*lease{}
	for _, ls := range leases {
		close(ls.done)
	}
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, ls := range leases {
		ls.end(ctx)
	}
	l.wg.Wait()
	l.host.close(ctx)
	return nil
}

// Serve accepts borrower connections on ln until ctx ends (then it closes
// ln) or ln fails, and waits for the connections it served.
func (l *Lender) Serve(ctx context.Context, ln net.Listener) error {
	return serve(ctx, ln, l.cfg.TLS, func(id [LeaseIDSize]byte) *lease {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.byCred[id]
	})
}

// Mux serves the leases of several Lenders (one per lent interface) on one
// listener: a connection goes to the lender holding the lease it names. The
// zero Mux is ready to use; its methods are safe for concurrent use. The
// lenders' own LenderConfig.TLS is not used: the Mux's is.
type Mux struct {
	mu      sync.Mutex
	lenders []*Lender
	tls     *tls.Config
}

// UseTLS runs the tunnels Serve accepts under TLS with cfg (the node
// certificate), as LenderConfig.TLS does; call it before Serve.
func (m *Mux) UseTLS(cfg *tls.Config) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tls = cfg
}

// Add serves l's leases too.
func (m *Mux) Add(l *Lender) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lenders = append(m.lenders, l)
}

// Serve is Lender.Serve over every added lender.
func (m *Mux) Serve(ctx context.Context, ln net.Listener) error {
	m.mu.Lock()
	cfg := m.tls
	m.mu.Unlock()
	return serve(ctx, ln, cfg, func(k [LeaseIDSize]byte) *lease {
		m.mu.Lock()
		ls := slices.Clone(m.lenders)
		m.mu.Unlock()
		for _, l := range ls {
			l.mu.Lock()
			x := l.byCred[k]
			l.mu.Unlock()
			if x != nil {
				return x
			}
		}
		return nil
	})
}

// serve accepts connections on ln, under TLS with cfg if set, and serves
// them (serveConn).
func serve(ctx context.Context, ln net.Listener, cfg *tls.Config, lookup func(id [LeaseIDSize]byte) *lease) error {
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS13)
	}
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	conns := map[net.Conn]struct{}{}
	var cmu sync.Mutex
	defer func() {
		cmu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		cmu.Unlock()
	}()
	var retry accept.Backoff
	for {
		c, err := ln.Accept()
		if err != nil {
			// A timeout, or out of descriptors or memory for now: the
			// connection waits in the backlog; the tunnels go on.
			if retry.Retry(ctx, err, nil) {
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("nic: accept: %w", err)
		}
		retry.Reset()
		cmu.Lock()
		conns[c] = struct{}{}
		cmu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if cfg != nil {
				if pc, ok := plaintextHello(c); ok {
					// The handshake runs in serveConn's first read,
					// under its HELLO deadline.
					serveConn(tls.Server(pc, cfg), lookup)
				}
			} else {
				serveConn(c, lookup)
			}
			cmu.Lock()
			delete(conns, c)
			cmu.Unlock()
			_ = c.Close()
		}()
	}
}

// peekedConn is a connection whose first bytes were peeked at.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (p *peekedConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// plaintextHello peeks at what a borrower sends first on a connection to a
// lender that requires TLS: a plaintext HELLO (its magic) is answered with
// a plaintext WELCOME of StatusTLS, and ok is false; else the connection
// to run TLS on is returned.
func plaintextHello(c net.Conn) (net.Conn, bool) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	_ = c.SetDeadline(time.Now().Add(helloTimeout))
	// Reads larger than the buffer, as the TLS records' are once the
	// peeked bytes are consumed, bypass it.
	br := bufio.NewReaderSize(c, 16)
	head, err := br.Peek(4)
	if err != nil {
		return nil, false
	}
	if binary.BigEndian.Uint32(head) == Magic {
		refuse(c, ErrTLSRequired)
		return nil, false
	}
	return &peekedConn{Conn: c, r: br}, true
}

func refuse(c net.Conn, err error) {
	w := Welcome{Status: statusOf(err), Message: err.Error()}
	_, _ = c.Write(w.Encode(nil))
}

// errProof is the one answer to a HELLO naming an unknown lease and to a
// wrong proof, so that the answer does not tell which lease ids exist.
var errProof = fmt.Errorf("%w: no NIC lease has this credential", ErrAuth)

// serveConn authenticates one connection (HELLO, CHALLENGE, PROOF) and
// joins it to its lease's session; it returns when the connection ends.
func serveConn(c net.Conn, lookup func(id [LeaseIDSize]byte) *lease) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	_ = c.SetDeadline(time.Now().Add(helloTimeout))
	h, err := ReadHello(c)
	if err != nil {
		if errors.Is(err, ErrBadFrame) || errors.Is(err, ErrVersion) {
			refuse(c, err)
		}
		return
	}
	var challenge [ChallengeSize]byte
	if _, err := rand.Read(challenge[:]); err != nil {
		refuse(c, fmt.Errorf("nic: challenge: %w", err))
		return
	}
	if _, err := c.Write(EncodeChallenge(nil, challenge)); err != nil {
		return
	}
	var proof [ProofSize]byte
	if _, err := io.ReadFull(c, proof[:]); err != nil {
		return
	}
	ls := lookup(h.Lease)
	if ls == nil {
		refuse(c, errProof)
		return
	}
	if want := Proof(ls.spec.Credential, challenge, h.Encode(nil)); !hmac.Equal(proof[:], want[:]) {
		refuse(c, errProof)
		return
	}
	l := ls.l
	l.at("hello.found")
	s, addr, err := ls.join(h)
	l.at("hello.joined")
	if err != nil {
		refuse(c, err)
		return
	}
	mtu := min(int(h.MTU), l.mtu)
	w := Welcome{Status: StatusOK, MTU: uint16(mtu), Window: l.cfg.Window, Addr: addr, Rate: ls.rate, Routes: l.host.routes}
	q := newQP(c, h.Window, l.cfg.Window, l.cfg.Keepalive)
	if !s.join(int(h.Index), q) {
		refuse(c, fmt.Errorf("%w: connection %d of session joined twice", ErrBusy, h.Index))
		return
	}
	if _, err := c.Write(w.Encode(nil)); err != nil {
		s.close(ErrLost)
		return
	}
	_ = c.SetDeadline(time.Time{})
	err = q.run(func(seq uint32, pkt []byte) error { return s.recv(q, seq, pkt) })
	l.log.Debug("nic: connection ended", "lease", ls.spec.ID, "err", err)
	// The session's packets are numbered across its connections: without
	// this one it cannot go on. The borrower opens a new one.
	if isExpired(err) {
		ls.endExpired(s, err)
	} else {
		s.close(err)
	}
	ls.mu.Lock()
	if ls.sess == s {
		ls.sess = nil
	}
	ls.mu.Unlock()
}

// join returns the lease's session h belongs to, starting it (and ending
// the previous one) if h names a new one.
func (ls *lease) join(h Hello) (*session, netip.Addr, error) {
	l := ls.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if ls.ended() {
		return nil, netip.Addr{}, fmt.Errorf("%w: lease %s ended", ErrGone, ls.spec.ID)
	}
	if ls.expired() {
		return nil, netip.Addr{}, ls.expiredErr()
	}
	l.at("join.checked")
	if h.Addr.IsValid() && h.Addr != ls.addr {
		if ls.fixed || ls.used || !l.cfg.Pool.Contains(h.Addr) || l.addrInUse(h.Addr) {
			return nil, netip.Addr{}, fmt.Errorf("%w: %v (this lease's borrower is %v)", ErrAddr, h.Addr, ls.addr)
		}
		if err := ls.readdress(h.Addr); err != nil {
			return nil, netip.Addr{}, err
		}
	}
	ls.used = true
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.sess != nil && ls.sess.id == h.Session {
		if len(ls.sess.qps) != int(h.Conns) {
			return nil, netip.Addr{}, fmt.Errorf("%w: session has %d connections, not %d", ErrBadFrame, len(ls.sess.qps), h.Conns)
		}
		return ls.sess, ls.addr, nil
	}
	if old := ls.sess; old != nil {
		old.close(fmt.Errorf("%w: replaced by a new session", ErrBusy))
	}
	ls.sess = newSession(h.Session, int(h.Conns), h.Conns > 1, &ls.ctr, ls.deliverUp)
	return ls.sess, ls.addr, nil
}

// readdress moves the lease to borrower address a (before its first session).
func (ls *lease) readdress(a netip.Addr) error {
	link, err := netlinkByName(ls.tunName)
	if err != nil {
		return err
	}
	_ = ls.l.host.route(link, ls.addr, false)
	if err := ls.l.host.route(link, a, true); err != nil {
		return err
	}
	ls.addr = a
	return nil
}

// ended reports whether the lease has ended.
func (ls *lease) ended() bool {
	select {
	case <-ls.done:
		return true
	default:
		return false
	}
}

// wait waits until lim (nil: no limit) lets n bytes through, as
// rate.Limiter.WaitN does; it reports false if the lease ends first or n
// exceeds the limiter's burst.
func (ls *lease) wait(lim *rate.Limiter, n int) bool {
	if lim == nil {
		return true
	}
	if ls.ended() {
		return false
	}
	r := lim.ReserveN(time.Now(), n)
	if !r.OK() {
		return false
	}
	d := r.Delay()
	if d == 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ls.done:
		r.Cancel()
		return false
	}
}

// deliverUp writes a packet from the borrower into the lender's kernel: it
// must be IPv4 from the lease's address, and waits for the lease's rate.
// Once the lease's deadline has passed (checked after that wait, so that
// it does not carry a packet past it) the packet is dropped and the
// error (expiredError) ends the session.
func (ls *lease) deliverUp(pkt []byte) error {
	src, _, ok := ipv4(pkt)
	if !ok || src != ls.addr {
		ls.ctr.filter.Add(1)
		return nil
	}
	if !ls.wait(ls.up, len(pkt)) {
		return nil
	}
	if ls.expired() {
		ls.ctr.expired.Add(1)
		return ls.expiredErr()
	}
	if _, err := ls.tun.Write(pkt); err != nil {
		ls.ctr.filter.Add(1)
		return nil
	}
	ls.ctr.rxP.Add(1)
	ls.ctr.rxB.Add(uint64(len(pkt)))
	return nil
}

// downLoop carries what the kernel routes into the lease's TUN interface
// (replies to the borrower) to the borrower, at the lease's rate. Once the
// lease's deadline has passed (checked after the rate's wait) a packet is
// dropped and ends the session (expire).
func (ls *lease) downLoop() {
	buf := make([]byte, MaxPacket)
	for {
		n, err := ls.tun.Read(buf)
		if err != nil {
			return
		}
		pkt := buf[:n]
		if !ls.wait(ls.down, n) {
			return
		}
		if ls.expired() {
			ls.expire()
			continue
		}
		ls.mu.Lock()
		s := ls.sess
		ls.mu.Unlock()
		if s == nil {
			ls.ctr.nopath.Add(1)
			continue
		}
		if s.send(pkt, flowHash(pkt)) {
			ls.ctr.txP.Add(1)
			ls.ctr.txB.Add(uint64(n))
		}
	}
}
