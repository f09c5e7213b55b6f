// Command pgbench is the database benchmark of bench/pgbench/run.sh:
// PostgreSQL on ext4 on a loop device on a FUSE file, pgbench's TPC-B-like
// load, on nbdkit (file plugin, through nbdfuse) and on Rialto through
// leases of `rialto agent` processes: a dedicated lease through nbdfuse, a
// dedicated and a 3-way composed lease through `rialto attach --fuse`, and
// (extra rows) nbdfuse in front of `rialto attach`. Runs are interleaved (every target once per repetition,
// in rotating order); every run mounts the file system afresh, starts
// PostgreSQL, runs `pgbench -i` and then the timed run, and takes it all
// down again, so each starts with cold caches. Needs root (mount, loop
// devices, FUSE) and runs PostgreSQL as the postgres user.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/bench/internal/lab"
	"github.com/rialto-project/rialto/bench/internal/stats"
	"github.com/rialto-project/rialto/bench/internal/targets"
)

func main() {
	stats.Commit(".") // the tree measured, before it can change: the report names it
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench/pgbench:", err)
		os.Exit(1)
	}
}

type bench struct {
	work    string
	pgbin   string
	scale   int
	clients int
	secs    int
	port    int
	sock    string
	seq     int
}

type result struct {
	target    string
	rep       int
	tps       float64
	latMs     float64
	initSecs  float64
	steal     float64
	serverCPU float64
	fuseCPU   float64 // nbdfuse's CPU during the timed run (NaN: the server serves FUSE itself)
	load      float64
	err       error
}

// goals: the ratio of each Rialto target's median TPS to nbdkit's that the
// issue asks for.
var goals = map[string]float64{"dedicated": 1.0, "attach-fuse": 0.9, "composed-fuse": 0.9}

