package rack

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/filelock"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/pki"
	"github.com/rialto-project/rialto/internal/resource"
)

// Sentinel errors.
var (
	// ErrUnavailable means the machine cannot run a rack (not root, or
	// ip/tc missing); the error wrapping it says which.
	ErrUnavailable = errors.New("rack: network namespaces unavailable")
	// ErrBadConfig reports an invalid Config.
	ErrBadConfig = errors.New("rack: bad config")
	// ErrInUse means another rack, `rialto up` or a reaper holds the state dir.
	ErrInUse = errors.New("rack: state dir in use")
	// ErrRunning and ErrNotRunning refuse to start a running process or
	// to stop one that is not running.
	ErrRunning    = errors.New("rack: process already running")
	ErrNotRunning = errors.New("rack: process not running")
	// ErrClosed means Close has been called.
	ErrClosed = errors.New("rack: closed")
)

// ControlPlaneName is the control plane's node name.
const ControlPlaneName = "controlplane"

// DefaultAPIPort is the control plane's port when Config.APIPort is 0.
const DefaultAPIPort = 7070

// MaxAgents is the largest number of agents (one namespace each, plus the
// control plane's).
const MaxAgents = netns.MaxHosts - 1

// Config describes a rack. Zero fields take the defaults their comments
// give; zero counts lend nothing.
type Config struct {
	// Binary is the rialto binary the processes run (required).
	Binary string
	// StateDir holds the database, tokens, agent state, disk images, logs
	// and the lab record (required; created 0700 if missing).
	StateDir string
	// Agents is the number of agent nodes, 0..MaxAgents.
	Agents int
	// Disks is the number of block devices each agent lends, sparse files
	// disk0.img, disk1.img, … in its state dir, DiskSize bytes each
	// (0: 1 GiB).
	Disks    int
	DiskSize int64
	// Memory is the memory budget each agent lends in bytes (0: none).
	Memory int64
	// AccelSlots is the number of accelerator slots each agent lends (0: none).
	AccelSlots int
	// LinkRate shapes every link, both directions, with tc tbf ("1gbit",
	// "400mbit"; tc's syntax, see netns.ParseRate). Empty: unshaped.
	LinkRate string
	// AgentRates, when set, overrides LinkRate for agent i (empty entries
	// keep LinkRate).
	AgentRates []string
	// Uplinks gives every agent a second interface, wan0, to an outside
	// network (netns.AddOutside) whose Server address only the agents
	// reach, and has each agent lend it as NIC "wan" (--nic
	// wan=wan0[:NICRate]). UplinkRate shapes the uplinks with tc tbf
	// (empty: unshaped); NICRate is what each agent may lend (empty: the
	// interface's speed).
	Uplinks             bool
	UplinkRate, NICRate string
	// Queue is the links' tbf queue limit as time and CongestionControl
	// their TCP congestion control (netns.Config's Latency and
	// CongestionControl; empty: netns's defaults).
	Queue, CongestionControl string
	// Borrowers adds namespaces "borrower1", "borrower2", … on the
	// bridge (their links shaped as LinkRate) in which no process runs:
	// a borrower's own network namespace, for what must not run in the
	// root namespace (a nic lease's interface, docs/nic.md). Rack.Command
	// and Rack.Do run there.
	Borrowers int
	// The control plane's timings (rialto server's --heartbeat,
	// --suspect-after, --down-after, --prepare-timeout, --default-ttl);
	// zero keeps the server's defaults.
	Heartbeat, SuspectAfter, DownAfter, PrepareTimeout, DefaultTTL time.Duration
	// BootstrapToken and AdminToken are the cluster's secrets; empty ones
	// are generated (Rack.AdminToken, Rack.BootstrapToken tell them).
	BootstrapToken, AdminToken string
	// APIPort is the control plane's port on its address (0: DefaultAPIPort).
	APIPort int
	// ServerArgs and AgentArgs are appended to the processes' command
	// lines (for example "--quota", "leases=4"). Never put secrets there:
	// command lines are visible to every user of the machine.
	ServerArgs, AgentArgs []string
	// InsecureDataplane runs the agents with --insecure-dataplane: their
	// data planes serve plaintext (lease credentials still checked).
	InsecureDataplane bool
	// LogLevel is the processes' --log-level (empty: info).
	LogLevel string
	// ReadyTimeout bounds how long Start and StartAgent wait for the
	// processes to serve (0: 60 s).
	ReadyTimeout time.Duration
	// StopTimeout is how long Close and StopAgent wait after SIGTERM
	// before SIGKILL (0: 10 s).
	StopTimeout time.Duration
	// Logger receives the rack's own messages; nil discards them.
	Logger *slog.Logger
}

