// Package lab runs a Rialto cluster for the benchmarks the way users deploy
// one: a `rialto server` process and `rialto agent` processes on 127.0.0.1
// (Start, StartAgent), or those of an emulated rack whose processes each
// run in a network namespace behind a shaped link (internal/rack; OnRack);
// leases made with `rialto lease create`; and `rialto attach` processes
// serving leases locally. Every figure of bench/ that carries a goal is
// measured through these processes, so it measures the product.
//
// Secrets (the bootstrap and admin tokens) reach the processes through
// their environment, never their arguments; Commands records what ran with
// placeholders for the generated names.
//
// The zero value is not usable; call Start. A Cluster's methods may be
// called from one goroutine at a time. Close stops every process the
// cluster started (attachments, agents, then the server) and waits for
// them; the caller owns the netns lab and the working directory.
package lab

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/rack"
)

// Config says where a cluster runs.
type Config struct {
	// Bin is the rialto binary (make build: bin/rialto).
	Bin string
	// Dir holds the database, agents' state, logs and attach state; put it
	// on a tmpfs.
	Dir string
	// ServerArgs are extra `rialto server` flags.
	ServerArgs []string
	// Progress receives one line per step; nil discards.
	Progress io.Writer
}

// Proc is a process the cluster started.
type Proc struct {
	Name string // "server", the agent's node name, "attach LEASE"
	Log  string // file holding its stderr (and stdout unless parsed)
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// PID is the process ID, for /proc/PID/stat (an agent in a namespace is
// exec'd by ip netns exec, so this is the agent itself).
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM, waits up to 15 s, then kills the process, and waits.
func (p *Proc) Stop() error {
	if ok, _ := p.Exited(); !ok {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled() {
		return nil // ended by our signal
	}
	return p.err
}

// Cluster is a running control plane and its agents.
type Cluster struct {
	cfg      Config
	URL      string // the control plane's URL
	CACert   string // the cluster CA's certificate (RIALTO_CACERT), "" over plain HTTP
	admin    string
	boot     string
	Server   *Proc
	client   *api.Client
	hc       *http.Client // trusts CACert
	mu       sync.Mutex
	procs    []*Proc // in start order; stopped in reverse
	Commands []string
}

func token(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Start runs `rialto server` and waits until it answers.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, admin: token("bench-admin-"), boot: token("bench-boot-")}
	host := "127.0.0.1"
	args := append([]string{"server", "--listen", host + ":0", "--db", filepath.Join(cfg.Dir, "rialto.db"), "--log-level", "warn"}, cfg.ServerArgs...)
	cmd := exec.Command(cfg.Bin, args...)
	cmd.Env = append(os.Environ(), "RIALTO_BOOTSTRAP_TOKEN="+c.boot, "RIALTO_ADMIN_TOKEN="+c.admin)
	p, out, err := c.start(cmd, "server", true)
	if err != nil {
		return nil, err
	}
	c.Server = p
	shown := append([]string{"server", "--listen", host + ":0", "--db", "DIR/rialto.db", "--log-level", "warn"}, cfg.ServerArgs...)
	c.record("RIALTO_BOOTSTRAP_TOKEN=… RIALTO_ADMIN_TOKEN=… rialto " + strings.Join(shown, " "))
	// "rialto server: serving https://HOST:PORT", then (over HTTPS)
	// "rialto server: CA certificate FILE (give it to clients: ...)".
	br := bufio.NewReader(out)
	line, err := readLine(ctx, br, p, 15*time.Second)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("rialto server: %w (log %s)", err, p.Log)
	}
	i := strings.Index(line, "://")
	if i < 0 {
		c.Close()
		return nil, fmt.Errorf("rialto server said %q", line)
	}
	i = strings.LastIndex(line[:i], " ") + 1
	c.URL = strings.TrimSpace(line[i:])
	hc := &http.Client{Timeout: time.Minute}
	if strings.HasPrefix(c.URL, "https://") {
		line, err := readLine(ctx, br, p, 15*time.Second)
		const key = "CA certificate "
		j := strings.Index(line, key)
		if err != nil || j < 0 {
			c.Close()
			return nil, fmt.Errorf("rialto server did not name its CA certificate: %q %v", line, err)
		}
		c.CACert, _, _ = strings.Cut(line[j+len(key):], " ")
		pem, err := os.ReadFile(c.CACert)
		if err != nil {
			c.Close()
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			c.Close()
			return nil, fmt.Errorf("no certificate in %s", c.CACert)
		}
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	}
	go io.Copy(io.Discard, br)
	c.hc = hc
	c.client = api.NewClient(c.URL, c.admin, hc)
	fmt.Fprintf(cfg.Progress, "lab: rialto server at %s (pid %d)\n", c.URL, p.PID())
	return c, nil
}

