package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/filelock"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	register(&command{Name: "up", Summary: "Run a local cluster: a control plane and 3 agents lending file-backed disks, in one process (--netns: an emulated rack, each in its own network namespace).", Flags: runUp})
}

// maxUpDisks bounds --disks: each is a file of its own in every node's
// state dir, and every node holds them all open.
const maxUpDisks = 64

// upState is what `rialto up` keeps in its state dir (cluster.json, 0600).
type upState struct {
	BootstrapToken string `json:"bootstrap_token"`
	AdminToken     string `json:"admin_token"`
	Port           int    `json:"port"`

	// MetricsToken is the token of tenant "prometheus" (not an admin),
	// which the Prometheus configuration written beside it uses to find
	// the scrape targets (GET /v1/metrics-targets).
	MetricsToken string `json:"metrics_token,omitempty"`
}

func loadUpState(dir string) (upState, error) {
	var s upState
	p := filepath.Join(dir, "cluster.json")
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		what := "is not valid JSON"
		var se *json.SyntaxError
		if !errors.As(err, &se) {
			what = "is not the JSON rialto up writes" // valid JSON, other fields' types
		}
		return s, fmt.Errorf("%s %s (%w): it holds the cluster's tokens and API port; "+
			"remove it and run rialto up again, which makes new ones and keeps the nodes, devices and leases "+
			"(shells then need the new export lines)", p, what, err)
	}
	return s, nil
}

// makeStateDir creates rialto up's --state-dir (0700), or says which path
// in the way is not a directory (mkdir's "not a directory" names neither
// --state-dir nor what to do).
func makeStateDir(dir string) error {
	err := os.MkdirAll(dir, 0o700)
	if err == nil {
		return nil
	}
	const todo = "give --state-dir a directory, or a path to create"
	if fi, serr := os.Stat(filepath.Clean(dir)); serr == nil && !fi.IsDir() {
		return fmt.Errorf("state dir %s exists and is not a directory: %s (%w)", dir, todo, err)
	}
	var pe *fs.PathError
	if errors.Is(err, syscall.ENOTDIR) && errors.As(err, &pe) {
		return fmt.Errorf("state dir %s cannot be made: %s exists and is not a directory; %s (%w)", dir, pe.Path, todo, err)
	}
	return err
}

func saveUpState(dir string, s upState) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	// It holds the cluster's tokens: a fresh 0600 file, never a
	// leftover one's mode.
	return writeFile0600(filepath.Join(dir, "cluster.json"), append(b, '\n'))
}