// Node is one namespace of the rack and the process that runs in it.
type Node struct {
	Name      string     // ControlPlaneName, or the agent's node name "node1", "node2", …
	Namespace string     // network namespace (ip netns)
	Addr      netip.Addr // its address; its process binds to it
	Iface     string     // interface inside the namespace
	RootIface string     // root-namespace end of its veth pair
	Rate      string     // tbf rate of its link, "" if unshaped
	StateDir  string     // the agent's state dir; the control plane's is Config.StateDir
	Log       string     // its process's stdout and stderr (appended)
	host      int
}

// Exit reports a process that ended without the Rack asking it to.
type Exit struct {
	Node string
	Err  error // from wait: nil for exit status 0
}

// Rack is a running emulated rack.
type Rack struct {
	cfg    Config
	log    *slog.Logger
	dir    string
	lab    *netns.Lab
	boot   string
	admin  string
	url    string
	caFile string // the cluster CA's certificate (StateDir/tls/ca-cert.pem)
	cp     Node
	agents []Node
	lock   *os.File
	reaper *reaper
	out    *netns.Outside

	borrowers []Node // Config.Borrowers' namespaces

	closeOnce sync.Once
	closeErr  error

	mu     sync.Mutex
	client *api.Client      // loadClient's
	procs  map[string]*proc // by node name; the latest process of each
	closed bool
	exits  chan Exit
	wg     sync.WaitGroup // process waiters
}

// proc is one child process.
type proc struct {
	name     string
	cmd      *exec.Cmd
	done     chan struct{} // closed after wait returns
	err      error         // wait's result, set before done closes
	expected bool          // the Rack ended it (guarded by Rack.mu)
}

// Available returns nil if Start can work on this machine, or an error
// wrapping ErrUnavailable that says why not in a way a user can act on.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root: it creates network namespaces, veth pairs and a bridge, and shapes links with tc", ErrUnavailable)
	}
	for _, t := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%w: needs %s(8), not found on PATH (install iproute2)", ErrUnavailable, t)
		}
	}
	return nil
}