// OnRack returns a Cluster whose leases and attachments go to rack r's
// control plane (as its admin); dir holds the attach processes' logs and
// state. The rack's own processes stay the rack's: Close stops only what
// this Cluster started. Commands begins with the rack's command lines.
func OnRack(r *rack.Rack, bin, dir string, progress io.Writer) (*Cluster, error) {
	if progress == nil {
		progress = io.Discard
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: Config{Bin: bin, Dir: dir, Progress: progress}, URL: r.URL(), CACert: r.CACert(), admin: r.AdminToken(),
		boot: r.BootstrapToken(), client: r.Client()}
	for _, n := range append([]rack.Node{r.ControlPlane()}, r.Agents()...) {
		b, err := os.ReadFile(n.Log)
		if err != nil {
			return nil, err
		}
		// "--- rack: TIME: starting NAME: ip netns exec NS rialto ARGS"
		for _, line := range strings.Split(string(b), "\n") {
			if _, cmd, ok := strings.Cut(line, ": starting "+n.Name+": "); ok && strings.HasPrefix(line, "--- rack: ") {
				c.record("RIALTO_BOOTSTRAP_TOKEN=… " + strings.ReplaceAll(cmd, r.StateDir(), "DIR"))
				break
			}
		}
	}
	return c, nil
}

// readLine reads one line of out, failing if p exits or the time runs out.
func readLine(ctx context.Context, br *bufio.Reader, p *Proc, within time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := br.ReadString('\n')
		ch <- res{s, err}
	}()
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case r := <-ch:
		if r.err != nil && r.s == "" {
			<-p.done
			return "", fmt.Errorf("exited: %v", p.err)
		}
		return r.s, nil
	case <-t.C:
		return "", errors.New("no answer in time")
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// start starts cmd with its stderr (and stdout unless pipeOut) in a log
// file under Dir.
func (c *Cluster) start(cmd *exec.Cmd, name string, pipeOut bool) (*Proc, io.Reader, error) {
	logName := strings.NewReplacer(" ", "-", "/", "-").Replace(name) + ".log"
	log, err := os.Create(filepath.Join(c.cfg.Dir, logName))
	if err != nil {
		return nil, nil, err
	}
	defer log.Close()
	cmd.Stderr = log
	var out io.Reader
	if pipeOut {
		r, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, err
		}
		out = r
	} else {
		cmd.Stdout = log
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: log.Name(), cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, out, nil
}

func (c *Cluster) record(s string) {
	for _, have := range c.Commands {
		if have == s {
			return
		}
	}
	c.Commands = append(c.Commands, s)
}

var insecureArgs sync.Map // binary path → []string

// InsecureDataplaneArgs is ["--insecure-dataplane"] when bin's agent has
// that flag, nil otherwise. An agent given the cluster CA serves its data
// planes over TLS by default; the benchmarks compare Rialto with plaintext
// peers (nbdkit, nbd-server, qemu-nbd, Redis, iperf3, ZeroMQ), so their
// agents serve plaintext too, and the flag shows in the recorded commands.
// TLS has its own comparison (bench/tls). The answer is cached per binary.
func InsecureDataplaneArgs(bin string) []string {
	if v, ok := insecureArgs.Load(bin); ok {
		return v.([]string)
	}
	// `rialto agent --help` prints the flags and exits non-zero: only the
	// text matters.
	out, _ := exec.Command(bin, "agent", "--help").CombinedOutput()
	var args []string
	if strings.Contains(string(out), "-insecure-dataplane") {
		args = []string{"--insecure-dataplane"}
	}
	insecureArgs.Store(bin, args)
	return args
}

// Agent describes one `rialto agent` process.
type Agent struct {
	Name   string   // node name (also its state directory under Dir)
	Blocks []string // --block specs, NAME=PATH:SIZE
	Memory string   // --memory, e.g. 1GiB
	Accel  int      // --accel slots
	Labels []string // --label KEY=VALUE
	Args   []string // extra flags
}

