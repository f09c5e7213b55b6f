package slurm_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/uptest"
)

func TestMain(m *testing.M) { uptest.Main(m) }

// cluster is a real Slurm (slurmctld, slurmd, munged) on localhost, in a
// temporary directory, with rialto's prolog, task prolog and epilogs.
type cluster struct {
	t    *testing.T
	dir  string
	conf string
}

// freePorts are n distinct ports nothing listens on, for slurm.conf to
// name before the daemons bind them. They are outside the range the
// kernel hands out to listeners on port 0 and to connections
// (ip_local_port_range): a port of that range, free when chosen, may be
// taken before slurmctld or slurmd binds it by any process's listener or
// connection (other tests', many at once under load), and the daemon
// then exits.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	lo, hi := ephemeralRange(t)
	return freePortsOutside(t, n, lo, hi)
}

// freePortsOutside is freePorts for the ephemeral range lo-hi. A range
// that leaves too few ports outside it (1024-65535) skips the test.
func freePortsOutside(t *testing.T, n, lo, hi int) []int {
	t.Helper()
	from, to, ok := portWindow(lo, hi)
	if !ok {
		t.Skipf("the ephemeral port range %d-%d leaves too few ports outside it for slurm.conf to name", lo, hi)
	}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			t.Fatalf("no %d free ports in [%d, %d)", n, from, to)
		}
		p := from + rand.IntN(to-from)
		// Held until all are chosen, so that they differ.
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			continue
		}
		defer ln.Close()
		ports = append(ports, p)
	}
	return ports
}

// TestFreePortsWideEphemeralRange: an ephemeral range that leaves too
// few ports outside it (ip_local_port_range 1024 65535, as some hosts
// are tuned) skips the real-Slurm test; it panicked (rand.IntN(0)).
func TestFreePortsWideEphemeralRange(t *testing.T) {
	for _, c := range []struct {
		lo, hi, from, to int
		ok               bool
	}{
		{32768, 60999, 20000, 32768, true},
		{20500, 60999, 61000, 65536, true},
		{1024, 65535, 0, 0, false}, // rand.IntN(0) panicked here
		{1024, 65500, 0, 0, false},
	} {
		from, to, ok := portWindow(c.lo, c.hi)
		if ok != c.ok || ok && (from != c.from || to != c.to) {
			t.Errorf("portWindow(%d, %d) = %d, %d, %v; want %d, %d, %v", c.lo, c.hi, from, to, ok, c.from, c.to, c.ok)
		}
	}
}

// portWindow is where ports for slurm.conf are drawn, [from, to), given
// the ephemeral range lo-hi: above the well-known and registered ports
// services commonly use, below the ephemeral range (or above it, if it
// starts low); false when fewer than 100 ports are left.
func portWindow(lo, hi int) (from, to int, ok bool) {
	from, to = 20000, lo
	if to-from < 1000 {
		from, to = hi+1, 65536
	}
	if to-from < 100 {
		return 0, 0, false
	}
	return from, to, true
}

// ephemeralRange is the kernel's ip_local_port_range.
func ephemeralRange(t *testing.T) (lo, hi int) {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skipf("the kernel's ephemeral port range: %v", err)
	}
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		t.Fatalf("ip_local_port_range %q: %v", b, err)
	}
	return lo, hi
}

// TestFreePorts: the ports the real-Slurm test writes into slurm.conf
// are free, distinct and outside the ephemeral range. They were ports a
// listener on port 0 got, closed at once: any listener or connection
// could take one before the daemon bound it (more likely the more other
// tests run), and the two could be the same.
func TestFreePorts(t *testing.T) {
	lo, hi := ephemeralRange(t)
	seen := map[int]bool{}
	for range 50 {
		ps := freePorts(t, 2)
		if ps[0] == ps[1] {
			t.Fatalf("freePorts gave %d twice", ps[0])
		}
		for _, p := range ps {
			if p >= lo && p <= hi {
				t.Fatalf("port %d is in the ephemeral range %d-%d: a listener on port 0 or a connection may take it", p, lo, hi)
			}
			ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
			if err != nil {
				t.Fatalf("port %d is not free: %v", p, err)
			}
			ln.Close()
			seen[p] = true
		}
	}
	if len(seen) < 10 {
		t.Errorf("50 calls gave %d ports: %v", len(seen), seen)
	}
}

// daemon starts a foreground daemon, killed and waited for when the test
// ends (also when it fails).
func daemon(t *testing.T, logFile string, name string, args ...string) {
	t.Helper()
	out, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { cmd.Wait(); close(waited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-waited
		}
		out.Close()
	})
}