func (c *Config) check() error {
	switch {
	case c.Binary == "":
		return fmt.Errorf("%w: Binary is required", ErrBadConfig)
	case c.StateDir == "":
		return fmt.Errorf("%w: StateDir is required", ErrBadConfig)
	case c.Agents < 0 || c.Agents > MaxAgents:
		return fmt.Errorf("%w: Agents must be 0..%d, got %d", ErrBadConfig, MaxAgents, c.Agents)
	case c.Borrowers < 0 || c.Agents+c.Borrowers > MaxAgents:
		return fmt.Errorf("%w: Borrowers must be 0..%d (with the agents), got %d", ErrBadConfig, MaxAgents-c.Agents, c.Borrowers)
	case c.Disks < 0 || c.DiskSize < 0 || c.Memory < 0 || c.AccelSlots < 0:
		return fmt.Errorf("%w: negative Disks, DiskSize, Memory or AccelSlots", ErrBadConfig)
	case len(c.AgentRates) > c.Agents:
		return fmt.Errorf("%w: %d AgentRates for %d agents", ErrBadConfig, len(c.AgentRates), c.Agents)
	case c.APIPort < 0 || c.APIPort > 65535:
		return fmt.Errorf("%w: APIPort %d", ErrBadConfig, c.APIPort)
	}
	for _, r := range append([]string{c.LinkRate, c.UplinkRate, c.NICRate}, c.AgentRates...) {
		if r == "" {
			continue
		}
		if _, err := netns.ParseRate(r); err != nil {
			return fmt.Errorf("%w: link rate %q (want tc's syntax, e.g. 1gbit, 400mbit)", ErrBadConfig, r)
		}
	}
	if c.DiskSize == 0 {
		c.DiskSize = 1 << 30
	}
	if c.APIPort == 0 {
		c.APIPort = DefaultAPIPort
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 60 * time.Second
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Start builds the lab, starts the control plane and the agents, and
// returns once every agent's node is ready. On error everything it created
// is removed again.
func Start(ctx context.Context, cfg Config) (_ *Rack, err error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if err := Available(); err != nil {
		return nil, err
	}
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("%w: Binary: %w", ErrBadConfig, err)
	}
	if cfg.Binary, err = filepath.Abs(bin); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o700); err != nil {
		return nil, fmt.Errorf("rack: state dir: %w", err)
	}
	r := &Rack{cfg: cfg, log: cfg.Logger, dir: dir, boot: cfg.BootstrapToken, admin: cfg.AdminToken,
		procs: map[string]*proc{}, exits: make(chan Exit, 64)}
	if r.boot == "" {
		r.boot = resource.NewSecret("rbt")
	}
	if r.admin == "" {
		r.admin = resource.NewSecret("rat")
	}
	if r.lock, err = lockStateDir(ctx, dir); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = r.Close()
		}
	}()

	// What a previous run left behind (its process and reaper both
	// killed) goes first.
	rec, err := readRecord(dir)
	if err != nil {
		return nil, err
	}
	if rec.Lab != "" {
		nss, links, _ := netns.Leftovers(ctx, rec.Lab)
		if err := netns.Purge(ctx, rec.Lab, r.log); err != nil {
			return nil, fmt.Errorf("rack: removing what a previous run left (lab %s): %w", rec.Lab, err)
		}
		if len(nss)+len(links) > 0 {
			r.log.Warn("removed what a previous run on this state dir left behind", "lab", rec.Lab, "namespaces", len(nss), "links", len(links))
		}
	}

	// The reaper and the record know the lab's ID before anything exists.
	id, err := netns.NewID()
	if err != nil {
		return nil, err
	}
	if r.reaper, err = startReaper(cfg.Binary, dir, r.lock, r.env(nil)); err != nil {
		return nil, err
	}
	if err := r.reaper.watch(id); err != nil {
		return nil, err
	}
	rec.Lab, rec.PID, rec.Reaper = id, os.Getpid(), r.reaper.cmd.Process.Pid
	if err := writeRecord(dir, rec); err != nil {
		return nil, err
	}
	var subnet netip.Prefix
	if rec.Subnet != "" {
		subnet, _ = netip.ParsePrefix(rec.Subnet) // only a wish; New checks it
	}
	hostRates := make([]string, cfg.Agents+1+cfg.Borrowers)
	copy(hostRates[1:], cfg.AgentRates)
	r.lab, err = netns.New(ctx, netns.Config{Hosts: cfg.Agents + 1 + cfg.Borrowers, Rate: cfg.LinkRate, HostRates: hostRates,
		Latency: cfg.Queue, CongestionControl: cfg.CongestionControl,
		ID: id, Subnet: subnet, Prefix: "rialto-rack", Logger: r.log})
	if err != nil {
		return nil, fmt.Errorf("rack: %w", err)
	}
	if cfg.Uplinks && cfg.Agents > 0 {
		hosts := make([]int, cfg.Agents)
		for i := range hosts {
			hosts[i] = i + 1
		}
		if r.out, err = r.lab.AddOutside(ctx, netns.OutsideConfig{Hosts: hosts, Rate: cfg.UplinkRate}); err != nil {
			return nil, fmt.Errorf("rack: %w", err)
		}
	}
	rec.Subnet = r.lab.Prefix().String()
	if err := writeRecord(dir, rec); err != nil {
		return nil, err
	}

	for i := range cfg.Agents + 1 {
		h := r.lab.Host(i)
		n := Node{Name: ControlPlaneName, Namespace: h.Namespace, Addr: h.Addr, Iface: h.Iface, RootIface: h.RootIface,
			Rate: h.Rate, StateDir: dir, Log: filepath.Join(dir, "logs", ControlPlaneName+".log"), host: i}
		if i == 0 {
			r.cp = n
			continue
		}
		n.Name = fmt.Sprintf("node%d", i)
		n.StateDir = filepath.Join(dir, n.Name)
		n.Log = filepath.Join(dir, "logs", n.Name+".log")
		r.agents = append(r.agents, n)
	}
	for i := range cfg.Borrowers {
		k := cfg.Agents + 1 + i
		h := r.lab.Host(k)
		r.borrowers = append(r.borrowers, Node{Name: fmt.Sprintf("borrower%d", i+1), Namespace: h.Namespace, Addr: h.Addr,
			Iface: h.Iface, RootIface: h.RootIface, Rate: h.Rate, host: k})
	}
	// The cluster CA, in the state dir's tls/ as for the in-process
	// `rialto up`: the control plane serves HTTPS with a certificate from
	// it, and the agents and the Rack's client verify against it.
	ca, err := pki.Open(filepath.Join(dir, "tls"), pki.Options{})
	if err != nil {
		return nil, fmt.Errorf("rack: %w", err)
	}
	r.caFile = ca.CertFile()
	r.url = "https://" + net.JoinHostPort(r.cp.Addr.String(), strconv.Itoa(cfg.APIPort))

	if err := r.StartControlPlane(ctx); err != nil {
		return nil, err
	}
	since := time.Now()
	for i := range r.agents {
		if err := r.startAgent(i); err != nil {
			return nil, err
		}
	}
	if err := r.waitAgents(ctx, since, r.agents...); err != nil {
		return nil, err
	}
	return r, nil
}