func runUp(e *env, fs *pflag.FlagSet) runFunc {
	dir := fs.String("state-dir", "rialto-state", "where the database, tokens, agent state and disk images live")
	port := fs.Int("port", 0, "API port (default: the one used last time, else a free one)")
	agents := fs.Int("agents", 3, "number of agents (nodes)")
	disks := fs.Int("disks", 2, "block devices per node (at most 64)")
	diskSize := sizeString(fs, "disk-size", "1GiB", "size of each block device (sparse files)")
	memSize := sizeString(fs, "memory", "256MiB", "memory budget each node lends (0 for none)")
	slots := fs.Int("accel", 2, "accelerator slots each node lends (0 for none)")
	level := fs.String("log-level", "warn", "debug, info, warn or error (logs go to stderr)")
	var quotaSpecs listFlag
	fs.Var(&quotaSpecs, "quota", "tenant quota [TENANT:]leases=N,bytes=SIZE,slots=N,bandwidth=RATE, as for rialto server (the up cluster's token is tenant admin; repeatable)")
	netnsMode := fs.Bool("netns", false, "run an emulated rack instead: the control plane and each agent as separate processes in their own network namespaces, joined by veth pairs and a bridge (root only; docs/rack.md)")
	linkRate := tcRateString(fs, "link-rate", "with --netns: shape every link with tc tbf to this rate, e.g. 1gbit, 400mbit (bandwidth only: no delay or loss)")
	uplinks := fs.Bool("uplinks", false, "with --netns: give every agent an uplink (wan0) to an outside network that only the agents reach, lent as NIC \"wan\" (docs/nic.md; needs nft)")
	uplinkRate := tcRateString(fs, "uplink-rate", "with --uplinks: shape the uplinks with tc tbf to this rate, e.g. 100mbit; the agents lend them at that rate")
	insecure := insecureDataplaneFlag(fs)
	replicas := fs.Int("replicas", 1, "control-plane replicas; more than 1 runs a throwaway PostgreSQL in the state dir (needs the machine's PostgreSQL) and that many rialto server processes sharing it (docs/operations.md)")
	var tm timings
	tm.register(fs)
	return func(ctx context.Context, _ []string) error {
		if *replicas < 1 || *replicas > 16 {
			return usagef("--replicas must be 1 to 16")
		}
		if *replicas > 1 && *netnsMode {
			return usagef("--replicas does not combine with --netns yet")
		}
		if *linkRate != "" && !*netnsMode {
			return usagef("--link-rate needs --netns")
		}
		if *uplinks && !*netnsMode {
			return usagef("--uplinks needs --netns")
		}
		if *uplinkRate != "" && !*uplinks {
			return usagef("--uplink-rate needs --uplinks")
		}
		quotas, err := parseQuotas(quotaSpecs)
		if err != nil {
			return usageError{err}
		}
		if *agents < 0 || *disks < 0 {
			return usagef("--agents and --disks must not be negative")
		}
		if *disks > maxUpDisks {
			return usagef("--disks: at most %d per node", maxUpDisks)
		}
		if *slots < 0 {
			return usagef("--accel must not be negative (0 for none)")
		}
		if *port < 0 || *port > 65535 {
			return usagef("--port must be 0 to 65535 (0: the one used last time, else a free one)")
		}
		dsize, err := resource.ParseSize(*diskSize)
		if err != nil || dsize < 1<<20 {
			return usagef("bad --disk-size %q (at least 1MiB)", *diskSize)
		}
		var msize int64
		if *memSize != "0" && *memSize != "" {
			if msize, err = resource.ParseSize(*memSize); err != nil {
				return usagef("bad --memory: %w", err)
			}
		}
		log, err := newLogger(e, *level)
		if err != nil {
			return err
		}
		if *insecure {
			fmt.Fprintln(e.stderr, "rialto up: --insecure-dataplane: leases are served without TLS; their credentials and data cross the network in clear")
		}
		if *netnsMode {
			// The processes log to files in the state dir, not this terminal:
			// info unless asked otherwise.
			if !flagSet(fs, "log-level") {
				*level = "info"
			}
			return runUpNetns(ctx, e, upNetns{dir: *dir, port: *port, agents: *agents, disks: *disks, diskSize: dsize,
				memory: msize, slots: *slots, linkRate: *linkRate, uplinks: *uplinks, uplinkRate: *uplinkRate,
				level: *level, quotas: quotaSpecs, tm: tm, log: log, insecureDataplane: *insecure})
		}
		if err := makeStateDir(*dir); err != nil {
			return err
		}
		lock, err := lockStateDir(ctx, *dir)
		if err != nil {
			return err
		}
		// Let go once the reaper of --replicas, which shares it, is
		// dismissed: every return below stops the control plane first.
		defer filelock.Close(lock)
		st, err := loadUpState(*dir)
		if err != nil {
			return err
		}
		if st.BootstrapToken == "" {
			st.BootstrapToken = resource.NewSecret("rbt")
		}
		if st.AdminToken == "" {
			st.AdminToken = resource.NewSecret("rat")
		}
		if st.MetricsToken == "" {
			st.MetricsToken = resource.NewSecret("rat")
		}

		ln, err := listenUp(*port, st.Port, e.stderr)
		if err != nil {
			return err
		}
		st.Port = ln.Addr().(*net.TCPAddr).Port
		if err := saveUpState(*dir, st); err != nil {
			ln.Close()
			return err
		}
		// The cluster CA lives in the state dir; the API is served over HTTPS
		// with a certificate from it.
		ca, tlsCfg, err := apiTLS(upTLSDir(*dir), ln.Addr().String(), ln, nil)
		if err != nil {
			ln.Close()
			return err
		}
		caFile, err := filepath.Abs(ca.CertFile())
		if err != nil {
			ln.Close()
			return err
		}
		var cp interface {
			url() string
			stop() error
			startSweeping(context.Context)
		}
		if *replicas > 1 {
			// The replicas are `rialto server` processes sharing the state
			// dir's CA (replicas.go).
			ln.Close()
			cp, err = startReplicas(ctx, *dir, *replicas, st, caFile, replicaArgs(tm, quotaSpecs, *level, upTLSDir(*dir)), lock)
		} else {
			cp, err = startControlPlane(ctx, ln, filepath.Join(*dir, "rialto.db"), controlplane.Config{
				Logger: log.With("component", "controlplane"), BootstrapToken: st.BootstrapToken,
				Tokens: []controlplane.Token{{Token: st.AdminToken, Tenant: "admin", Admin: true},
					{Token: st.MetricsToken, Tenant: "prometheus"}},
				HeartbeatInterval: tm.heartbeat, SuspectAfter: tm.suspect, DownAfter: tm.down, MaxHeartbeatsPerSecond: tm.maxBeats,
				PrepareTimeout: tm.prepare, DefaultTTL: tm.ttl, Quotas: quotas, CA: ca,
				RetainHistory: defaultRetainHistory, // as `rialto server`'s replicas above
			}, tlsCfg)
		}
		if err != nil {
			ln.Close()
			return err
		}

		// Agents.
		actx, stopAgents := context.WithCancel(ctx)
		var wg sync.WaitGroup
		errs := make(chan error, *agents)
		var started []*agent.Agent
		for i := range *agents {
			name := fmt.Sprintf("node%d", i+1)
			cfg := agent.Config{
				ControlPlane: cp.url(), BootstrapToken: st.BootstrapToken, Name: name,
				StateDir: filepath.Join(*dir, name), Logger: log.With("component", "agent", "node", name),
				Labels: map[string]string{"cluster": "local"}, CAFile: caFile, InsecureDataplane: *insecure,
				// The control plane's /metrics reports this process's runtime
				// (replicas are processes of their own).
				OmitRuntimeMetrics: *replicas <= 1,
			}
			for d := range *disks {
				cfg.Devices = append(cfg.Devices, agent.DeviceConfig{Name: fmt.Sprintf("disk%d", d), Kind: api.KindBlock,
					Path: fmt.Sprintf("disk%d.img", d), Size: dsize, Model: "sparse-file"})
			}
			if msize > 0 {
				cfg.Devices = append(cfg.Devices, agent.DeviceConfig{Name: "mem0", Kind: api.KindMemory, Size: msize})
			}
			if *slots > 0 {
				cfg.Devices = append(cfg.Devices, agent.DeviceConfig{Name: "accel0", Kind: api.KindAccel, Size: int64(*slots)})
			}
			a, err := agent.New(cfg)
			if err != nil {
				stopAgents()
				wg.Wait()
				cp.stop()
				return err
			}
			started = append(started, a)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := a.Run(actx); err != nil {
					errs <- fmt.Errorf("agent %s: %w", name, err)
				}
			}()
		}
		shutdown := func() error {
			stopAgents()
			wg.Wait()
			return cp.stop()
		}
		for _, a := range started {
			select {
			case <-a.Ready():
			case err := <-errs:
				shutdown()
				return err
			case <-ctx.Done():
				return shutdown()
			case <-time.After(30 * time.Second):
				shutdown()
				return fmt.Errorf("agents did not join within 30s")
			}
		}
		// Sweeping starts once every agent has rejoined, so a restart does not
		// take the downtime for node failures.
		cp.startSweeping(ctx)

		where := fmt.Sprintf("a control plane and %s on loopback", agentsText(*agents))
		if *replicas > 1 {
			where = fmt.Sprintf("%d control-plane replicas sharing a PostgreSQL in the state dir, and %s on loopback", *replicas, agentsText(*agents))
		}
		promCfg, err := writePrometheusConfig(*dir, cp.url(), caFile, st.MetricsToken)
		if err != nil {
			shutdown()
			return err
		}
		printProm := func(w io.Writer) {
			fmt.Fprintf(w, "Prometheus: prometheus --config.file=%s\n", promCfg)
			fmt.Fprintln(w, "            (scrapes the control plane and every agent; Grafana dashboard: docs/grafana/rialto.json)")
		}
		if err := printUp(ctx, e, cp.url(), caFile, st, *dir, where, *insecure, printProm); err != nil {
			shutdown()
			return err
		}
		select {
		case <-ctx.Done():
		case err := <-errs:
			shutdown()
			return err
		}
		fmt.Fprintln(e.stderr, "rialto up: stopping")
		return shutdown()
	}
}