func startSlurm(t *testing.T, bin string, up *uptest.Up) *cluster {
	t.Helper()
	for _, tool := range []string{"munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo", "nbdinfo"} {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err := exec.LookPath("/usr/sbin/" + tool); err != nil {
				t.Skipf("%s is not installed (.ci/run installs slurm-wlm, munge, libnbd-bin)", tool)
			}
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("slurmd runs jobs as root here: the test needs root")
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ = strings.Cut(host, ".")
	dir, err := os.MkdirTemp("", "rialto-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	// Jobs of users other than root run the task prolog: the directory
	// and the binary are theirs to reach (the munge key, the env file and
	// the job files are not).
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"slurmctld.log", "slurmd.log"} {
				b, _ := os.ReadFile(filepath.Join(dir, "log", f))
				t.Logf("%s (tail):\n%s", f, tail(b, 3000))
			}
		}
		os.RemoveAll(dir)
	})
	for _, d := range []string{"munge", "state", "spool", "log", "jobs", "out"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "jobs"), 0o711); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, "rialto")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 1024)
	for i := range key {
		key[i] = byte(i*7 + 3)
	}
	if err := os.WriteFile(filepath.Join(dir, "munge", "key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "munge", "sock")
	daemon(t, filepath.Join(dir, "log", "munged.out"), "/usr/sbin/munged", "-F", "-f", "--socket="+sock,
		"--key-file="+filepath.Join(dir, "munge", "key"), "--log-file="+filepath.Join(dir, "log", "munged.log"),
		"--pid-file="+filepath.Join(dir, "munge", "pid"), "--seed-file="+filepath.Join(dir, "munge", "seed"))
	waitFor(t, 10*time.Second, "munged's socket", func() bool { _, err := os.Stat(sock); return err == nil })

	// The glue: env file (root's only) and the scripts slurm.conf names.
	envFile := filepath.Join(dir, "slurm.env")
	if err := os.WriteFile(envFile, []byte("export RIALTO_ADDR="+up.Addr+"\nexport RIALTO_CACERT="+up.CACert+"\nexport RIALTO_TOKEN="+up.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	jobs := filepath.Join(dir, "jobs")
	scripts := map[string]string{
		// A job with a FIFO hold-JOBID holds its prolog until the test
		// writes to it (after touching inprolog-JOBID): a job cancelled
		// while its prolog runs.
		"prolog": fmt.Sprintf("if [ -p %[1]s/hold-$SLURM_JOB_ID ]; then touch %[1]s/inprolog-$SLURM_JOB_ID; read x < %[1]s/hold-$SLURM_JOB_ID; fi\n", dir) +
			fmt.Sprintf("exec %s slurm prolog --env-file %s --state-dir %s", bin, envFile, jobs),
		"task-prolog": fmt.Sprintf("exec %s slurm task-prolog --state-dir %s", bin, jobs),
		"epilog":      fmt.Sprintf("exec %s slurm epilog --env-file %s --state-dir %s", bin, envFile, jobs),
	}
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name+".sh"), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := filepath.Join(dir, "slurm.conf")
	ports := freePorts(t, 2)
	text := fmt.Sprintf(`ClusterName=rialtotest
SlurmctldHost=%[1]s(127.0.0.1)
SlurmctldPort=%[2]d
SlurmdPort=%[3]d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%[4]s
CredType=cred/munge
StateSaveLocation=%[5]s/state
SlurmdSpoolDir=%[5]s/spool
SlurmctldPidFile=%[5]s/slurmctld.pid
SlurmdPidFile=%[5]s/slurmd.pid
SlurmctldLogFile=%[5]s/log/slurmctld.log
SlurmdLogFile=%[5]s/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=2
MinJobAge=600
OverTimeLimit=0
MessageTimeout=5
Prolog=%[5]s/prolog.sh
TaskProlog=%[5]s/task-prolog.sh
Epilog=%[5]s/epilog.sh
EpilogSlurmctld=%[5]s/epilog.sh
PrologFlags=Alloc
NodeName=%[1]s NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
`, host, ports[0], ports[1], sock, dir)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	daemon(t, filepath.Join(dir, "log", "slurmctld.out"), "/usr/sbin/slurmctld", "-D", "-i", "-f", conf)
	daemon(t, filepath.Join(dir, "log", "slurmd.out"), "/usr/sbin/slurmd", "-D", "-f", conf)
	c := &cluster{t: t, dir: dir, conf: conf}
	// Before the daemons stop (cleanups run last first): end every job,
	// so that no job process outlives the test, also when it fails.
	t.Cleanup(func() {
		c.run("scancel", "--partition=debug")
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if out, err := c.run("squeue", "-h", "-t", "PD,R,CG,CF", "-o", "%i"); err != nil || strings.TrimSpace(out) == "" {
				return
			}
			<-time.After(200 * time.Millisecond)
		}
	})
	waitFor(t, 30*time.Second, "the node to be idle", func() bool {
		out, _ := c.run("sinfo", "-h", "-o", "%T")
		return strings.TrimSpace(out) == "idle"
	})
	return c
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		<-tick.C
	}
}