func run() error {
	reps := flag.Int("reps", 5, "repetitions")
	sizeMiB := flag.Int64("size-mib", 900, "size of every export (MiB; a multiple of 3)")
	scale := flag.Int("scale", 10, "pgbench -s")
	clients := flag.Int("clients", 4, "pgbench -c")
	secs := flag.Int("time", 15, "pgbench -T (seconds)")
	bin := flag.String("bin", "bin/rialto", "the rialto binary")
	targetsFlag := flag.String("targets", "nbdkit,nbdkit-proxy,dedicated,attach-fuse,composed-fuse,attach,composed", "targets: nbdkit, nbdkit-proxy (nbdkit's nbd plugin in front of its file plugin: a reference row, no goal), dedicated, attach-fuse, composed-fuse (through `rialto attach --fuse`), attach, composed (nbdfuse in front of `rialto attach`), attach-unix, composed-unix (the same through `rialto attach --socket`)")
	out := flag.String("out", "docs/bench/pgbench.md", "Markdown fragment to write")
	workRoot := flag.String("work", "/dev/shm", "tmpfs directory for the images")
	pgbin := flag.String("pgbin", "/usr/lib/postgresql/15/bin", "PostgreSQL's bin directory")
	flag.Parse()
	if os.Geteuid() != 0 {
		return errors.New("needs root (mount, loop devices, FUSE)")
	}
	for _, tool := range []string{"nbdkit", "nbdfuse", "nbdinfo", "fusermount3", "mkfs.ext4", "mount", "umount", "runuser",
		filepath.Join(*pgbin, "pgbench"), filepath.Join(*pgbin, "initdb"), filepath.Join(*pgbin, "pg_ctl")} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not installed", tool)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rialtoBin, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp(*workRoot, "rialto-bench-pg.")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o755); err != nil { // postgres walks into it
		return err
	}
	b := &bench{work: work, pgbin: *pgbin, scale: *scale, clients: *clients, secs: *secs,
		sock: filepath.Join(work, "sock")}
	if err := os.Mkdir(b.sock, 0o755); err != nil {
		return err
	}
	if err := chownPostgres(b.sock); err != nil {
		return err
	}
	b.port = pgPort()

	names := split(*targetsFlag)
	var all []*targets.Target
	for _, peer := range []string{"nbdkit", "nbdkit-proxy"} {
		if !slices.Contains(names, peer) {
			continue
		}
		img := filepath.Join(work, peer+".img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			return err
		}
		if err := os.Truncate(img, *sizeMiB<<20); err != nil {
			return err
		}
		t, stopPeer, err := targets.StartPeer(ctx, peer, work, img)
		if err != nil {
			return err
		}
		defer stopPeer()
		all = append(all, t)
	}
	c, err := lab.Start(ctx, lab.Config{Bin: rialtoBin, Dir: filepath.Join(work, "lab"), Progress: os.Stderr})
	if err != nil {
		return err
	}
	defer c.Close()
	var rnames []string
	for _, n := range names {
		if n != "nbdkit" && n != "nbdkit-proxy" {
			rnames = append(rnames, n)
		}
	}
	ls, err := targets.StartRialto(ctx, c, work, *sizeMiB, rnames)
	if err != nil {
		return err
	}
	for _, n := range rnames {
		all = append(all, ls.Targets[n])
	}
	defer b.cleanupMounts()

	// One file system and one database cluster per export; the attach
	// target reaches the dedicated lease's.
	made := map[string]bool{}
	for _, t := range all {
		fs := fsOf(t.Name)
		if made[fs] {
			continue
		}
		fmt.Fprintf(os.Stderr, "mkfs and initdb on %s\n", t.Name)
		if err := b.prepare(ctx, t); err != nil {
			return fmt.Errorf("prepare %s: %w", t.Name, err)
		}
		made[fs] = true
	}

	loadStart := stats.Load()
	var res []result
	for rep := 1; rep <= *reps; rep++ {
		k := (rep - 1) % len(all)
		for _, t := range append(slices.Clone(all[k:]), all[:k]...) {
			if err := ctx.Err(); err != nil {
				return err
			}
			r := b.measure(ctx, t, rep)
			res = append(res, r)
			if r.err != nil {
				fmt.Fprintf(os.Stderr, "rep %d %-10s ERROR %v\n", rep, t.Name, r.err)
			} else {
				fmt.Fprintf(os.Stderr, "rep %d %-10s %7.0f TPS (latency %.2f ms, init %.1f s, steal %.1f%%, server CPU %.2f s)\n",
					rep, t.Name, r.tps, r.latMs, r.initSecs, r.steal, r.serverCPU)
			}
		}
	}
	text := report(b, all, res, c.Commands, *reps, *sizeMiB, loadStart)
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	fmt.Fprint(os.Stderr, text)
	return os.WriteFile(*out, []byte(text), 0o644)
}