// URL is the control plane's API address ("https://10.213.x.2:7070").
func (r *Rack) URL() string { return r.url }

// CACert is the cluster CA's certificate file, which the API's certificate
// verifies against (RIALTO_CACERT).
func (r *Rack) CACert() string { return r.caFile }

// DataTLS is a borrower's TLS configuration for the agents' data planes
// (unless Config.InsecureDataplane): it trusts the cluster CA.
func (r *Rack) DataTLS() (*tls.Config, error) { return pki.LoadClientTLS(r.caFile) }

// LibnbdURI is an nbds:// lease URI as libnbd's tools (nbdinfo, nbdcopy)
// take it: with ?tls-certificates= the CA's directory. Other URIs are
// returned as they are.
func (r *Rack) LibnbdURI(uri string) string {
	if !strings.HasPrefix(uri, "nbds://") {
		return uri
	}
	return uri + "?tls-certificates=" + filepath.Dir(r.caFile)
}

// AdminToken is the API token of the admin tenant.
func (r *Rack) AdminToken() string { return r.admin }

// BootstrapToken is the token agents join with.
func (r *Rack) BootstrapToken() string { return r.boot }

// Client is an API client with the admin token.
func (r *Rack) Client() *api.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.client
}

// loadClient makes the Rack's API client anew with the CA certificates
// the state dir's ca-cert.pem holds now (at each StartControlPlane: after
// a `rialto ca rotate --tls-dir STATE/tls`, the restarted control plane's
// certificate comes from the new CA). Clients Client returned before keep
// the certificates of then.
func (r *Rack) loadClient() (*http.Client, error) {
	hc, err := api.HTTPClient(r.caFile, 30*time.Second)
	if err != nil {
		return nil, fmt.Errorf("rack: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.client = api.NewClient(r.url, r.admin, hc)
	return hc, nil
}

// Env is RIALTO_ADDR, RIALTO_CACERT and RIALTO_TOKEN (the admin token) for
// a CLI process: cmd.Env = append(os.Environ(), r.Env()...).
func (r *Rack) Env() []string {
	return []string{"RIALTO_ADDR=" + r.url, "RIALTO_CACERT=" + r.caFile, "RIALTO_TOKEN=" + r.admin}
}

// StateDir is the rack's state dir (absolute).
func (r *Rack) StateDir() string { return r.dir }

// ControlPlane is the control plane's node.
func (r *Rack) ControlPlane() Node { return r.cp }

// Agents are the agents' nodes, node1 first.
func (r *Rack) Agents() []Node { return append([]Node(nil), r.agents...) }

// Agent returns agent i (node i+1). It panics if i is out of range.
func (r *Rack) Agent(i int) Node { return r.agents[i] }

// Borrower is borrower namespace i (Config.Borrowers), from 0.
func (r *Rack) Borrower(i int) Node { return r.borrowers[i] }

// Do runs f on a goroutine locked into n's network namespace (for Go code
// that must create interfaces or sockets there) and returns its error.
func (r *Rack) Do(n Node, f func() error) error { return r.lab.Do(r.host(n), f) }

// Outside is the network beyond the agents' uplinks (Config.Uplinks), or
// nil: its Server address is reachable only through an agent's wan0.
func (r *Rack) Outside() *netns.Outside { return r.out }

// Gateway is the root namespace's address on the rack's bridge: what the
// nodes see a borrower in the root namespace as.
func (r *Rack) Gateway() netip.Addr { return r.lab.Gateway() }

// Prefix is the rack's subnet.
func (r *Rack) Prefix() netip.Prefix { return r.lab.Prefix() }

// Lab is the underlying lab, for what this package does not wrap (Listen
// and Dial inside a namespace, Do). Its host i is the node with index i:
// 0 the control plane, i the agent "nodei". Do not Close it.
func (r *Rack) Lab() *netns.Lab { return r.lab }

// Command returns a command that runs name inside n's namespace. The
// caller starts and waits for it; Close kills it if it still runs.
func (r *Rack) Command(ctx context.Context, n Node, name string, args ...string) *exec.Cmd {
	return r.lab.Command(ctx, r.host(n), name, args...)
}

// Counters reads the byte counters of n's link.
func (r *Rack) Counters(n Node) (netns.Counters, error) {
	return r.lab.Counters(r.host(n))
}

func (r *Rack) host(n Node) int {
	if n.Namespace == r.cp.Namespace {
		return 0
	}
	for _, a := range append(r.agents[:len(r.agents):len(r.agents)], r.borrowers...) {
		if a.Namespace == n.Namespace {
			return a.host
		}
	}
	panic("rack: node " + n.Name + " is not in this rack")
}

// Exits reports processes that ended without the Rack asking them to (a
// crash, a fatal error). Reports are dropped if nobody reads them.
func (r *Rack) Exits() <-chan Exit { return r.exits }

// env is the environment of a child: the caller's without RIALTO_
// variables, plus extra.
func (r *Rack) env(extra []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if len(kv) >= 7 && kv[:7] == "RIALTO_" {
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

func (r *Rack) serverArgs() []string {
	c := r.cfg
	args := []string{"server", "--listen", net.JoinHostPort(r.cp.Addr.String(), strconv.Itoa(c.APIPort)),
		"--db", filepath.Join(r.dir, "rialto.db"), "--tls-dir", filepath.Dir(r.caFile), "--log-level", c.LogLevel}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--heartbeat", c.Heartbeat}, {"--suspect-after", c.SuspectAfter}, {"--down-after", c.DownAfter},
		{"--prepare-timeout", c.PrepareTimeout}, {"--default-ttl", c.DefaultTTL}} {
		if d.v > 0 {
			args = append(args, d.flag, d.v.String())
		}
	}
	return append(args, c.ServerArgs...)
}

func (r *Rack) agentArgs(n Node) []string {
	c := r.cfg
	args := []string{"agent", "--addr", r.url, "--cacert", r.caFile, "--name", n.Name, "--state-dir", n.StateDir,
		"--listen", n.Addr.String(), "--label", "rack=emulated", "--log-level", c.LogLevel}
	for d := range c.Disks {
		args = append(args, "--block", fmt.Sprintf("disk%d=disk%d.img:%d", d, d, c.DiskSize))
	}
	if c.Memory > 0 {
		args = append(args, "--memory", strconv.FormatInt(c.Memory, 10))
	}
	if c.AccelSlots > 0 {
		args = append(args, "--accel", strconv.Itoa(c.AccelSlots))
	}
	if c.InsecureDataplane {
		args = append(args, "--insecure-dataplane")
	}
	if c.Uplinks {
		nicArg := "wan=wan0"
		if c.NICRate != "" {
			nicArg += ":" + c.NICRate
		}
		args = append(args, "--nic", nicArg)
	}
	return append(args, c.AgentArgs...)
}

// StartControlPlane starts the control plane's process (at Start, or again
// after KillControlPlane or StopControlPlane) and waits until it serves.
// The Rack's client (Client) verifies it with the CA certificates of the
// state dir's ca-cert.pem as it is then (those of a CA rotation too).
func (r *Rack) StartControlPlane(ctx context.Context) error {
	base, err := r.loadClient()
	if err != nil {
		return err
	}
	p, err := r.start(r.cp, r.serverArgs(), []string{"RIALTO_BOOTSTRAP_TOKEN=" + r.boot, "RIALTO_ADMIN_TOKEN=" + r.admin})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ReadyTimeout)
	defer cancel()
	hc := *base
	hc.Timeout = 2 * time.Second
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, "GET", r.url+"/healthz", nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("rack: control plane exited: %v%s", p.err, logTail(r.cp.Log))
		case <-ctx.Done():
			return fmt.Errorf("rack: control plane not serving %s: %w%s", r.url, ctx.Err(), logTail(r.cp.Log))
		case <-tick.C:
		}
	}
}

