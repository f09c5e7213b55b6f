package testcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
	"github.com/rialto-project/rialto/internal/pki"
)

// Tokens used by every cluster.
const (
	BootstrapToken = "rbt_testcluster-bootstrap"
	AdminToken     = "rat_testcluster-admin"
)

// TenantToken is the API token of a tenant listed in Options.Tenants.
func TenantToken(tenant string) string { return "rat_testcluster-tenant-" + tenant }

// Options configures a cluster; zero fields take the defaults shown.
type Options struct {
	Nodes int // 3
	// Devices each node lends (default: two 64 MiB sparse block files,
	// disk0 and disk1). Relative paths are inside the node's state dir.
	Devices []agent.DeviceConfig
	// Tenants get tokens TenantToken(name); the admin token belongs to
	// tenant "admin".
	Tenants []string

	HeartbeatInterval time.Duration // agents' real interval, 100ms
	SuspectAfter      time.Duration // 3s of fake time
	DownAfter         time.Duration // 10s of fake time
	PrepareTimeout    time.Duration // 10s (real time)
	WipeWait          time.Duration // 5s (real time): a request's wait for a wipe (controlplane.Config)
	DefaultTTL        time.Duration // 1h

	// Configure, if set, adjusts node i's agent configuration (0-based)
	// before it first starts: other devices, labels, drivers.
	Configure func(i int, cfg *agent.Config)

	// Lender wraps the control plane's default HTTP lender, if set.
	Lender func(controlplane.Lender) controlplane.Lender
	Logger *slog.Logger // discard

	// TLS runs the cluster as rialto server does: a cluster CA
	// (Cluster.CA), the API over HTTPS asking for client certificates,
	// agents enrolled with node certificates (NodeCertLifetime, default
	// 24h) and called over mutual TLS.
	TLS              bool
	NodeCertLifetime time.Duration
}

// Cluster is a running control plane with its agents.
type Cluster struct {
	URL    string  // the control plane's base URL
	CA     *pki.CA // with Options.TLS
	Clock  *Clock
	Server *controlplane.Server
	Nodes  []*Node

	t    testing.TB
	opts Options
	log  *slog.Logger
	hs   *httptest.Server
	st   *sqlite.Store

	dbPath string
	host   string
	cpCfg  controlplane.Config
	addr   string // the control plane's address while stopped
}

// Node is one agent of the cluster, which may be killed and restarted.
type Node struct {
	Name     string
	StateDir string

	c      *Cluster
	cfg    agent.Config
	mu     sync.Mutex
	agent  *agent.Agent
	cancel context.CancelFunc
	done   chan error
}