// StartAgent runs a `rialto agent` and waits until its node is ready with
// every device it lends registered.
func (c *Cluster) StartAgent(ctx context.Context, a Agent) (*Proc, error) {
	if c.Server == nil {
		return nil, errors.New("lab: agents of a rack are the rack's")
	}
	listen := "127.0.0.1"
	args := []string{"agent", "--control-plane", c.URL, "--name", a.Name,
		"--state-dir", filepath.Join(c.cfg.Dir, "agent-"+a.Name), "--listen", listen, "--log-level", "warn"}
	shown := []string{"agent", "--control-plane", "URL", "--name", a.Name, "--state-dir", "DIR/agent-" + a.Name, "--listen", listen, "--log-level", "warn"}
	add := func(flag, v string) {
		args = append(args, flag, v)
		shown = append(shown, flag, v)
	}
	for _, b := range a.Blocks {
		args = append(args, "--block", b)
		name, rest, _ := strings.Cut(b, "=")
		shown = append(shown, "--block", name+"=IMG"+rest[strings.LastIndex(rest, ":"):])
	}
	if a.Memory != "" {
		add("--memory", a.Memory)
	}
	if a.Accel > 0 {
		add("--accel", fmt.Sprint(a.Accel))
	}
	for _, l := range a.Labels {
		add("--label", l)
	}
	insecure := InsecureDataplaneArgs(c.cfg.Bin)
	args = append(append(args, insecure...), a.Args...)
	shown = append(append(shown, insecure...), a.Args...)
	cmd := exec.Command(c.cfg.Bin, args...)
	cmd.Env = append(os.Environ(), "RIALTO_BOOTSTRAP_TOKEN="+c.boot, "RIALTO_CACERT="+c.CACert)
	p, _, err := c.start(cmd, "agent-"+a.Name, false)
	if err != nil {
		return nil, err
	}
	c.record("RIALTO_BOOTSTRAP_TOKEN=… RIALTO_CACERT=CA rialto " + strings.Join(shown, " "))
	want := len(a.Blocks)
	if a.Memory != "" {
		want++
	}
	if a.Accel > 0 {
		want++
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if ok, err := p.Exited(); ok {
			return nil, fmt.Errorf("agent %s exited: %v (log %s)", a.Name, err, p.Log)
		}
		if ready, err := c.nodeReady(ctx, a.Name, want); err == nil && ready {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("agent %s did not become ready (log %s)", a.Name, p.Log)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	fmt.Fprintf(c.cfg.Progress, "lab: agent %s ready (pid %d, %s)\n", a.Name, p.PID(), listen)
	return p, nil
}

func (c *Cluster) nodeReady(ctx context.Context, name string, devices int) (bool, error) {
	nodes, err := c.client.Nodes(ctx)
	if err != nil {
		return false, err
	}
	for _, n := range nodes {
		if n.Name != name || n.State != api.NodeReady {
			continue
		}
		devs, err := c.client.Devices(ctx)
		if err != nil {
			return false, err
		}
		have := 0
		for _, d := range devs {
			if d.NodeID == n.ID && d.State == "available" {
				have++
			}
		}
		return have >= devices, nil
	}
	return false, nil
}

// AgentMetrics returns the URL of node's agent's GET /metrics, from the
// control plane's scrape targets (GET /v1/metrics-targets), and an HTTP
// client that trusts the cluster CA (the agents of an enrolled cluster
// serve it over TLS).
func (c *Cluster) AgentMetrics(ctx context.Context, node string) (string, *http.Client, error) {
	groups, err := c.client.MetricsTargets(ctx)
	if err != nil {
		return "", nil, err
	}
	for _, g := range groups {
		if g.Labels["component"] != "agent" || g.Labels["node"] != node || len(g.Targets) == 0 {
			continue
		}
		scheme, path := g.Labels["__scheme__"], g.Labels["__metrics_path__"]
		if scheme == "" {
			scheme = "http"
		}
		if path == "" {
			path = "/metrics"
		}
		hc := c.hc
		if hc == nil {
			hc = &http.Client{Timeout: time.Minute}
		}
		return scheme + "://" + g.Targets[0] + path, hc, nil
	}
	return "", nil, fmt.Errorf("lab: no scrape target for agent %s", node)
}

// env is the environment of CLI verbs: the control plane and the admin
// token (never on the command line).
func (c *Cluster) env() []string {
	return append(os.Environ(), "RIALTO_ADDR="+c.URL, "RIALTO_TOKEN="+c.admin, "RIALTO_CACERT="+c.CACert,
		"XDG_RUNTIME_DIR="+filepath.Join(c.cfg.Dir, "run"))
}

// CreateLease runs `rialto lease create ARGS -o json` and returns the
// active lease.
func (c *Cluster) CreateLease(ctx context.Context, args ...string) (api.Lease, error) {
	full := append(append([]string{"lease", "create"}, args...), "-o", "json")
	cmd := exec.CommandContext(ctx, c.cfg.Bin, full...)
	cmd.Env = c.env()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return api.Lease{}, fmt.Errorf("rialto lease create %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	var l api.Lease
	if err := json.Unmarshal(out, &l); err != nil {
		return l, fmt.Errorf("rialto lease create: %w", err)
	}
	if l.State != api.LeaseActive {
		return l, fmt.Errorf("lease %s is %s: %s", l.ID, l.State, l.Reason)
	}
	shown := slices.Clone(full)
	for i, a := range shown {
		if filepath.IsAbs(a) { // a file the benchmark wrote (--role-config): its name says enough
			shown[i] = filepath.Base(a)
		}
	}
	c.record("RIALTO_ADDR=URL RIALTO_TOKEN=… RIALTO_CACERT=CA rialto " + strings.Join(shown, " "))
	fmt.Fprintf(c.cfg.Progress, "lab: lease %s (%s, %d part(s))\n", l.ID, l.Mode, len(l.Parts))
	return l, nil
}

// ReleaseLease runs `rialto lease release ID`.
func (c *Cluster) ReleaseLease(ctx context.Context, id string) error {
	cmd := exec.CommandContext(ctx, c.cfg.Bin, "lease", "release", id)
	cmd.Env = c.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("rialto lease release: %w: %s", err, out)
	}
	return nil
}

// Attachment is a `rialto attach` process serving a lease locally.
type Attachment struct {
	*Proc
	URI string // the local NBD URI (names a secret export)
	// File is the lease's file in a FUSE mount (attach --fuse; no URI).
	File string
}

// Attach runs `rialto attach LEASE ARGS -o json` in the root namespace and
// waits until it serves.
func (c *Cluster) Attach(ctx context.Context, lease string, args ...string) (*Attachment, error) {
	full := append(append([]string{"attach", lease}, args...), "-o", "json")
	cmd := exec.Command(c.cfg.Bin, full...)
	cmd.Env = c.env()
	p, out, err := c.start(cmd, "attach "+lease, true)
	if err != nil {
		return nil, err
	}
	c.record("RIALTO_ADDR=URL RIALTO_TOKEN=… RIALTO_CACERT=CA rialto attach LEASE " + strings.Join(append(args, "-o", "json"), " "))
	// The state is printed as indented JSON: read up to the closing brace.
	type res struct {
		uri, file string
		err       error
	}
	ch := make(chan res, 1)
	go func() {
		dec := json.NewDecoder(out)
		var st struct {
			URI  string `json:"uri"`
			File string `json:"file"`
		}
		err := dec.Decode(&st)
		ch <- res{st.URI, st.File, err}
		io.Copy(io.Discard, io.MultiReader(dec.Buffered(), out))
	}()
	select {
	case r := <-ch:
		if r.err != nil || r.uri == "" && r.file == "" {
			p.Stop()
			b, _ := os.ReadFile(p.Log)
			return nil, fmt.Errorf("rialto attach %s: %v: %s", lease, r.err, b)
		}
		fmt.Fprintf(c.cfg.Progress, "lab: attached %s (pid %d)\n", lease, p.PID())
		return &Attachment{Proc: p, URI: r.uri, File: r.file}, nil
	case <-time.After(30 * time.Second):
		p.Stop()
		return nil, fmt.Errorf("rialto attach %s: no answer in 30 s (log %s)", lease, p.Log)
	case <-ctx.Done():
		p.Stop()
		return nil, ctx.Err()
	}
}

// Close stops every process, the latest first (attachments before agents
// before the server), and waits for them.
func (c *Cluster) Close() error {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		if err := procs[i].Stop(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", procs[i].Name, err))
		}
	}
	return errors.Join(errs...)
}