// StartAgent starts agent i's process again (after KillAgent or StopAgent)
// with the same state dir, and waits until its node is ready.
func (r *Rack) StartAgent(ctx context.Context, i int) error {
	since := time.Now()
	if err := r.startAgent(i); err != nil {
		return err
	}
	return r.waitAgents(ctx, since, r.agents[i])
}

func (r *Rack) startAgent(i int) error {
	n := r.agents[i]
	if err := os.MkdirAll(n.StateDir, 0o700); err != nil {
		return fmt.Errorf("rack: %w", err)
	}
	_, err := r.start(n, r.agentArgs(n), []string{"RIALTO_BOOTSTRAP_TOKEN=" + r.boot})
	return err
}

// waitAgents waits until every node in ns is ready at its namespace address
// with a heartbeat later than since (so a node left ready in the database
// by an earlier process does not count).
func (r *Rack) waitAgents(ctx context.Context, since time.Time, ns ...Node) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ReadyTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		nodes, err := r.Client().Nodes(ctx)
		if err == nil {
			byName := map[string]api.Node{}
			for _, n := range nodes {
				byName[n.Name] = n
			}
			ready := 0
			for _, want := range ns {
				got, ok := byName[want.Name]
				if ok && got.State == api.NodeReady && got.Address == want.Addr.String() && !got.LastHeartbeat.Before(since) {
					ready++
				} else if ok {
					last = fmt.Sprintf("%s is %s at %s, last heartbeat %v", want.Name, got.State, got.Address, got.LastHeartbeat)
				} else {
					last = want.Name + " has not joined"
				}
			}
			if ready == len(ns) {
				return nil
			}
		} else {
			last = err.Error()
		}
		for _, want := range ns {
			r.mu.Lock()
			p := r.procs[want.Name]
			r.mu.Unlock()
			select {
			case <-p.done:
				return fmt.Errorf("rack: agent %s exited: %v%s", want.Name, p.err, logTail(want.Log))
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rack: agents not ready (%s): %w", last, ctx.Err())
		case <-tick.C:
		}
	}
}