// run runs a Slurm client command against the test's cluster.
func (c *cluster) run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+c.conf)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// submit sbatches script with a comment and extra flags; it returns the
// job ID.
func (c *cluster) submit(comment, script string, extra ...string) string {
	c.t.Helper()
	args := append([]string{"--parsable", "-o", filepath.Join(c.dir, "out", "%j.out"), "--comment", comment}, extra...)
	args = append(args, "--wrap", script)
	out, err := c.run("sbatch", args...)
	if err != nil {
		c.t.Fatalf("sbatch: %v\n%s", err, out)
	}
	return strings.TrimSpace(out)
}

func (c *cluster) state(job string) string {
	out, _ := c.run("scontrol", "show", "job", job)
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "JobState="); ok {
			return v
		}
	}
	return ""
}

func (c *cluster) output(job string) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "out", job+".out"))
	return string(b)
}

// jobLeases are every lease of a job of the test's cluster.
func jobLeases(t *testing.T, cl *api.Client, job string) []api.Lease {
	t.Helper()
	ls, err := cl.AllLeases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []api.Lease
	for _, l := range ls {
		if strings.HasPrefix(l.IdempotencyKey, "slurm-rialtotest-"+job+"-") {
			out = append(out, l)
		}
	}
	return out
}

func allReleased(ls []api.Lease) bool {
	for _, l := range ls {
		if l.State != api.LeaseReleased {
			return false
		}
	}
	return len(ls) > 0
}