// lockStateDir takes an exclusive lock on dir/lock, so that two clusters
// never share a state dir. filelock.Close releases it. If the holder is
// the reaper of a killed `rialto up --replicas` (it says so in the file),
// it waits, up to a minute, for the reaper to stop that run's PostgreSQL;
// any other holder is an error at once.
func lockStateDir(ctx context.Context, dir string) (*os.File, error) {
	p := filepath.Join(dir, "lock")
	deadline := time.Now().Add(time.Minute)
	f, err := filelock.Wait(ctx, p, 50*time.Millisecond, func() bool { return heldByReaper(p) && time.Now().Before(deadline) })
	if errors.Is(err, filelock.ErrLocked) {
		return nil, stateDirInUse(dir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("lock state dir %s: %w", dir, err)
	}
	// A reaper's note is stale once its lock is free.
	_ = f.Truncate(0)
	return f, nil
}

// stateDirInUse is the refusal of a state dir whose lock another
// `rialto up` (or its reaper) holds: err is the lock's refusal, a
// *filelock.HeldError naming the holder when /proc/locks tells it. The
// refused run has changed nothing there.
func stateDirInUse(dir string, err error) error {
	pid := 0
	var held *filelock.HeldError
	if errors.As(err, &held) {
		pid = held.PID
	}
	stop := "Ctrl-C where it runs"
	if pid > 0 && pid != os.Getpid() {
		stop += fmt.Sprintf(", or kill -INT %d", pid)
	}
	return fmt.Errorf("state dir %s is in use by another rialto up%s: stop that one first (%s; its cluster keeps its state), or give this one another --state-dir",
		dir, filelock.HolderNote(pid), stop)
}

// heldByReaper reports whether the lock file at p names a live reaper of
// `rialto up --replicas` (reapReplicas writes "up-replicas-reaper PID").
func heldByReaper(p string) bool {
	b, err := os.ReadFile(p)
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] != replicaReaperArg {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + f[1] + "/cmdline")
	// An exiting process's command line reads empty (its memory is gone)
	// while it still holds its descriptors, the lock among them: the
	// reaper, ending.
	return err == nil && (len(cmdline) == 0 || strings.Contains(string(cmdline), "\x00"+replicaReaperArg+"\x00"))
}