// Start starts a cluster and waits until every node is ready. Everything
// is stopped when the test ends.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Devices == nil {
		opts.Devices = []agent.DeviceConfig{
			{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 64 << 20},
			{Name: "disk1", Kind: api.KindBlock, Path: "disk1.img", Size: 64 << 20},
		}
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 100 * time.Millisecond
	}
	if opts.SuspectAfter == 0 {
		opts.SuspectAfter = 3 * time.Second
	}
	if opts.DownAfter == 0 {
		opts.DownAfter = 10 * time.Second
	}
	if opts.PrepareTimeout == 0 {
		// Not the control plane's 2s: loading a role into accel slots (an
		// MCT rule set, say) takes half a second under -race, and more
		// than 2s on a loaded 2-core machine.
		opts.PrepareTimeout = 10 * time.Second
	}
	if opts.DefaultTTL == 0 {
		opts.DefaultTTL = time.Hour
	}
	if opts.WipeWait == 0 {
		opts.WipeWait = 5 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	dir := t.TempDir()
	c := &Cluster{Clock: NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), t: t, opts: opts, log: log,
		dbPath: filepath.Join(dir, "rialto.db")}
	tokens := []controlplane.Token{{Token: AdminToken, Tenant: "admin", Admin: true}}
	for _, tn := range opts.Tenants {
		tokens = append(tokens, controlplane.Token{Token: TenantToken(tn), Tenant: tn})
	}
	var lender controlplane.Lender
	if opts.TLS {
		ca, err := pki.Open(filepath.Join(dir, "tls"), pki.Options{})
		if err != nil {
			t.Fatalf("testcluster: CA: %v", err)
		}
		c.CA = ca
		if opts.Lender != nil {
			l, err := controlplane.NewTLSLender(ca)
			if err != nil {
				t.Fatalf("testcluster: %v", err)
			}
			lender = opts.Lender(l)
		}
	} else if opts.Lender != nil {
		lender = opts.Lender(controlplane.NewHTTPLender(nil))
	}
	c.cpCfg = controlplane.Config{
		Logger: log.With("component", "controlplane"), Clock: c.Clock, Lender: lender,
		BootstrapToken: BootstrapToken, Tokens: tokens,
		HeartbeatInterval: opts.HeartbeatInterval, SuspectAfter: opts.SuspectAfter, DownAfter: opts.DownAfter,
		PrepareTimeout: opts.PrepareTimeout, DefaultTTL: opts.DefaultTTL, WipeWait: opts.WipeWait,
		CA: c.CA, NodeCertLifetime: opts.NodeCertLifetime,
	}
	host, ln := listenLoopback(t)
	c.host = host
	t.Cleanup(c.stopControlPlane)
	c.startControlPlane(ln)
	c.URL = c.hs.URL

	for i := range opts.Nodes {
		name := fmt.Sprintf("node%d", i+1)
		n := &Node{Name: name, StateDir: filepath.Join(dir, name), c: c}
		n.cfg = agent.Config{
			ControlPlane: c.URL, BootstrapToken: BootstrapToken, Name: name, StateDir: n.StateDir,
			Listen: host, Devices: append([]agent.DeviceConfig(nil), opts.Devices...), HeartbeatInterval: opts.HeartbeatInterval,
			Logger: log.With("component", "agent"), Clock: c.Clock,
		}
		if c.CA != nil {
			n.cfg.CAFile = c.CA.CertFile()
		}
		if opts.Configure != nil {
			opts.Configure(i, &n.cfg)
		}
		c.Nodes = append(c.Nodes, n)
	}
	// Agents stop before the control plane's server closes (cleanups run
	// last-in first-out).
	t.Cleanup(func() {
		for _, n := range c.Nodes {
			n.Kill()
		}
	})
	for _, n := range c.Nodes {
		n.Restart()
	}
	return c
}

// listenLoopback returns the host the cluster's control plane and agents
// listen on, and a listener for the control plane there: an address of
// its own in 127.0.0.0/8 where the system routes that block to loopback
// (Linux), else 127.0.0.1.
//
// The kernel hands out the same ephemeral ports to every socket of the
// machine that binds port 0 or connects. A port a killed agent frees on
// 127.0.0.1 may be taken by any other test's (or process's) listener or
// connection before the agent restarts and binds it again, and the
// restarted agent then rightly serves its exports at new addresses, which
// fails tests that restart a node and expect its URIs to hold. On an
// address no one else uses, a freed port stays free for the node.
func listenLoopback(t testing.TB) (string, net.Listener) {
	t.Helper()
	host := fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(254), rand.IntN(256), 1+rand.IntN(254))
	if ln, err := net.Listen("tcp", net.JoinHostPort(host, "0")); err == nil {
		return host, ln
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	return "127.0.0.1", ln
}

// startControlPlane opens the store and serves a new control plane on ln.
func (c *Cluster) startControlPlane(ln net.Listener) {
	c.t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, c.dbPath)
	if err != nil {
		ln.Close()
		c.t.Fatalf("testcluster: open store: %v", err)
	}
	cfg := c.cpCfg
	cfg.Store = st
	srv, err := controlplane.New(ctx, cfg)
	if err != nil {
		st.Close()
		ln.Close()
		c.t.Fatalf("testcluster: control plane: %v", err)
	}
	hs := httptest.NewUnstartedServer(srv.Handler())
	hs.Listener.Close()
	hs.Listener = ln
	if c.CA != nil {
		// The configuration `rialto server` serves with. Its certificate
		// is fixed: httptest would put its own first.
		cfg, err := controlplane.APIServerTLS(c.CA, []string{c.host})
		if err != nil {
			c.t.Fatalf("testcluster: %v", err)
		}
		cert, err := cfg.GetCertificate(nil)
		if err != nil {
			c.t.Fatalf("testcluster: %v", err)
		}
		cfg.Certificates, cfg.GetCertificate = []tls.Certificate{*cert}, nil
		hs.TLS = cfg
		hs.StartTLS()
	} else {
		hs.Start()
	}
	c.st, c.Server, c.hs = st, srv, hs
}

func (c *Cluster) stopControlPlane() {
	if c.hs != nil {
		c.Server.Close() // its moves and drains
		c.hs.Close()
		c.st.Close()
		c.hs = nil
	}
}

