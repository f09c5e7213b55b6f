package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/internal/filelock"
)

// Sentinel errors.
var (
	// ErrUnavailable means the machine cannot build a lab (not root, or ip/tc missing).
	ErrUnavailable = errors.New("netns: network namespaces unavailable")
	// ErrNoSubnet means every 10.213.x.0/24 is already in use in the root namespace.
	ErrNoSubnet = errors.New("netns: no free 10.213.x.0/24 subnet")
	// ErrBadConfig reports an invalid Config.
	ErrBadConfig = errors.New("netns: bad config")
)

// MaxHosts is the largest number of hosts in one lab.
const MaxHosts = 250

// Config describes a lab.
type Config struct {
	// Hosts is the number of namespaces to create (1..MaxHosts).
	Hosts int
	// Rate shapes every link, in both directions, with tc tbf, in tc's
	// syntax ("400mbit", "1gbit", "50mbps" = 50 megabytes/s). Empty means
	// unshaped.
	Rate string
	// Burst is the tbf bucket size in tc syntax ("128kb"). Empty chooses
	// max(32 KiB, 2 ms at Rate).
	Burst string
	// Latency is the tbf queue limit expressed as time. Empty means 25ms.
	Latency string
	// HostRates, when set, overrides Rate for host i (empty entries keep Rate).
	HostRates []string
	// CongestionControl, when set, is the TCP congestion control ("reno",
	// "cubic", "bbr") of connections between the root namespace and the
	// hosts and between hosts: it is set per route (ip route congctl), so
	// the lab's flows do not depend on the machine-wide sysctl and nothing
	// outside the lab changes. Empty keeps the system default.
	CongestionControl string
	// Prefix starts every namespace name; empty means "rialto-lab".
	Prefix string
	// ID, when set, is the lab's identifier (NewID's form: 6 lowercase hex
	// digits) instead of a random one. A caller that must be able to
	// remove the lab after a crash (Purge) records the ID before New
	// creates anything.
	ID string
	// Subnet, when set, is the 10.213.x.0/24 the lab would like (for
	// example the one a previous run used, so addresses stay the same);
	// if it is in use another is chosen.
	Subnet netip.Prefix
	// Logger receives the commands the lab runs at debug level; nil discards.
	Logger *slog.Logger
}

// Host is one namespace of a lab.
type Host struct {
	Index     int        // position in the lab, from 0
	Namespace string     // network namespace name (ip netns)
	Addr      netip.Addr // address inside the namespace, on Iface
	Iface     string     // interface name inside the namespace ("eth0")
	RootIface string     // root-namespace end of the veth pair
	Rate      string     // tbf rate of the link, or "" if unshaped
}

// Lab is a set of hosts joined to the root namespace by a bridge.
type Lab struct {
	id      string
	bridge  string
	gateway netip.Addr
	prefix  netip.Prefix
	hosts   []Host
	log     *slog.Logger
	prefix0 string   // Config.Prefix
	outside *Outside // AddOutside's, or nil
}

// Available returns nil if New can work on this machine, or an error wrapping
// ErrUnavailable that says why not.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not root", ErrUnavailable)
	}
	for _, t := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%w: %s not found", ErrUnavailable, t)
		}
	}
	return nil
}

// New creates a lab. On error everything created so far is removed.
func New(ctx context.Context, cfg Config) (_ *Lab, err error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if cfg.Hosts < 1 || cfg.Hosts > MaxHosts {
		return nil, fmt.Errorf("%w: Hosts must be 1..%d, got %d", ErrBadConfig, MaxHosts, cfg.Hosts)
	}
	if len(cfg.HostRates) > cfg.Hosts {
		return nil, fmt.Errorf("%w: %d HostRates for %d hosts", ErrBadConfig, len(cfg.HostRates), cfg.Hosts)
	}
	for _, r := range append([]string{cfg.Rate}, cfg.HostRates...) {
		if r == "" {
			continue
		}
		if _, err := ParseRate(r); err != nil {
			return nil, err
		}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "rialto-lab"
	}
	if cfg.Latency == "" {
		cfg.Latency = "25ms"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	id := cfg.ID
	if id == "" {
		if id, err = NewID(); err != nil {
			return nil, err
		}
	} else if !validID(id) {
		return nil, fmt.Errorf("%w: ID %q is not 6 lowercase hex digits", ErrBadConfig, id)
	}
	if cfg.Subnet.IsValid() && !subnetOK(cfg.Subnet) {
		return nil, fmt.Errorf("%w: Subnet %v is not a 10.213.x.0/24", ErrBadConfig, cfg.Subnet)
	}
	l := &Lab{id: id, log: log, prefix0: cfg.Prefix}
	l.bridge = "rl" + l.id + "b"

	// Subnet choice and bridge creation are serialised across processes so
	// that two labs never pick the same /24.
	unlock, err := lockFile(ctx, filepath.Join(os.TempDir(), "rialto-netns.lock"))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = l.Close()
		}
	}()
	err = l.createBridge(ctx, cfg.Subnet, cfg.CongestionControl)
	unlock()
	if err != nil {
		return nil, err
	}
	for i := 0; i < cfg.Hosts; i++ {
		rate := cfg.Rate
		if i < len(cfg.HostRates) && cfg.HostRates[i] != "" {
			rate = cfg.HostRates[i]
		}
		if err := l.addHost(ctx, i, rate, cfg); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// NewID returns a random lab ID.
func NewID() (string, error) {
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", fmt.Errorf("netns: lab id: %w", err)
	}
	return hex.EncodeToString(rnd[:]), nil
}