// listenUp binds the API port: the requested one, else the remembered one
// if free, else a free one. A requested port that is taken is an error
// that says so; a remembered one that is taken is said on warn, since the
// RIALTO_ADDR of the shells that talked to the last run no longer reaches
// this one.
func listenUp(port, remembered int, warn io.Writer) (net.Listener, error) {
	if port != 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("--port %d: 127.0.0.1:%d is in use by another program (another rialto up?): choose another --port, or leave --port out for the one this state dir used last time or else a free one", port, port)
		}
		return ln, err
	}
	if remembered != 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(remembered)))
		if err == nil {
			return ln, nil
		}
		ln, err2 := net.Listen("tcp", "127.0.0.1:0")
		if err2 != nil {
			return nil, err2
		}
		why := err.Error()
		var errno syscall.Errno
		if errors.As(err, &errno) {
			why = errno.Error()
		}
		fmt.Fprintf(warn, "rialto up: port %d, which this state dir used last time, is taken (%s): the API is on port %d now, so shells that exported RIALTO_ADDR for the last run need the new export lines below\n",
			remembered, why, ln.Addr().(*net.TCPAddr).Port)
		return ln, nil
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// agentsText is "1 agent" or "N agents", for the banner.
func agentsText(n int) string {
	if n == 1 {
		return "1 agent"
	}
	return fmt.Sprintf("%d agents", n)
}

// upTLSDir is where `rialto up` keeps the cluster CA.
func upTLSDir(stateDir string) string { return filepath.Join(stateDir, "tls") }