// RestartControlPlane stops the control plane and starts a new one on the
// same database and address, as a control-plane process restart would;
// agents keep running and find it again. Not safe concurrently with other
// Cluster methods.
func (c *Cluster) RestartControlPlane() {
	c.t.Helper()
	c.StopControlPlane()
	c.StartControlPlane()
}

// StopControlPlane stops the control plane: agents' heartbeats and joins
// fail until StartControlPlane. Not safe concurrently with other Cluster
// methods.
func (c *Cluster) StopControlPlane() {
	c.t.Helper()
	c.addr = c.hs.Listener.Addr().String()
	c.stopControlPlane()
}

// StartControlPlane starts a control plane stopped by StopControlPlane on
// the same database and address.
func (c *Cluster) StartControlPlane() {
	c.t.Helper()
	addr := c.addr
	var ln net.Listener
	Eventually(c.t, 10*time.Second, "the control plane's address to be free", func() bool {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err == nil
	})
	c.startControlPlane(ln)
}

// IssuerOf is the CA certificate (of c.CA) that issued the certificate
// the TLS server at baseURL (the control plane's c.URL, a node's agent
// URL) presents now.
func (c *Cluster) IssuerOf(t testing.TB, baseURL string) *x509.Certificate {
	t.Helper()
	u, err := url.Parse(baseURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", u.Host, c.CA.ClientConfig(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	chains := conn.ConnectionState().VerifiedChains
	return chains[0][len(chains[0])-1]
}

// RotateCA rotates the cluster CA (Options.TLS) as `rialto ca rotate`
// does, in another process, and has the running control plane follow it
// (a sweep): it trusts the new CA's certificates and the old one's, and
// hands them out, but keeps issuing from the old CA until it restarts
// (StopControlPlane, StartControlPlane). c.CA is the rotated CA from now
// on; RotateCA returns its new certificate.
func (c *Cluster) RotateCA() *x509.Certificate {
	c.t.Helper()
	rotated, err := pki.Load(c.CA.Dir(), pki.Options{})
	if err != nil {
		c.t.Fatalf("testcluster: %v", err)
	}
	if err := rotated.Rotate(); err != nil {
		c.t.Fatalf("testcluster: rotate the CA: %v", err)
	}
	c.Sweep()
	c.CA, c.cpCfg.CA = rotated, rotated
	return rotated.Certificate()
}

// Client returns an API client with the admin token.
func (c *Cluster) Client() *api.Client { return c.ClientWithToken(AdminToken) }

// ClientWithToken returns an API client with any token.
func (c *Cluster) ClientWithToken(tok string) *api.Client {
	return api.NewClient(c.URL, tok, c.HTTPClient())
}

// HTTPClient is an HTTP client for the control plane (verifying it against
// the cluster CA with Options.TLS).
func (c *Cluster) HTTPClient() *http.Client {
	if c.CA == nil {
		return &http.Client{Timeout: 30 * time.Second}
	}
	hc, err := api.HTTPClient(c.CA.CertFile(), 30*time.Second)
	if err != nil {
		c.t.Fatalf("testcluster: %v", err)
	}
	return hc
}

// Advance moves the control plane's clock forward.
func (c *Cluster) Advance(d time.Duration) { c.Clock.Advance(d) }

// Sweep runs the control plane's background duties once.
func (c *Cluster) Sweep() {
	c.t.Helper()
	if err := c.Server.Sweep(context.Background()); err != nil {
		c.t.Fatalf("testcluster: sweep: %v", err)
	}
}

// Heartbeat makes every running agent whose heartbeats are not paused
// heartbeat now (and reconcile what the answer says).
func (c *Cluster) Heartbeat() {
	c.t.Helper()
	for _, n := range c.Nodes {
		if a := n.Agent(); a != nil {
			if err := a.Heartbeat(context.Background()); err != nil {
				c.t.Fatalf("testcluster: heartbeat of %s: %v", n.Name, err)
			}
		}
	}
}

// Eventually polls cond until it holds, failing the test after 15 s.
func (c *Cluster) Eventually(what string, cond func() bool) {
	c.t.Helper()
	Eventually(c.t, 15*time.Second, what, cond)
}

// Eventually polls cond every few milliseconds until it holds or the
// deadline passes, which fails t.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("testcluster: timed out after %v waiting for %s", within, what)
		}
		<-tick.C
	}
}

// NodeByID returns the cluster node with a node ID, or nil.
func (c *Cluster) NodeByID(id string) *Node {
	for _, n := range c.Nodes {
		if n.ID() == id {
			return n
		}
	}
	return nil
}