// start runs args of the rialto binary inside n's namespace.
func (r *Rack) start(n Node, args, secrets []string) (*proc, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if p := r.procs[n.Name]; p != nil {
		select {
		case <-p.done:
		default:
			return nil, fmt.Errorf("%w: %s", ErrRunning, n.Name)
		}
	}
	logf, err := os.OpenFile(n.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("rack: %w", err)
	}
	defer logf.Close()
	// The command line carries no secret; with it a user can start the
	// process again by hand (the tokens are in the state dir's env file).
	fmt.Fprintf(logf, "--- rack: %s: starting %s: ip netns exec %s rialto %s\n", time.Now().Format(time.RFC3339Nano),
		n.Name, n.Namespace, strings.Join(args, " "))
	// ip netns exec enters the namespace and execs the binary under the
	// same pid, so signals to the pid reach rialto itself.
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Namespace, r.cfg.Binary}, args...)...)
	cmd.Env = r.env(secrets)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = r.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("rack: start %s: %w", n.Name, err)
	}
	r.log.Info("started", "node", n.Name, "pid", cmd.Process.Pid, "namespace", n.Namespace)
	p := &proc{name: n.Name, cmd: cmd, done: make(chan struct{})}
	r.procs[n.Name] = p
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		err := cmd.Wait()
		r.mu.Lock()
		p.err = err
		report := !p.expected && !r.closed
		r.mu.Unlock()
		close(p.done)
		if report {
			r.log.Info("process exited", "node", n.Name, "err", err)
			select {
			case r.exits <- Exit{Node: n.Name, Err: err}:
			default:
			}
		}
	}()
	return p, nil
}

// running returns name's process if it runs, marking it as ended by the Rack.
func (r *Rack) running(name string) (*proc, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	p := r.procs[name]
	if p == nil {
		return nil, fmt.Errorf("%w: %s", ErrNotRunning, name)
	}
	select {
	case <-p.done:
		return nil, fmt.Errorf("%w: %s", ErrNotRunning, name)
	default:
	}
	p.expected = true
	return p, nil
}

