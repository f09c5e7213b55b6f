package rack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/sharertest"
	"golang.org/x/sys/unix"
)

// bin is the rialto binary, built once by TestMain when a rack can run here.
var (
	bin      string
	buildErr error
)

func TestMain(m *testing.M) {
	var dir string
	if Available() == nil {
		dir, bin, buildErr = build()
	}
	code := m.Run()
	if dir != "" {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

func build() (dir, bin string, err error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", "", nil // needRack skips
	}
	if dir, err = os.MkdirTemp("", "rialto-rack-bin-"); err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "rialto")
	out, err := exec.Command(gobin, "build", "-o", bin, "../../cmd/rialto").CombinedOutput()
	if err != nil {
		return dir, "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return dir, bin, nil
}

// needRack skips without root, ip/tc or the go tool, and returns the binary.
func needRack(t *testing.T) string {
	t.Helper()
	if err := Available(); err != nil {
		t.Skip(err)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	if bin == "" {
		t.Skip("no go tool to build the rialto binary")
	}
	return bin
}

// startRack starts a rack and closes it at the end of the test, checking
// that nothing of it is left.
func startRack(t *testing.T, cfg Config) *Rack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		id := r.Lab().ID()
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		assertGone(t, id)
	})
	return r
}

// assertGone checks that no namespace or link of lab id is left.
func assertGone(t *testing.T, id string) {
	t.Helper()
	nss, links, err := netns.Leftovers(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if len(nss)+len(links) > 0 {
		t.Errorf("left behind: namespaces %v, links %v", nss, links)
	}
}

// waitFor polls cond until it holds or within has passed.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		<-tick.C
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no binary", Config{StateDir: "x"}},
		{"no state dir", Config{Binary: "rialto"}},
		{"negative agents", Config{Binary: "rialto", StateDir: "x", Agents: -1}},
		{"too many agents", Config{Binary: "rialto", StateDir: "x", Agents: MaxAgents + 1}},
		{"negative disks", Config{Binary: "rialto", StateDir: "x", Disks: -1}},
		{"bad rate", Config{Binary: "rialto", StateDir: "x", Agents: 1, LinkRate: "fast"}},
		{"bad agent rate", Config{Binary: "rialto", StateDir: "x", Agents: 1, AgentRates: []string{"1 gbit"}}},
		{"more rates than agents", Config{Binary: "rialto", StateDir: "x", Agents: 1, AgentRates: []string{"1gbit", "1gbit"}}},
		{"bad port", Config{Binary: "rialto", StateDir: "x", APIPort: 70000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Start(context.Background(), tc.cfg); !errors.Is(err, ErrBadConfig) {
				t.Fatalf("Start = %v, want ErrBadConfig", err)
			}
		})
	}
}

// nodesByName lists the control plane's nodes.
func nodesByName(t *testing.T, ctx context.Context, c *api.Client) map[string]api.Node {
	t.Helper()
	ns, err := c.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]api.Node{}
	for _, n := range ns {
		m[n.Name] = n
	}
	return m
}