// NodeState returns a node's state as the control plane sees it.
func (c *Cluster) NodeState(id string) api.NodeState {
	c.t.Helper()
	n, err := c.Client().Node(context.Background(), id)
	if err != nil {
		c.t.Fatalf("testcluster: node %s: %v", id, err)
	}
	return n.State
}

// Lease returns a lease as the control plane sees it.
func (c *Cluster) Lease(id string) api.Lease {
	c.t.Helper()
	l, err := c.Client().Lease(context.Background(), id)
	if err != nil {
		c.t.Fatalf("testcluster: lease %s: %v", id, err)
	}
	return l
}

// Agent is the node's running agent (nil while killed).
func (n *Node) Agent() *agent.Agent {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cancel == nil {
		return nil
	}
	return n.agent
}

// ID is the node's ID (stable across restarts).
func (n *Node) ID() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.agent == nil {
		return ""
	}
	return n.agent.NodeID()
}

// Faults are the running agent's fault switches (a killed node's last
// agent's, which a restart does not carry over).
func (n *Node) Faults() *agent.Faults {
	n.mu.Lock()
	defer n.mu.Unlock()
	return &n.agent.Faults
}

// PauseHeartbeats stops (or resumes) the node's heartbeats; when it
// returns, no heartbeat is in flight.
func (n *Node) PauseHeartbeats(pause bool) {
	if a := n.Agent(); a != nil {
		a.PauseHeartbeats(pause)
	}
}

// Serves reports whether the node's agent keeps an export for the lease
// (served, or held or suspended: see agent.Agent.Leases).
func (n *Node) Serves(leaseID string) bool {
	a := n.Agent()
	if a == nil {
		return false
	}
	for _, id := range a.Leases() {
		if id == leaseID {
			return true
		}
	}
	return false
}

// Kill stops the agent as a crash would look to the control plane: its
// heartbeats and data planes end. It is a no-op on a killed node.
func (n *Node) Kill() {
	n.c.t.Helper()
	n.mu.Lock()
	cancel, done := n.cancel, n.done
	n.cancel = nil
	n.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			n.c.t.Errorf("testcluster: agent %s: %v", n.Name, err)
		}
	case <-time.After(15 * time.Second):
		n.c.t.Errorf("testcluster: agent %s did not stop", n.Name)
	}
}

// Restart starts a new agent on the node's state dir (killing the running
// one first) and waits until it has joined and applied the control plane's
// first answer.
func (n *Node) Restart() {
	n.c.t.Helper()
	n.Kill()
	n.Launch()
	n.WaitReady()
}

// Launch starts a new agent on the node's state dir (which must not be
// running) and returns at once; WaitReady waits for it.
func (n *Node) Launch() {
	n.c.t.Helper()
	n.LaunchWith(nil)
}

// LaunchWith is Launch with setup called on the new agent before it runs
// (to set its Faults).
func (n *Node) LaunchWith(setup func(*agent.Agent)) {
	n.c.t.Helper()
	a, err := agent.New(n.cfg)
	if err != nil {
		n.c.t.Fatalf("testcluster: agent %s: %v", n.Name, err)
	}
	if setup != nil {
		setup(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	n.mu.Lock()
	n.agent, n.cancel, n.done = a, cancel, done
	n.mu.Unlock()
}

// WaitReady waits until the launched agent has joined and applied the
// control plane's first answer.
func (n *Node) WaitReady() {
	n.c.t.Helper()
	n.mu.Lock()
	a, done := n.agent, n.done
	n.mu.Unlock()
	select {
	case <-a.Ready():
	case err := <-done:
		done <- err
		n.c.t.Fatalf("testcluster: agent %s stopped before joining: %v", n.Name, err)
	case <-time.After(15 * time.Second):
		n.c.t.Fatalf("testcluster: agent %s did not join", n.Name)
	}
}

// JoinAgentless joins, with the bootstrap token, a machine that runs no
// agent (its agent URL answers nothing) under name, with machine ID mid
// and one block device disk0 of capacity bytes, and returns its node ID:
// another machine joined under a name already in use, say.
func (c *Cluster) JoinAgentless(name, mid string, capacity int64) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	jr, err := api.NewClient(c.URL, BootstrapToken, c.HTTPClient()).Join(ctx, api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1",
		Fingerprint: api.Fingerprint{MachineID: mid, Hostname: mid},
		Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: capacity}}})
	if err != nil {
		c.t.Fatalf("testcluster: join %s as %s: %v", mid, name, err)
	}
	return jr.NodeID
}