// kill SIGKILLs name's process and waits for it.
func (r *Rack) kill(name string) error {
	p, err := r.running(name)
	if err != nil {
		return err
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return nil
}

// stop SIGTERMs name's process and waits for it to end, SIGKILLing it when
// ctx is done or StopTimeout has passed.
func (r *Rack) stop(ctx context.Context, name string) error {
	p, err := r.running(name)
	if err != nil {
		return err
	}
	return r.stopProc(ctx, p)
}

func (r *Rack) stopProc(ctx context.Context, p *proc) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(r.cfg.StopTimeout)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
	case <-t.C:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("rack: %s did not stop on SIGTERM within %v; killed", p.name, r.cfg.StopTimeout)
}

// KillAgent SIGKILLs agent i's process (a crash: no goodbye to the control
// plane, exports left in its state dir) and waits until it is gone.
func (r *Rack) KillAgent(i int) error { return r.kill(r.agents[i].Name) }

// StopAgent stops agent i's process with SIGTERM (SIGKILL after
// StopTimeout or when ctx is done).
func (r *Rack) StopAgent(ctx context.Context, i int) error { return r.stop(ctx, r.agents[i].Name) }

// RestartAgent is KillAgent then StartAgent.
func (r *Rack) RestartAgent(ctx context.Context, i int) error {
	if err := r.KillAgent(i); err != nil {
		return err
	}
	return r.StartAgent(ctx, i)
}

// KillControlPlane SIGKILLs the control plane's process and waits until it
// is gone.
func (r *Rack) KillControlPlane() error { return r.kill(ControlPlaneName) }

// StopControlPlane stops the control plane's process with SIGTERM.
func (r *Rack) StopControlPlane(ctx context.Context) error { return r.stop(ctx, ControlPlaneName) }

// Pid is the pid of n's process, or 0 if it is not running.
func (r *Rack) Pid(n Node) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.procs[n.Name]
	if p == nil {
		return 0
	}
	select {
	case <-p.done:
		return 0
	default:
		return p.cmd.Process.Pid
	}
}

// Close stops the agents, then the control plane (SIGTERM, SIGKILL after
// StopTimeout), deletes the lab, dismisses the reaper and releases the state
// dir. It returns the errors of every step but always attempts them all.
// Later calls return the first call's result.
func (r *Rack) Close() error {
	r.closeOnce.Do(func() { r.closeErr = r.close() })
	return r.closeErr
}

func (r *Rack) close() error {
	r.mu.Lock()
	r.closed = true
	var agents []*proc
	for _, n := range r.agents {
		if p := r.procs[n.Name]; p != nil {
			p.expected = true
			agents = append(agents, p)
		}
	}
	cp := r.procs[ControlPlaneName]
	if cp != nil {
		cp.expected = true
	}
	r.mu.Unlock()

	var errs []error
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, p := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.stopProc(ctx, p); err != nil {
				r.log.Warn("stop", "err", err)
			}
		}()
	}
	wg.Wait()
	if cp != nil {
		if err := r.stopProc(ctx, cp); err != nil {
			r.log.Warn("stop", "err", err)
		}
	}
	r.wg.Wait()
	if r.lab != nil {
		if err := r.lab.Close(); err != nil {
			errs = append(errs, fmt.Errorf("rack: %w", err))
		}
	}
	if len(errs) == 0 && r.lab != nil {
		// Nothing is left to purge next time.
		if rec, err := readRecord(r.dir); err == nil && rec.Lab == r.lab.ID() {
			rec.Lab, rec.PID, rec.Reaper = "", 0, 0
			if err := writeRecord(r.dir, rec); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if r.reaper != nil {
		// Dismissed only once the lab is gone: if this process dies
		// before here, the reaper finishes the job.
		if err := r.reaper.dismiss(len(errs) == 0); err != nil {
			errs = append(errs, err)
		}
	}
	// The reaper, which shares the lock, is gone: let go of it, though
	// a child process forked meanwhile shares it too.
	_ = filelock.Close(r.lock)
	return errors.Join(errs...)
}

// logTail returns the last lines of a process's log, for an error message.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	lines = lines[max(0, len(lines)-10):]
	return "\n" + path + ":\n  " + strings.Join(lines, "\n  ")
}