// TestRack is the rack end to end: three agents in their own namespaces
// on shaped links come up ready; each process runs in its namespace with
// its secrets in the environment, not argv; a block lease created through
// the API is written and read back by nbdcopy from the root namespace and
// its bytes show in the lender's link counters; SIGKILLing the lender's
// process makes its node suspect, then down, and the lease lost; the
// restarted agent is the same node, ready again; a process dying on its
// own is reported; Close leaves nothing behind.
func TestRack(t *testing.T) {
	bin := needRack(t)
	for _, tool := range []string{"nbdcopy", "nbdinfo"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	dir := t.TempDir()
	r := startRack(t, Config{Binary: bin, StateDir: dir, Agents: 3, Disks: 1, DiskSize: 64 << 20,
		Memory: 16 << 20, AccelSlots: 1, LinkRate: "1gbit", AgentRates: []string{"", "", "500mbit"},
		Heartbeat: 200 * time.Millisecond, SuspectAfter: time.Second, DownAfter: 3 * time.Second, LogLevel: "debug"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := r.Client()

	// Layout and addresses.
	u, err := url.Parse(r.URL())
	if err != nil || u.Hostname() != r.ControlPlane().Addr.String() || u.Port() != "7070" {
		t.Fatalf("URL %s, control plane at %v", r.URL(), r.ControlPlane().Addr)
	}
	if got := r.Env(); len(got) != 3 || got[0] != "RIALTO_ADDR="+r.URL() || got[1] != "RIALTO_CACERT="+r.CACert() ||
		got[2] != "RIALTO_TOKEN="+r.AdminToken() {
		t.Errorf("Env = %v", got)
	}
	if u.Scheme != "https" || filepath.Dir(r.CACert()) != filepath.Join(r.StateDir(), "tls") {
		t.Errorf("API %s, CA certificate %s: want HTTPS with the CA in the state dir", r.URL(), r.CACert())
	}
	nodes := nodesByName(t, ctx, c)
	if len(nodes) != 3 {
		t.Fatalf("%d nodes: %v", len(nodes), nodes)
	}
	seen := map[netip.Addr]bool{r.ControlPlane().Addr: true, r.Gateway(): true}
	for i, a := range r.Agents() {
		n := nodes[a.Name]
		if a.Name != fmt.Sprintf("node%d", i+1) || n.State != api.NodeReady || n.Address != a.Addr.String() {
			t.Errorf("agent %d: %+v, node %+v", i, a, n)
		}
		if seen[a.Addr] || !r.Prefix().Contains(a.Addr) {
			t.Errorf("agent %s address %v reused or outside %v", a.Name, a.Addr, r.Prefix())
		}
		seen[a.Addr] = true
		if a.StateDir != filepath.Join(dir, a.Name) {
			t.Errorf("agent %s state dir %s", a.Name, a.StateDir)
		}
	}
	devs, err := c.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[api.Kind]int{}
	for _, d := range devs {
		kinds[d.Kind]++
	}
	if kinds[api.KindBlock] != 3 || kinds[api.KindMemory] != 3 || kinds[api.KindAccel] != 3 {
		t.Errorf("devices by kind: %v", kinds)
	}

	// Each process in its own namespace, secrets only in its environment.
	for _, n := range append([]Node{r.ControlPlane()}, r.Agents()...) {
		pid := r.Pid(n)
		if pid == 0 {
			t.Fatalf("%s: no process", n.Name)
		}
		out, err := exec.Command("ip", "netns", "identify", fmt.Sprint(pid)).Output()
		if err != nil || strings.TrimSpace(string(out)) != n.Namespace {
			t.Errorf("%s (pid %d) runs in namespace %q, want %s (%v)", n.Name, pid, out, n.Namespace, err)
		}
		argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			t.Fatal(err)
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(argv, []byte(r.BootstrapToken())) || bytes.Contains(argv, []byte(r.AdminToken())) {
			t.Errorf("%s: a token is on the command line: %q", n.Name, argv)
		}
		if !bytes.Contains(environ, []byte("RIALTO_BOOTSTRAP_TOKEN="+r.BootstrapToken())) {
			t.Errorf("%s: bootstrap token not in the environment", n.Name)
		}
	}

	// Every link shaped, node3's at its own rate, both ends.
	for _, n := range append([]Node{r.ControlPlane()}, r.Agents()...) {
		want := map[string]string{"node3": "500Mbit"}[n.Name]
		if want == "" {
			want = "1Gbit"
		}
		out, err := exec.Command("tc", "qdisc", "show", "dev", n.RootIface).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "tbf") || !strings.Contains(string(out), "rate "+want) {
			t.Errorf("%s root end: %v: %s", n.Name, err, out)
		}
		out, err = r.Command(ctx, n, "tc", "qdisc", "show", "dev", n.Iface).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "rate "+want) {
			t.Errorf("%s inside: %v: %s", n.Name, err, out)
		}
	}

	// A block lease, written and read back by nbdcopy from the root
	// namespace through the lender's link.
	l, err := c.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	lender := -1
	for i, a := range r.Agents() {
		if nodes[a.Name].ID == l.NodeID {
			lender = i
		}
	}
	if lender < 0 || !strings.Contains(l.URI, r.Agent(lender).Addr.String()) {
		t.Fatalf("lease on %s at %s; agents %v", l.NodeID, l.URI, r.Agents())
	}
	if !strings.HasPrefix(l.URI, "nbds://") {
		t.Fatalf("the rack's block lease is not nbds://: %s", strings.SplitN(l.URI, "/", 4)[2])
	}
	out, err := exec.CommandContext(ctx, "nbdinfo", "--json", r.LibnbdURI(l.URI)).Output()
	if err != nil {
		t.Fatalf("nbdinfo: %v", err)
	}
	var info struct {
		Exports []struct {
			Size int64 `json:"export-size"`
		} `json:"exports"`
	}
	if err := json.Unmarshal(out, &info); err != nil || len(info.Exports) != 1 || info.Exports[0].Size != 16<<20 {
		t.Fatalf("nbdinfo: %v %s", err, out)
	}
	data := make([]byte, 16<<20)
	rand.NewChaCha8([32]byte{5}).Read(data)
	src, dst := filepath.Join(t.TempDir(), "src"), filepath.Join(t.TempDir(), "dst")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := r.Counters(r.Agent(lender))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, "nbdcopy", src, r.LibnbdURI(l.URI)).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy in: %v\n%s", err, out)
	}
	if out, err := exec.CommandContext(ctx, "nbdcopy", r.LibnbdURI(l.URI), dst).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy out: %v\n%s", err, out)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sha256.Sum256(data) {
		t.Fatal("the lease did not give back what nbdcopy wrote")
	}
	after, err := r.Counters(r.Agent(lender))
	if err != nil {
		t.Fatal(err)
	}
	if d := after.ToHost - before.ToHost; d < 16<<20 {
		t.Errorf("lender's link carried %d bytes to it for 16 MiB written", d)
	}
	if d := after.FromHost - before.FromHost; d < 16<<20 {
		t.Errorf("lender's link carried %d bytes from it for 16 MiB read", d)
	}

	// The lender crashes: suspect, then down, and the lease is lost.
	if err := r.KillAgent(lender); err != nil {
		t.Fatal(err)
	}
	if r.Pid(r.Agent(lender)) != 0 {
		t.Fatal("killed agent still has a pid")
	}
	if err := r.KillAgent(lender); !errors.Is(err, ErrNotRunning) {
		t.Errorf("killing a dead agent: %v", err)
	}
	name := r.Agent(lender).Name
	waitFor(t, "node down", 30*time.Second, func() bool { return nodesByName(t, ctx, c)[name].State == api.NodeDown })
	// The audit log has it suspect first, then down (polling the state
	// could miss the suspect window on a loaded machine; the log cannot).
	evs, err := c.Events(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var seq []string
	for _, e := range evs {
		if e.Subject == l.NodeID && (e.Type == "node.suspect" || e.Type == "node.down") {
			seq = append(seq, e.Type)
		}
	}
	if len(seq) != 2 || seq[0] != "node.suspect" || seq[1] != "node.down" {
		t.Errorf("node's events %v, want node.suspect then node.down", seq)
	}
	waitFor(t, "lease lost", 30*time.Second, func() bool {
		got, err := c.Lease(ctx, l.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.State == api.LeaseLost
	})

	// Restarted on its state dir it is the same node, ready, and no
	// longer serves the lost lease.
	if err := r.StartAgent(ctx, lender); err != nil {
		t.Fatal(err)
	}
	if err := r.StartAgent(ctx, lender); !errors.Is(err, ErrRunning) {
		t.Errorf("starting a running agent: %v", err)
	}
	n := nodesByName(t, ctx, c)[name]
	if n.ID != l.NodeID || n.State != api.NodeReady {
		t.Fatalf("restarted agent: %+v (was node %s)", n, l.NodeID)
	}
	waitFor(t, "stale export gone", 30*time.Second, func() bool {
		return exec.CommandContext(ctx, "nbdinfo", r.LibnbdURI(l.URI)).Run() != nil
	})

	// A process that dies without the rack asking is reported; the
	// killed one above was not.
	victim := r.Agent((lender + 1) % 3)
	if err := syscall.Kill(r.Pid(victim), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-r.Exits():
		if e.Node != victim.Name || e.Err == nil {
			t.Errorf("exit report %+v, want %s killed", e, victim.Name)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit report for a process killed behind the rack's back")
	}
	select {
	case e := <-r.Exits():
		t.Errorf("unexpected second exit report %+v", e)
	default:
	}
}

// TestStartRemovesLeftovers: a lab recorded in the state dir by a run whose
// process and reaper both died is removed, with the process inside it, by
// the next Start, which gets the same subnet; a second rack on the same
// state dir is refused; Close clears the record and the lock, though a
// child process shares the lock's descriptor.
func TestStartRemovesLeftovers(t *testing.T) {
	bin := needRack(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	id, err := netns.NewID()
	if err != nil {
		t.Fatal(err)
	}
	old, err := netns.New(ctx, netns.Config{Hosts: 2, ID: id, Prefix: "rialto-rack"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if nss, _, _ := netns.Leftovers(context.Background(), id); len(nss) > 0 {
			old.Close()
		}
	}()
	sleeper := old.Command(context.Background(), 1, "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	slept := make(chan error, 1)
	go func() { slept <- sleeper.Wait() }()
	if err := writeRecord(dir, record{Lab: id, Subnet: old.Prefix().String(), PID: 1 << 22, Reaper: 1 << 22}); err != nil {
		t.Fatal(err)
	}

	r := startRack(t, Config{Binary: bin, StateDir: dir, Agents: 1})
	assertGone(t, id)
	select {
	case <-slept:
	case <-time.After(10 * time.Second):
		sleeper.Process.Kill()
		t.Fatal("a process in the leftover lab survived")
	}
	if r.Prefix() != old.Prefix() {
		t.Errorf("subnet %v, the state dir's last was %v", r.Prefix(), old.Prefix())
	}
	rec, err := readRecord(dir)
	if err != nil || rec.Lab != r.Lab().ID() || rec.PID != os.Getpid() || !isReaper(rec.Reaper) {
		t.Errorf("record %+v (%v), want lab %s, this pid and a live reaper", rec, err, r.Lab().ID())
	}

	if _, err := Start(ctx, Config{Binary: bin, StateDir: dir}); !errors.Is(err, ErrInUse) {
		t.Errorf("second rack on the state dir: %v", err)
	}
	// A child process shares the lock's descriptor, as one that any
	// goroutine forks does until its exec: Close lets go of the lock all
	// the same (closing the file alone left it with the child).
	sharertest.Share(t, r.lock)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if rec, err := readRecord(dir); err != nil || rec.Lab != "" || rec.Subnet != r.Prefix().String() {
		t.Errorf("record after Close: %+v %v", rec, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("state dir still locked after Close: %v", err)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	// The cleanup registered by startRack closes r again: harmless.
}

// TestReaper runs the reaper process on a lab: dismissed with "done" it
// leaves the lab alone; when its pipe closes without it, it removes the lab,
// kills the process inside, and clears the record.
func TestReaper(t *testing.T) {
	bin := needRack(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o700); err != nil {
		t.Fatal(err)
	}
	lock, err := lockStateDir(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	lab, err := netns.New(ctx, netns.Config{Hosts: 1, Prefix: "rialto-rack"})
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	id := lab.ID()

	rp, err := startReaper(bin, dir, lock, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	if err := rp.watch(id); err != nil {
		t.Fatal(err)
	}
	if err := rp.dismiss(true); err != nil {
		t.Fatal(err)
	}
	if nss, _, _ := netns.Leftovers(ctx, id); len(nss) != 1 {
		t.Fatalf("a dismissed reaper touched the lab: %v", nss)
	}

	sleeper := lab.Command(context.Background(), 0, "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	slept := make(chan error, 1)
	go func() { slept <- sleeper.Wait() }()
	if err := writeRecord(dir, record{Lab: id, Subnet: lab.Prefix().String(), PID: os.Getpid()}); err != nil {
		t.Fatal(err)
	}
	rp, err = startReaper(bin, dir, lock, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	if err := rp.watch(id); err != nil {
		t.Fatal(err)
	}
	// The reaper holds the state dir's lock too.
	lock.Close()
	if _, err := lockStateDir(ctx, dir); !errors.Is(err, ErrInUse) {
		t.Errorf("state dir lockable while the reaper holds it: %v", err)
	}
	rp.in.Close() // as if this process had died
	waitFor(t, "the reaper to remove the lab", 30*time.Second, func() bool {
		nss, links, err := netns.Leftovers(ctx, id)
		return err == nil && len(nss)+len(links) == 0
	})
	select {
	case <-slept:
	case <-time.After(10 * time.Second):
		sleeper.Process.Kill()
		t.Fatal("a process in the reaped lab survived")
	}
	<-rp.done
	if rec, err := readRecord(dir); err != nil || rec.Lab != "" {
		t.Errorf("record after reaping: %+v %v", rec, err)
	}
	l2, err := lockStateDir(ctx, dir)
	if err != nil {
		t.Fatalf("state dir after the reaper exited: %v", err)
	}
	l2.Close()
	if b, _ := os.ReadFile(filepath.Join(dir, "logs", "reaper.log")); !bytes.Contains(b, []byte(id)) {
		t.Errorf("reaper log does not name the lab:\n%s", b)
	}
}