// printUp prints the banner: what runs (where), the API, the nodes and
// devices, and how to talk to the cluster; extra, if set, adds a section
// after the devices. It writes the env file. caFile is the cluster's CA
// certificate (absolute), which clients verify the API against.
func printUp(ctx context.Context, e *env, url, caFile string, st upState, dir, where string, insecure bool, extra func(io.Writer)) error {
	token := st.AdminToken
	hc, err := api.HTTPClient(caFile, 30*time.Second)
	if err != nil {
		return err
	}
	// An idle HTTP/2 connection left open would hold the control plane's
	// shutdown (on Ctrl-C) a second, waiting for this client to hang up.
	defer hc.CloseIdleConnections()
	c := api.NewClient(url, token, hc)
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return err
	}
	devs, err := c.Devices(ctx)
	if err != nil {
		return err
	}
	w := e.stdout
	abs, _ := filepath.Abs(dir)
	fmt.Fprintf(w, "Rialto is up: %s.\n\n", where)
	fmt.Fprintf(w, "API:        %s\n", url)
	fmt.Fprintf(w, "CA:         %s\n", caFile)
	if link, err := c.LoginLink(ctx); err == nil {
		fmt.Fprintf(w, "Dashboard:  %s%s\n            (a one-time sign-in link, until %s; `rialto ui` prints a new one)\n",
			c.BaseURL(), link.Path, link.ExpiresAt.Local().Format(time.Kitchen))
	}
	fmt.Fprintf(w, "State dir:  %s\n\n", abs)
	printNodes(w, nodes)
	fmt.Fprintln(w)
	names := map[string]string{}
	for _, n := range nodes {
		names[n.ID] = n.Name
	}
	printDevices(w, devs, names)
	fmt.Fprintln(w)
	if extra != nil {
		extra(w)
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "To talk to this cluster, run in your shell:")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "export RIALTO_ADDR=%s\n", url)
	fmt.Fprintf(w, "export RIALTO_CACERT=%s\n", caFile)
	fmt.Fprintf(w, "export RIALTO_TOKEN=%s\n", token)
	fmt.Fprintln(w)
	envFile := filepath.Join(dir, "env")
	// The env file also carries the bootstrap token, so that agent
	// processes can join this cluster (`rialto agent` reads it).
	envText := fmt.Sprintf("export RIALTO_ADDR=%s\nexport RIALTO_CACERT=%s\nexport RIALTO_TOKEN=%s\nexport RIALTO_BOOTSTRAP_TOKEN=%s\n",
		url, caFile, token, st.BootstrapToken)
	if err := os.WriteFile(envFile, []byte(envText), 0o600); err == nil {
		fmt.Fprintf(w, "(also in %s: `. %s` in another shell)\n", envFile, envFile)
	}
	fmt.Fprintln(w, "then: rialto nodes; rialto lease create --kind block --size 256MiB; Ctrl-C stops the cluster.")
	fmt.Fprintln(w, "block: rialto attach LEASE-ID serves a lease (composed or not) as a local NBD export;")
	fmt.Fprintln(w, "       rialto attach LEASE-ID --fuse DIR as the file DIR/disk, to mkfs and `mount -o loop` (root).")
	if insecure {
		fmt.Fprintln(w, "data planes: plaintext (--insecure-dataplane): lease credentials and data cross the network in clear.")
	} else {
		fmt.Fprintln(w, "data planes: TLS with certificates from the cluster CA (nbds://, rialto-mems://, rialto-accels://, rialto-nics://);")
		fmt.Fprintf(w, "             third-party NBD clients add the CA's directory: nbdinfo 'nbds://…?tls-certificates=%s'\n", filepath.Dir(caFile))
	}
	for _, d := range devs {
		if d.Kind == api.KindAccel {
			fmt.Fprintln(w, "accelerators: rialto lease create --kind accel --mode shared --share 0.25 --role sha256   (note its ID, then)")
			fmt.Fprintln(w, "              rialto accel run LEASE-ID sha256 --data hello --hex")
			break
		}
	}
	if f, ok := w.(*os.File); ok {
		f.Sync()
	}
	return nil
}

// writePrometheusConfig writes dir/prometheus.yml, a Prometheus
// configuration that scrapes the cluster: it finds the control plane and
// every agent through the control plane's GET /v1/metrics-targets (HTTP
// service discovery) with the token it writes to dir/prometheus.token
// (0600), and verifies every target against the cluster CA. It returns
// the configuration's absolute path.
func writePrometheusConfig(dir, url, caFile, token string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	tokFile := filepath.Join(abs, "prometheus.token")
	if err := os.WriteFile(tokFile, []byte(token+"\n"), 0o600); err != nil {
		return "", err
	}
	// url may list several replicas, comma-separated: one discovery each.
	var sd strings.Builder
	for _, u := range strings.Split(url, ",") {
		fmt.Fprintf(&sd, `      - url: %[1]q
        refresh_interval: 30s
        authorization: # type Bearer said: Prometheus 2.42's HTTP discovery sends the bare token otherwise
          type: Bearer
          credentials_file: %[2]q
        tls_config:
          ca_file: %[3]q
`, u+"/v1/metrics-targets", tokFile, caFile)
	}
	cfg := fmt.Sprintf(`# Prometheus configuration for this cluster, written by rialto up
# (docs/operations.md): prometheus --config.file=%[1]s
scrape_configs:
  - job_name: rialto
    scrape_interval: 15s
    # The control plane lists itself and every agent (GET /v1/metrics-targets);
    # each replica lists itself, the agents they list alike are scraped once.
    http_sd_configs:
%[2]s    # /metrics is open; the targets are HTTPS with certificates of the cluster CA.
    tls_config:
      ca_file: %[4]q
`, filepath.Join(abs, "prometheus.yml"), sd.String(), tokFile, caFile)
	p := filepath.Join(abs, "prometheus.yml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		return "", err
	}
	return p, nil
}