// A real Slurm against `rialto up`: jobs get their leases before they
// start, find them in their environment, and give them back when they
// end: after completion, scancel and the time limit. A job whose request
// cannot be placed fails with placement's reason in its output. A retried
// prolog finds the same lease.
func TestRealSlurm(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Slurm and rialto up")
	}
	bin := uptest.Binary(t)
	up := uptest.StartUp(t, bin, filepath.Join(t.TempDir(), "state"))
	c := startSlurm(t, bin, up)
	cl := up.Client(t)

	// The time limit takes longest (Slurm counts limits in minutes and
	// checks them every half minute or so): submit that job first.
	timeout := c.submit("rialto: block 32MiB", `echo lease=$RIALTO_LEASE_ID; sleep 600`, "--time=1")
	done := c.submit("rialto: block 96MiB composed 3",
		`echo lease=$RIALTO_LEASE_ID mode=$RIALTO_LEASE_0_MODE; for u in $RIALTO_LEASE_PART_URIS; do echo part=$(nbdinfo --size "$u"); done`)
	cancel := c.submit("rialto: memory 8MiB; block 16MiB", `echo leases=$RIALTO_LEASES; sleep 600`)
	refused := c.submit("rialto: block 100GiB composed 3", `echo should not run`)
	plain := c.submit("", `echo no devices: [$RIALTO_LEASES]`)

	// Completion: the composed lease was there, nbdinfo read each part,
	// and the lease is released.
	waitFor(t, 60*time.Second, "job "+done+" to complete", func() bool { return c.state(done) == "COMPLETED" })
	out := c.output(done)
	ls := jobLeases(t, cl, done)
	if len(ls) != 1 || ls[0].Mode != api.ModeComposed || len(ls[0].Parts) != 3 {
		t.Fatalf("job %s's leases: %+v\noutput:\n%s", done, ls, out)
	}
	if !strings.Contains(out, "lease="+ls[0].ID+" mode=composed") || strings.Count(out, "part=33554432") != 3 {
		t.Fatalf("job %s's output:\n%s", done, out)
	}
	waitFor(t, 30*time.Second, "job "+done+"'s lease to be released", func() bool { return allReleased(jobLeases(t, cl, done)) })

	// A request that cannot be placed fails the job, with the reason.
	waitFor(t, 60*time.Second, "job "+refused+" to fail", func() bool { return c.state(refused) == "FAILED" })
	out = c.output(refused)
	if !strings.Contains(out, "could not be placed") || !strings.Contains(out, "infeasible") || strings.Contains(out, "should not run") {
		t.Fatalf("refused job %s's output:\n%s", refused, out)
	}
	if ls := jobLeases(t, cl, refused); len(ls) != 0 {
		t.Fatalf("refused job %s holds leases %+v", refused, ls)
	}
	waitFor(t, 30*time.Second, "job "+plain+" to complete", func() bool { return c.state(plain) == "COMPLETED" })
	if out := c.output(plain); !strings.Contains(out, "no devices: []") {
		t.Errorf("job without a request: %q", out)
	}

	// scancel: two leases, both released. First, a retried prolog (same
	// job, same environment) finds the same leases and makes none.
	waitFor(t, 60*time.Second, "job "+cancel+" to run with its leases", func() bool {
		return c.state(cancel) == "RUNNING" && strings.Contains(c.output(cancel), "leases=")
	})
	before := jobLeases(t, cl, cancel)
	if len(before) != 2 {
		t.Fatalf("job %s's leases: %+v", cancel, before)
	}
	prolog := exec.Command(filepath.Join(c.dir, "prolog.sh"))
	prolog.Env = append(os.Environ(), "SLURM_CLUSTER_NAME=rialtotest", "SLURM_JOB_ID="+cancel, "SLURM_JOB_RESTART_COUNT=0", "SLURM_JOB_UID=0",
		"SLURM_JOB_COMMENT=rialto: memory 8MiB; block 16MiB")
	if out, err := prolog.CombinedOutput(); err != nil {
		t.Fatalf("prolog again: %v\n%s", err, out)
	}
	if after := jobLeases(t, cl, cancel); len(after) != 2 || after[0].ID != before[0].ID || after[1].ID != before[1].ID {
		t.Fatalf("a retried prolog changed the leases: %+v → %+v", before, after)
	}
	if out, err := c.run("scancel", cancel); err != nil {
		t.Fatalf("scancel: %v %s", err, out)
	}
	waitFor(t, 30*time.Second, "job "+cancel+"'s leases to be released after scancel", func() bool { return allReleased(jobLeases(t, cl, cancel)) })

	// A job of another user than root: its job file is its user's, the
	// task prolog (run as that user) reads it.
	userOut, err := os.MkdirTemp("", "rialto-slurm-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(userOut)
	if err := os.Chmod(userOut, 0o777); err != nil {
		t.Fatal(err)
	}
	nobody := c.submit("rialto: block 8MiB", `echo lease=$RIALTO_LEASE_ID uid=$(id -u); stat -c '%u %a' `+filepath.Join(c.dir, "jobs")+`/rialtotest-$SLURM_JOB_ID.env`,
		"--uid=nobody", "-o", filepath.Join(userOut, "%j.out"), "-D", userOut)
	waitFor(t, 60*time.Second, "nobody's job "+nobody+" to end", func() bool { s := c.state(nobody); return s == "COMPLETED" || s == "FAILED" })
	nout, _ := os.ReadFile(filepath.Join(userOut, nobody+".out"))
	nls := jobLeases(t, cl, nobody)
	if c.state(nobody) != "COMPLETED" || len(nls) != 1 || !strings.Contains(string(nout), "lease="+nls[0].ID+" uid=65534") ||
		!strings.Contains(string(nout), "65534 600") {
		t.Errorf("nobody's job %s: %s, leases %+v, output:\n%s", nobody, c.state(nobody), nls, nout)
	}
	waitFor(t, 30*time.Second, "nobody's job "+nobody+"'s lease to be released", func() bool { return allReleased(jobLeases(t, cl, nobody)) })

	// A job cancelled while its prolog runs: the prolog makes the lease
	// after EpilogSlurmctld ran; the node's epilog releases it.
	held := c.submit("rialto: block 8MiB", `echo should not run`, "--hold")
	fifo := filepath.Join(c.dir, "hold-"+held)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := c.run("scontrol", "release", held); err != nil {
		t.Fatalf("scontrol release: %v %s", err, out)
	}
	waitFor(t, 60*time.Second, "job "+held+"'s prolog to start", func() bool {
		_, err := os.Stat(filepath.Join(c.dir, "inprolog-"+held))
		return err == nil
	})
	if out, err := c.run("scancel", held); err != nil {
		t.Fatalf("scancel: %v %s", err, out)
	}
	if err := os.WriteFile(fifo, []byte("go\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "job "+held+" to be cancelled", func() bool { return strings.HasPrefix(c.state(held), "CANCELLED") })
	waitFor(t, 60*time.Second, "job "+held+"'s lease, made after it was cancelled, to be released", func() bool {
		return allReleased(jobLeases(t, cl, held))
	})

	// The time limit.
	waitFor(t, 150*time.Second, "job "+timeout+" to time out", func() bool { return c.state(timeout) == "TIMEOUT" })
	waitFor(t, 30*time.Second, "job "+timeout+"'s lease to be released after its time limit", func() bool { return allReleased(jobLeases(t, cl, timeout)) })
	if ls := jobLeases(t, cl, timeout); !strings.Contains(c.output(timeout), "lease="+ls[0].ID) {
		t.Errorf("timed-out job's output: %q", c.output(timeout))
	}
	// No epilog failed: a failing Epilog drains the node (the Epilog and
	// EpilogSlurmctld, racing to release, did).
	if out, _ := c.run("sinfo", "-h", "-o", "%T %E"); strings.Contains(out, "drain") {
		t.Errorf("the node was drained: %s", out)
	}
}