func fsOf(name string) string {
	if name == "attach" {
		return "dedicated"
	}
	return name
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// pgPort is PostgreSQL's port: it listens only on its Unix socket, in a
// directory of its own, where the port only names the socket file.
func pgPort() int { return 5432 }

func chownPostgres(path string) error {
	out, err := exec.Command("chown", "postgres:postgres", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("chown: %w: %s", err, out)
	}
	return nil
}

// sh runs a command, returning its output and an error that carries it.
func (b *bench) sh(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// pg runs a PostgreSQL program as the postgres user.
func (b *bench) pg(ctx context.Context, prog string, args ...string) (string, error) {
	return b.sh(ctx, "runuser", append([]string{"-u", "postgres", "--", filepath.Join(b.pgbin, prog)}, args...)...)
}

// mount is one target's file system in use: nbdfuse, the loop mount.
type mount struct {
	dir, fuseDir, mnt string
	fuse              *exec.Cmd
	fuseDone          chan struct{}
}

// mountTarget runs nbdfuse on t's URI and mounts the file it exposes
// through a loop device (mkfs first if fresh).
func (b *bench) mountTarget(ctx context.Context, t *targets.Target, mkfs bool) (*mount, error) {
	b.seq++ // a fresh directory per mount: a stale one cannot get in the way
	m := &mount{dir: filepath.Join(b.work, fmt.Sprintf("fs-%s-%d", t.Name, b.seq))}
	m.fuseDir, m.mnt = filepath.Join(m.dir, "fuse"), filepath.Join(m.dir, "mnt")
	for _, d := range []string{m.fuseDir, m.mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	disk := filepath.Join(m.fuseDir, "disk")
	if t.File != "" {
		// `rialto attach --fuse` serves the file itself.
		disk = t.File
	} else if err := m.startNBDFuse(t); err != nil {
		return nil, err
	}
	if mkfs {
		if _, err := b.sh(ctx, "mkfs.ext4", "-q", "-F", disk); err != nil {
			m.unmount()
			return nil, err
		}
	}
	if _, err := b.sh(ctx, "mount", "-o", "loop", disk, m.mnt); err != nil {
		m.unmount()
		return nil, err
	}
	return m, nil
}

// unmount undoes mountTarget, whatever state it reached. A busy mount
// (the loop device still detaching) is retried for a while.
func (m *mount) unmount() {
	retry := func(name string, args ...string) {
		deadline := time.Now().Add(15 * time.Second)
		for {
			out, err := exec.Command(name, args...).CombinedOutput()
			if err == nil || strings.Contains(string(out), "not mounted") || strings.Contains(string(out), "not found in /etc/mtab") {
				return
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "%s %s: %v: %s\n", name, strings.Join(args, " "), err, out)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	retry("umount", m.mnt)
	if m.fuse != nil {
		retry("fusermount3", "-u", m.fuseDir)
		select {
		case <-m.fuseDone:
		case <-time.After(10 * time.Second):
			m.fuse.Process.Kill()
			<-m.fuseDone
		}
	}
	// Whatever is still mounted (a busy loop device) goes lazily.
	exec.Command("umount", "-l", m.mnt).Run()
	if m.fuse != nil {
		exec.Command("fusermount3", "-u", "-z", m.fuseDir).Run()
	}
}

// startNBDFuse runs nbdfuse on t's URI, exposing m.fuseDir/disk.
func (m *mount) startNBDFuse(t *targets.Target) error {
	pidf := filepath.Join(m.dir, "nbdfuse.pid")
	os.Remove(pidf)
	m.fuse = exec.Command("nbdfuse", "-P", pidf, filepath.Join(m.fuseDir, "disk"), t.URI)
	log, err := os.Create(filepath.Join(m.dir, "nbdfuse.log"))
	if err != nil {
		return err
	}
	m.fuse.Stdout, m.fuse.Stderr = log, log
	if err := m.fuse.Start(); err != nil {
		log.Close()
		return err
	}
	m.fuseDone = make(chan struct{})
	go func() { m.fuse.Wait(); log.Close(); close(m.fuseDone) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if st, err := os.Stat(pidf); err == nil && st.Size() > 0 {
			break
		}
		select {
		case <-m.fuseDone:
			b, _ := os.ReadFile(log.Name())
			return fmt.Errorf("nbdfuse exited: %s", b)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			m.unmount()
			return errors.New("nbdfuse did not start")
		}
	}
	return nil
}

// cleanupMounts unmounts whatever a failed run left behind.
func (b *bench) cleanupMounts() {
	dirs, _ := filepath.Glob(filepath.Join(b.work, "fs-*"))
	for _, d := range dirs {
		pgdata := filepath.Join(d, "mnt", "pgdata")
		if _, err := os.Stat(filepath.Join(pgdata, "postmaster.pid")); err == nil {
			exec.Command("runuser", "-u", "postgres", "--", filepath.Join(b.pgbin, "pg_ctl"), "-D", pgdata, "-m", "immediate", "stop").Run()
		}
		exec.Command("umount", "-l", filepath.Join(d, "mnt")).Run()
		exec.Command("fusermount3", "-u", "-z", filepath.Join(d, "fuse")).Run()
	}
}

// prepare makes the file system and the database cluster on t.
func (b *bench) prepare(ctx context.Context, t *targets.Target) error {
	m, err := b.mountTarget(ctx, t, true)
	if err != nil {
		return err
	}
	defer m.unmount()
	pgdata := filepath.Join(m.mnt, "pgdata")
	if err := os.Mkdir(pgdata, 0o700); err != nil {
		return err
	}
	if err := chownPostgres(pgdata); err != nil {
		return err
	}
	if _, err := b.pg(ctx, "initdb", "-D", pgdata, "-A", "trust", "-U", "postgres"); err != nil {
		return err
	}
	if err := b.start(ctx, pgdata, filepath.Join(m.dir, "pg.log")); err != nil {
		return err
	}
	defer b.stop(ctx, pgdata)
	_, err = b.pg(ctx, "createdb", "-h", b.sock, "-p", strconv.Itoa(b.port), "bench")
	return err
}

func (b *bench) start(ctx context.Context, pgdata, log string) error {
	f, err := os.Create(log)
	if err != nil {
		return err
	}
	f.Close()
	if err := chownPostgres(log); err != nil {
		return err
	}
	_, err = b.pg(ctx, "pg_ctl", "-D", pgdata, "-l", log, "-w", "-t", "60", "-o",
		fmt.Sprintf("-p %d -k %s -c listen_addresses=''", b.port, b.sock), "start")
	return err
}

func (b *bench) stop(ctx context.Context, pgdata string) error {
	_, err := b.pg(ctx, "pg_ctl", "-D", pgdata, "-m", "fast", "-w", "-t", "60", "stop")
	return err
}

var (
	tpsRE = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
	latRE = regexp.MustCompile(`latency average = ([0-9.]+) ms`)
)

// measure mounts t, starts PostgreSQL, runs pgbench -i and the timed run,
// and takes everything down.
func (b *bench) measure(ctx context.Context, t *targets.Target, rep int) (r result) {
	r = result{target: t.Name, rep: rep}
	m, err := b.mountTarget(ctx, t, false)
	if err != nil {
		r.err = err
		return r
	}
	defer m.unmount()
	pgdata := filepath.Join(m.mnt, "pgdata")
	if r.err = b.start(ctx, pgdata, filepath.Join(m.dir, "pg.log")); r.err != nil {
		return r
	}
	defer func() {
		if err := b.stop(ctx, pgdata); err != nil && r.err == nil {
			r.err = err
		}
	}()
	port := strconv.Itoa(b.port)
	start := time.Now()
	if _, r.err = b.pg(ctx, "pgbench", "-h", b.sock, "-p", port, "-i", "-q", "-s", strconv.Itoa(b.scale), "bench"); r.err != nil {
		return r
	}
	r.initSecs = time.Since(start).Seconds()
	r.load = stats.Load()
	cs := stats.SampleCPU()
	c0 := t.CPU()
	r.fuseCPU = math.NaN()
	var f0 float64
	if m.fuse != nil {
		f0 = stats.ProcCPU(m.fuse.Process.Pid)
	}
	out, err := b.pg(ctx, "pgbench", "-h", b.sock, "-p", port, "-c", strconv.Itoa(b.clients), "-j", strconv.Itoa(b.clients),
		"-T", strconv.Itoa(b.secs), "bench")
	r.serverCPU = t.CPU() - c0
	if m.fuse != nil {
		r.fuseCPU = stats.ProcCPU(m.fuse.Process.Pid) - f0
	}
	r.steal = cs.StealSince()
	if err != nil {
		r.err = err
		return r
	}
	mt := tpsRE.FindStringSubmatch(out)
	if mt == nil {
		r.err = fmt.Errorf("no TPS in pgbench's output: %s", out)
		return r
	}
	r.tps, _ = strconv.ParseFloat(mt[1], 64)
	if ml := latRE.FindStringSubmatch(out); ml != nil {
		r.latMs, _ = strconv.ParseFloat(ml[1], 64)
	}
	return r
}

func report(b *bench, all []*targets.Target, res []result, commands []string, reps int, sizeMiB int64, loadStart float64) string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	runs := func(name string) []result {
		var out []result
		for _, r := range res {
			if r.target == name {
				out = append(out, r)
			}
		}
		return out
	}
	med := func(name string, f func(result) float64) float64 {
		var xs []float64
		for _, r := range runs(name) {
			if r.err == nil {
				xs = append(xs, f(r))
			}
		}
		return stats.Median(xs)
	}
	tps := func(r result) float64 { return r.tps }
	w("## PostgreSQL (pgbench) on ext4 on a block lease: Rialto leases against nbdkit\n\n")
	w("Measured %s by `bench/pgbench/run.sh` (bench/pgbench) at commit %s on %s.\n", stats.Stamp(), stats.Commit("."), stats.Machine())
	w("Every export is %d MiB on a tmpfs, reached through a FUSE file and a loop device, with ext4 on it (`mkfs.ext4`\n", sizeMiB)
	w("defaults) and a PostgreSQL cluster (`initdb` defaults: fsync on, synchronous commit). Each run mounts the file system\n")
	w("afresh, starts PostgreSQL, runs `pgbench -i -s %d` and then `pgbench -c %d -j %d -T %d`, and takes it all down, so that\n", b.scale, b.clients, b.clients, b.secs)
	w("every run starts with cold caches. Targets run interleaved, in rotating order; medians of %d runs. Rialto is measured\n", reps)
	w("through leases made by `rialto lease create` and served by `rialto agent` processes. The FUSE file is nbdfuse's\n")
	w("(libnbd's FUSE client, defaults) on the export's NBD URI, except for the `-fuse` targets, whose file is served by\n")
	w("`rialto attach --fuse` itself: the way a Rialto borrower puts a kernel file system on a lease, one process between\n")
	w("the kernel and the lenders, as nbdfuse is in front of nbdkit (nbdkit has no FUSE front end of its own).\n\n")
	w("| target | served by |\n|---|---|\n")
	for _, t := range all {
		w("| %s | %s |\n", t.Name, t.Served)
	}
	w("\n| target | TPS (median) | ratio to nbdkit | goal | latency average ms | `pgbench -i` s | server CPU s per run | nbdfuse CPU s per run |\n|---|---|---|---|---|---|---|---|\n")
	kit := med("nbdkit", tps)
	for _, t := range all {
		v := med(t.Name, tps)
		ratio, goal := v/kit, "—"
		if g, ok := goals[t.Name]; ok {
			mark := "✗"
			if ratio >= g {
				mark = "✓"
			}
			goal = fmt.Sprintf("≥ %.1f× %s", g, mark)
		}
		if t.Reference {
			goal = "— (reference)"
		}
		rs := "—"
		if !math.IsNaN(ratio) && t.Name != "nbdkit" {
			rs = fmt.Sprintf("%.2f×", ratio)
		}
		fc := "— (in the server's)"
		if t.File == "" {
			fc = fmt.Sprintf("%.2f", med(t.Name, func(r result) float64 { return r.fuseCPU }))
		}
		w("| %s | %.0f | %s | %s | %.2f | %.1f | %.2f | %s |\n", t.Name, v, rs, goal,
			med(t.Name, func(r result) float64 { return r.latMs }),
			med(t.Name, func(r result) float64 { return r.initSecs }),
			med(t.Name, func(r result) float64 { return r.serverCPU }), fc)
	}
	w("\nGoals (the issue \"The product path is the proven path\"): dedicated lease ≥ 1.0×, a lease through `rialto attach`\n")
	w("≥ 0.9×, a 3-way composed lease ≥ 0.9× nbdkit's TPS, each with a FUSE file and a loop device under ext4: the\n")
	w("dedicated lease through nbdfuse as nbdkit, the others through `rialto attach --fuse` (attach-fuse, composed-fuse).\n")
	w("attach and composed (nbdfuse in front of `rialto attach`'s NBD export: two processes between the kernel and the\n")
	w("lenders) are extra rows without a goal. The nbdfuse CPU column is the FUSE client's, outside the server's; for\n")
	w("the `-fuse` rows the FUSE server is the attach process, whose CPU is in the server's.\n")
	if proxy := med("nbdkit-proxy", tps); !math.IsNaN(proxy) {
		// The field's own way of putting a second server in a request's
		// path: a reference for the hop `rialto attach` adds, no goal.
		var rs []string
		for _, t := range all {
			if t.Rialto {
				rs = append(rs, fmt.Sprintf("%s %.2f×", t.Name, med(t.Name, tps)/proxy))
			}
		}
		w("nbdkit-proxy (nbdkit's nbd plugin in front of its file plugin: two servers in each request's path, as in the\n")
		w("attach and composed rows) is a reference row, not a goal; against its TPS: %s.\n", strings.Join(rs, ", "))
	}
	w("\n")
	w("All runs (TPS; steal %% during the timed run; server CPU s during the timed run; 1-minute load average at its start):\n\n")
	w("| target | TPS | steal %% | server CPU s | load |\n|---|---|---|---|---|\n")
	for _, t := range all {
		var v, s, c, l []string
		for _, r := range runs(t.Name) {
			if r.err != nil {
				v = append(v, "error")
			} else {
				v = append(v, fmt.Sprintf("%.0f", r.tps))
			}
			s = append(s, fmt.Sprintf("%.1f", r.steal))
			c = append(c, fmt.Sprintf("%.2f", r.serverCPU))
			l = append(l, fmt.Sprintf("%.2f", r.load))
		}
		w("| %s | %s | %s | %s | %s |\n", t.Name, strings.Join(v, ", "), strings.Join(s, ", "), strings.Join(c, ", "), strings.Join(l, ", "))
	}
	var errs []string
	for _, r := range res {
		if r.err != nil {
			errs = append(errs, fmt.Sprintf("- rep %d on %s: %v", r.rep, r.target, r.err))
		}
	}
	if len(errs) > 0 {
		w("\nFailed runs (left out of the medians):\n\n%s\n", strings.Join(errs, "\n"))
	}
	w("\nLoad average (1 min) at start / end: %.2f / %.2f.\n\n", loadStart, stats.Load())
	w("Commands (URI is the target's NBD URI, IMG a sparse %d MiB file on tmpfs; for the `-fuse` targets, DIR/fuse/disk\n", sizeMiB)
	w("below is the file `rialto attach LEASE --fuse DIR` serves, DIR/attach-fuse/disk or DIR/composed-fuse/disk, and\n")
	w("nbdfuse does not run):\n\n```\n")
	for _, t := range all {
		if !t.Rialto {
			w("%s\n", targets.Peers[t.Name])
		}
	}
	for _, c := range commands {
		w("%s\n", c)
	}
	w("nbdfuse -P PIDFILE DIR/fuse/disk URI &\n")
	w("mkfs.ext4 -q -F DIR/fuse/disk                      # once per export\n")
	w("mount -o loop DIR/fuse/disk DIR/mnt\n")
	w("runuser -u postgres -- initdb -D DIR/mnt/pgdata -A trust -U postgres   # once per export, then createdb bench\n")
	w("runuser -u postgres -- pg_ctl -D DIR/mnt/pgdata -w -o \"-p PORT -k SOCKDIR -c listen_addresses=''\" start\n")
	w("runuser -u postgres -- pgbench -h SOCKDIR -p PORT -i -q -s %d bench\n", b.scale)
	w("runuser -u postgres -- pgbench -h SOCKDIR -p PORT -c %d -j %d -T %d bench\n", b.clients, b.clients, b.secs)
	w("pg_ctl stop -m fast; umount DIR/mnt; fusermount3 -u DIR/fuse\n```\n\n")
	w("Versions: %s; %s; %s; %s.\n", stats.Version(filepath.Join(b.pgbin, "postgres"), "--version"), stats.Version("nbdkit", "--version"),
		stats.Version("nbdfuse", "--version"), stats.Version("mkfs.ext4", "-V"))
	return sb.String()
}