func validID(id string) bool {
	if len(id) != 6 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func subnetOK(p netip.Prefix) bool {
	a := p.Addr().As4()
	return p.Addr().Is4() && p.Bits() == 24 && a[0] == 10 && a[1] == 213 && a[2] >= 1 && a[2] <= 254 && a[3] == 0
}

func (l *Lab) createBridge(ctx context.Context, want netip.Prefix, cc string) error {
	out, err := l.run(ctx, "ip", "-o", "-4", "addr", "show")
	if err != nil {
		return err
	}
	used := map[int]bool{}
	for _, f := range strings.Fields(string(out)) {
		if !strings.HasPrefix(f, "10.213.") {
			continue
		}
		parts := strings.Split(f, ".")
		if n, err := strconv.Atoi(parts[2]); err == nil {
			used[n] = true
		}
	}
	third := -1
	if want.IsValid() && !used[int(want.Addr().As4()[2])] {
		third = int(want.Addr().As4()[2])
	}
	// Start at a random place so that concurrent labs rarely even contend.
	var b [1]byte
	_, _ = rand.Read(b[:])
	for k := 0; third < 0 && k < 254; k++ {
		c := 1 + (int(b[0])+k)%254
		if !used[c] {
			third = c
			break
		}
	}
	if third < 0 {
		return ErrNoSubnet
	}
	l.prefix = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, byte(third), 0}), 24)
	l.gateway = netip.AddrFrom4([4]byte{10, 213, byte(third), 1})
	steps := [][]string{
		{"ip", "link", "add", l.bridge, "type", "bridge"},
		{"ip", "addr", "add", l.gateway.String() + "/24", "dev", l.bridge},
		{"ip", "link", "set", l.bridge, "up"},
	}
	if cc != "" {
		steps = append(steps, []string{"ip", "route", "change", l.prefix.String(), "dev", l.bridge, "proto", "kernel", "scope", "link", "src", l.gateway.String(), "congctl", cc})
	}
	for _, s := range steps {
		if _, err := l.run(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

func (l *Lab) addHost(ctx context.Context, i int, rate string, cfg Config) error {
	a := l.prefix.Addr().As4()
	a[3] = byte(i + 2)
	h := Host{
		Index:     i,
		Namespace: fmt.Sprintf("%s-%s-h%d", cfg.Prefix, l.id, i),
		Addr:      netip.AddrFrom4(a),
		Iface:     "eth0",
		RootIface: fmt.Sprintf("rl%sv%d", l.id, i),
		Rate:      rate,
	}
	// Record the host first so that Close removes whatever was created.
	l.hosts = append(l.hosts, h)
	steps := [][]string{
		{"ip", "netns", "add", h.Namespace},
		{"ip", "link", "add", h.RootIface, "type", "veth", "peer", "name", h.Iface, "netns", h.Namespace},
		{"ip", "link", "set", h.RootIface, "master", l.bridge},
		{"ip", "link", "set", h.RootIface, "up"},
		{"ip", "-n", h.Namespace, "link", "set", "lo", "up"},
		{"ip", "-n", h.Namespace, "addr", "add", h.Addr.String() + "/24", "dev", h.Iface},
		{"ip", "-n", h.Namespace, "link", "set", h.Iface, "up"},
		{"ip", "-n", h.Namespace, "route", "add", "default", "via", l.gateway.String()},
	}
	if cc := cfg.CongestionControl; cc != "" {
		steps = append(steps,
			[]string{"ip", "-n", h.Namespace, "route", "change", l.prefix.String(), "dev", h.Iface, "proto", "kernel", "scope", "link", "src", h.Addr.String(), "congctl", cc},
			[]string{"ip", "-n", h.Namespace, "route", "change", "default", "via", l.gateway.String(), "congctl", cc})
	}
	if rate != "" {
		burst := cfg.Burst
		if burst == "" {
			bps, _ := ParseRate(rate) // validated in New
			burst = strconv.FormatInt(max(32<<10, bps/8*2/1000), 10) + "b"
		}
		tbf := []string{"qdisc", "add", "dev", "", "root", "tbf", "rate", rate, "burst", burst, "latency", cfg.Latency}
		root := append([]string{"tc"}, tbf...)
		root[4] = h.RootIface
		inside := append([]string{"tc", "-n", h.Namespace}, tbf...)
		inside[6] = h.Iface
		steps = append(steps, root, inside)
	}
	for _, s := range steps {
		if _, err := l.run(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

func (l *Lab) prefixName() string { return l.prefix0 }

// ID is the lab's random identifier, part of every name it creates.
func (l *Lab) ID() string { return l.id }

// Len is the number of hosts.
func (l *Lab) Len() int { return len(l.hosts) }

// Host returns host i. It panics if i is out of range.
func (l *Lab) Host(i int) Host { return l.hosts[i] }

// Gateway is the root namespace's address on the lab bridge; hosts reach the
// root namespace (for example a borrower running there) at this address.
func (l *Lab) Gateway() netip.Addr { return l.gateway }

// Prefix is the lab's subnet.
func (l *Lab) Prefix() netip.Prefix { return l.prefix }

// Command returns a command that runs name with args inside host i's
// namespace (through "ip netns exec"). The caller starts and waits for it.
func (l *Lab) Command(ctx context.Context, i int, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", l.hosts[i].Namespace, name}, args...)...)
}

// Do runs f on an OS thread that has entered host i's network namespace.
// Sockets f creates stay in that namespace after Do returns. Goroutines that
// f starts do not run in the namespace.
func (l *Lab) Do(i int, f func() error) error {
	return doIn(l.hosts[i].Namespace, f)
}

// doIn runs f on an OS thread that has entered network namespace ns.
func doIn(ns string, f func() error) error {
	target, err := unix.Open(filepath.Join("/run/netns", ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("netns: open namespace: %w", err)
	}
	defer unix.Close(target)
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: open own namespace: %w", err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: enter %s: %w", ns, err)
	}
	ferr := f()
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: the runtime discards it when this
		// goroutine exits, so no other goroutine runs in the wrong namespace.
		return fmt.Errorf("netns: leave %s: %w", ns, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Listen opens a listener inside host i's namespace; address is as for
// net.Listen (":0" listens on every address of the host).
func (l *Lab) Listen(ctx context.Context, i int, network, address string) (net.Listener, error) {
	var ln net.Listener
	err := l.Do(i, func() error {
		var err error
		ln, err = (&net.ListenConfig{}).Listen(ctx, network, address)
		return err
	})
	return ln, err
}

// Dial connects from inside host i's namespace.
func (l *Lab) Dial(ctx context.Context, i int, network, address string) (net.Conn, error) {
	var c net.Conn
	err := l.Do(i, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Close kills processes left inside the lab's namespaces, then deletes the
// namespaces, veth pairs and bridge. It returns the first error but always
// attempts every step.
func (l *Lab) Close() error {
	// Teardown must run even if the caller's context is done.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	if l.outside != nil {
		if err := deleteNamespace(ctx, l.log, l.outside.Namespace); err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range l.hosts {
		if err := deleteNamespace(ctx, l.log, h.Namespace); err != nil {
			errs = append(errs, err)
		}
		// Deleting the namespace destroys the pair; this is for the case
		// where the namespace was never created.
		_, _ = run(ctx, l.log, "ip", "link", "del", h.RootIface)
	}
	if l.bridge != "" {
		if _, err := run(ctx, l.log, "ip", "link", "del", l.bridge); err != nil && !linkGone(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteNamespace kills the processes inside namespace ns and deletes it.
func deleteNamespace(ctx context.Context, log *slog.Logger, ns string) error {
	if out, err := run(ctx, log, "ip", "netns", "pids", ns); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	_, err := run(ctx, log, "ip", "netns", "del", ns)
	return err
}

// Purge removes whatever the lab with the given ID left behind, for
// example when the process that built it was killed before it could call
// Close: it kills the processes inside the lab's namespaces, deletes the
// namespaces, and deletes the lab's links (veth pairs and bridge), finding
// them by name. A lab of which nothing is left is not an error. It needs
// what New needs (Available).
func Purge(ctx context.Context, id string, log *slog.Logger) error {
	if !validID(id) {
		return fmt.Errorf("%w: ID %q is not 6 lowercase hex digits", ErrBadConfig, id)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	nss, links, err := Leftovers(ctx, id)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range nss {
		if err := deleteNamespace(ctx, log, ns); err != nil {
			errs = append(errs, err)
		}
	}
	// Veth ends first (the root end of a pair whose namespace is gone has
	// gone with it), then the bridge.
	slices.SortFunc(links, func(a, b string) int { return strings.Compare(b, a) })
	for _, ln := range links {
		if _, err := run(ctx, log, "ip", "link", "del", ln); err != nil && !linkGone(err) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// A step may fail on what went meanwhile (a namespace or link
		// another process removed, a link gone with its namespace): what
		// counts is whether anything of the lab is left.
		if nss, links, err := Leftovers(ctx, id); err == nil && len(nss) == 0 && len(links) == 0 {
			log.Warn("purge: steps failed but nothing of the lab is left", "lab", id, "err", errors.Join(errs...))
			return nil
		}
	}
	return errors.Join(errs...)
}

// Leftovers lists the namespaces and root-namespace links that exist now
// and belong to the lab with the given ID.
func Leftovers(ctx context.Context, id string) (namespaces, links []string, err error) {
	if !validID(id) {
		return nil, nil, fmt.Errorf("%w: ID %q is not 6 lowercase hex digits", ErrBadConfig, id)
	}
	log := slog.New(slog.DiscardHandler)
	out, err := run(ctx, log, "ip", "netns", "list")
	if err != nil {
		return nil, nil, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		// Names are PREFIX-ID-hN, and PREFIX-ID-out (AddOutside).
		if strings.HasSuffix(f[0], "-"+id+"-out") {
			namespaces = append(namespaces, f[0])
		} else if i := strings.LastIndex(f[0], "-"+id+"-h"); i >= 0 && allDigits(f[0][i+len(id)+3:]) {
			namespaces = append(namespaces, f[0])
		}
	}
	out, err = run(ctx, log, "ip", "-o", "link", "show")
	if err != nil {
		return nil, nil, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if rest, ok := strings.CutPrefix(name, "rl"+id); ok && (rest == "b" || len(rest) > 1 && rest[0] == 'v' && allDigits(rest[1:])) {
			links = append(links, name)
		}
	}
	return namespaces, links, nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Counters are the bytes that crossed a host's link, counted by the kernel
// at the root-namespace end of its veth pair (every packet: the borrower's,
// other hosts', ARP).
type Counters struct {
	ToHost   int64 // bytes sent into the host's namespace
	FromHost int64 // bytes the host sent out
}

// Counters reads host i's link counters.
func (l *Lab) Counters(i int) (Counters, error) {
	dir := filepath.Join("/sys/class/net", l.hosts[i].RootIface, "statistics")
	var c Counters
	for _, f := range []struct {
		name string
		p    *int64
	}{{"tx_bytes", &c.ToHost}, {"rx_bytes", &c.FromHost}} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			return Counters{}, fmt.Errorf("netns: counters of %s: %w", l.hosts[i].RootIface, err)
		}
		if *f.p, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return Counters{}, fmt.Errorf("netns: counters of %s: %w", l.hosts[i].RootIface, err)
		}
	}
	return c, nil
}

func linkGone(err error) bool {
	return strings.Contains(err.Error(), "Cannot find device")
}

func (l *Lab) run(ctx context.Context, args ...string) ([]byte, error) {
	return run(ctx, l.log, args...)
}

func run(ctx context.Context, log *slog.Logger, args ...string) ([]byte, error) {
	log.Debug("netns", "cmd", strings.Join(args, " "))
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("netns: %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// lockFile takes an exclusive flock on path, polling until ctx is done.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := filelock.Wait(ctx, path, 10*time.Millisecond, func() bool { return true })
	if err != nil {
		return nil, fmt.Errorf("netns: lock: %w", err)
	}
	return func() { _ = filelock.Close(f) }, nil
}

// ParseRate converts a tc rate ("400mbit", "1gbit", "10mbps", "125000bps",
// "1000000") to bits per second. As in tc, "bps" means bytes per second and a
// bare number means bits per second. Rates below 8 bit/s are refused.
func ParseRate(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], t[i:]
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%w: rate %q", ErrBadConfig, s)
	}
	mult := map[string]float64{
		"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
		"bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
		"kibit": 1 << 10, "mibit": 1 << 20, "gibit": 1 << 30,
	}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("%w: rate %q: unknown unit %q", ErrBadConfig, s, unit)
	}
	if v*mult < 8 {
		// tc rounds the rate down to bytes per second: below one it
		// would refuse the qdisc.
		return 0, fmt.Errorf("%w: rate %q is below 8bit (one byte per second)", ErrBadConfig, s)
	}
	return int64(v * mult), nil
}
