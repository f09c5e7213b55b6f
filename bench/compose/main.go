// Command compose measures how a composed block lease's throughput scales
// with the number of lenders, through the product: it is driven by
// bench/compose/run.sh.
//
// It starts an emulated rack (internal/rack): a `rialto server` and 3
// `rialto agent` processes, each in its own network namespace whose link is
// shaped with tc tbf to -rate, each agent lending a block device on tmpfs. For k = 1, 2, 3 lenders it makes a lease
// with `rialto lease create` (k = 1: a shared lease on one lender; k = 2, 3:
// `--mode composed --count k`), serves it in the root namespace (the
// borrower) with `rialto attach`, and times nbdcopy writing and reading it.
// Configurations are interleaved within each repetition; it also measures
// the links' ceiling with iperf3 (k parallel streams to k hosts) and an
// uncomposed reference: k nbdcopy processes in parallel, each straight to
// one part's URI. It writes a Markdown fragment.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/bench/internal/iperf"
	"github.com/rialto-project/rialto/bench/internal/lab"
	"github.com/rialto-project/rialto/bench/internal/stats"
	"github.com/rialto-project/rialto/internal/rack"
)

func main() {
	stats.Commit(".") // the tree measured, before it can change: the report names it
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "compose:", err)
		os.Exit(1)
	}
}

const iperfPort = 5201

type result struct {
	Kind      string  // "write", "read", "iperf-write", "iperf-read", "direct-write", "direct-read"
	K         int     // lenders
	Rep       int     //
	MiBps     float64 //
	Steal     float64 // % of CPU time stolen during the run
	CPU       float64 // borrower CPU seconds per GiB: nbdcopy + the attach process
	LenderCPU float64 // lenders' CPU seconds per GiB: the agents serving the parts
	Load      float64 // 1-minute load average when the run started (other tenants of the machine)
	RxqMean   float64 // MiB received and not yet read by the attach's NBD server, mean over the run (NaN: no attach)
	RxqPeak   float64 // the same, peak
}

// config is one lender count: its lease, served in the root namespace by
// `rialto attach`.
type config struct {
	k      int
	lease  api.Lease
	at     *lab.Attachment
	agents []int // PIDs of the agents serving its parts
}

type bench struct {
	work    string
	rack    *rack.Rack
	c       *lab.Cluster
	sizeMiB int64
	unit    int64
	conns   int
	src     string
	log     *slog.Logger
	cmds    map[string]string // exact commands, for the report
}

func run(args []string) error {
	fs := flag.NewFlagSet("compose", flag.ExitOnError)
	rate := fs.String("rate", "200mbit", "tc tbf rate of every lender link")
	sizeMiB := fs.Int64("size-mib", 240, "bytes copied per run (MiB; a multiple of 6)")
	reps := fs.Int("reps", 5, "repetitions (configurations interleaved within each)")
	unit := fs.Int64("unit", 128<<10, "stripe unit of the composed leases, bytes")
	conns := fs.Int("conns", 0, "rialto attach --conns (0: its default)")
	bin := fs.String("bin", "bin/rialto", "the rialto binary")
	out := fs.String("out", "docs/bench/compose.md", "Markdown fragment to write")
	iperfSecs := fs.Int("iperf-secs", 3, "seconds per iperf3 ceiling measurement")
	ksFlag := fs.String("k", "1,2,3", "lender counts to measure (experiments; the report needs 1,2,3)")
	fs.Parse(args)
	if *sizeMiB%6 != 0 {
		return fmt.Errorf("-size-mib must be a multiple of 6")
	}
	rialtoBin, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	var ks []int
	for _, f := range strings.Split(*ksFlag, ",") {
		k, err := strconv.Atoi(f)
		if err != nil || k < 1 || k > 3 {
			return fmt.Errorf("bad -k %q", *ksFlag)
		}
		ks = append(ks, k)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	work, err := os.MkdirTemp("/dev/shm", "rialto-bench-compose.")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	b := &bench{work: work, sizeMiB: *sizeMiB, unit: *unit, conns: *conns, log: log, cmds: map[string]string{}}

	// Source data, all on tmpfs.
	b.src = filepath.Join(work, "src.img")
	if err := randomFile(b.src, *sizeMiB<<20); err != nil {
		return err
	}
	for k := 1; k <= 3; k++ {
		if err := randomFile(b.srcPart(k), (*sizeMiB<<20)/int64(k)); err != nil {
			return err
		}
	}

	// The rack: the control plane and one agent per lender, each in its
	// namespace; every agent lends a device that holds every
	// configuration's part at once.
	devMiB := *sizeMiB + *sizeMiB/2 + *sizeMiB/3
	r, err := rack.Start(ctx, rack.Config{Binary: rialtoBin, StateDir: filepath.Join(work, "rack"), Agents: 3,
		Disks: 1, DiskSize: devMiB << 20, LinkRate: *rate, LogLevel: "warn",
		AgentArgs: lab.InsecureDataplaneArgs(rialtoBin), Logger: log})
	if err != nil {
		return err
	}
	defer r.Close()
	b.rack = r
	c, err := lab.OnRack(r, rialtoBin, filepath.Join(work, "borrower"), os.Stderr)
	if err != nil {
		return err
	}
	defer c.Close()
	b.c = c
	cfgs := map[int]*config{}
	for _, k := range ks {
		cf, err := b.lease(ctx, k)
		if err != nil {
			return fmt.Errorf("k=%d: %w", k, err)
		}
		cfgs[k] = cf
	}

	// One iperf3 server per host for the whole run.
	for _, n := range r.Agents() {
		in := func(ctx context.Context, args ...string) *exec.Cmd { return r.Command(ctx, n, "iperf3", args...) }
		s, err := iperf.StartServer(ctx, in, n.Addr.String(), iperfPort, 10*time.Second)
		if err != nil {
			return err
		}
		defer s.Stop()
	}

	var res []result
	for rep := 1; rep <= *reps; rep++ {
		for _, k := range ks {
			for _, dir := range []string{"write", "read"} {
				r, err := b.iperf(ctx, k, dir == "read", *iperfSecs)
				if err != nil {
					return fmt.Errorf("iperf3 k=%d %s: %w", k, dir, err)
				}
				r.Rep = rep
				res = append(res, r)
				fmt.Fprintf(os.Stderr, "rep %d k=%d iperf3 %s: %.1f MiB/s (steal %.1f%%)\n", rep, k, dir, r.MiBps, r.Steal)
			}
			rs, err := b.volume(ctx, cfgs[k])
			if err != nil {
				return fmt.Errorf("volume k=%d: %w", k, err)
			}
			for _, r := range rs {
				r.Rep = rep
				res = append(res, r)
				fmt.Fprintf(os.Stderr, "rep %d k=%d %s: %.1f MiB/s (steal %.1f%%, borrower CPU %.2f s/GiB, lenders %.2f s/GiB)\n", rep, r.K, r.Kind, r.MiBps, r.Steal, r.CPU, r.LenderCPU)
			}
		}
	}
	return b.report(*out, *rate, *reps, res)
}

// lease makes the lease of k lenders and attaches it in the root namespace.
func (b *bench) lease(ctx context.Context, k int) (*config, error) {
	size := fmt.Sprintf("%dMiB", b.sizeMiB)
	var args []string
	if k == 1 {
		args = []string{"--kind", "block", "--mode", "shared", "--size", size, "--affinity", b.rack.Agent(0).Name}
	} else {
		args = []string{"--kind", "block", "--mode", "composed", "--count", strconv.Itoa(k), "--size", size,
			"--stripe-unit", fmt.Sprintf("%dKiB", b.unit>>10), "--label", "rack=emulated"}
	}
	l, err := b.c.CreateLease(ctx, args...)
	if err != nil {
		return nil, err
	}
	if len(l.Parts) != k {
		return nil, fmt.Errorf("lease has %d parts, want %d", len(l.Parts), k)
	}
	// On loopback TCP (rialto attach's default is a Unix socket): the
	// rows' sampler reads the attach's TCP backlog (attachPort).
	attachArgs := []string{"--listen", "127.0.0.1:0"}
	if b.conns > 0 {
		attachArgs = append(attachArgs, "--conns", strconv.Itoa(b.conns))
	}
	at, err := b.c.Attach(ctx, l.ID, attachArgs...)
	if err != nil {
		return nil, err
	}
	cf := &config{k: k, lease: l, at: at}
	// The agents serving the parts: each part's URI names its host's
	// address, which says which agent it is.
	for _, p := range l.Parts {
		for _, n := range b.rack.Agents() {
			if strings.Contains(p.URI, "//"+n.Addr.String()+":") {
				cf.agents = append(cf.agents, b.rack.Pid(n))
			}
		}
	}
	if len(cf.agents) != k {
		return nil, fmt.Errorf("lease parts on %d distinct lenders' addresses, want %d", len(cf.agents), k)
	}
	return cf, nil
}

func (b *bench) srcPart(k int) string {
	return filepath.Join(b.work, fmt.Sprintf("src-k%d.img", k))
}

func randomFile(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// volume times an nbdcopy write and read of the attached lease, then k
// parallel nbdcopy runs straight to its parts' URIs.
func (b *bench) volume(ctx context.Context, cf *config) ([]result, error) {
	k := cf.k
	b.cmds["write"] = "nbdcopy --flush SRC.img ATTACH-URI     # rialto attach's local URI"
	b.cmds["read"] = "nbdcopy ATTACH-URI null:"
	var res []result
	for _, dir := range []string{"write", "read"} {
		args := []string{"--flush", b.src, cf.at.URI}
		if dir == "read" {
			args = []string{cf.at.URI, "null:"}
		}
		r, err := b.timedAll(ctx, b.sizeMiB, dir, [][]string{append([]string{"nbdcopy"}, args...)}, cf.at.PID(), attachPort(cf.at.URI), cf.agents)
		if err != nil {
			return nil, err
		}
		r.Kind, r.K = dir, k
		res = append(res, r)
	}
	// The uncomposed reference: k independent nbdcopy processes, one per
	// part, each moving size/k straight to the lender.
	b.cmds["direct-write"] = "nbdcopy --flush SRC-k.img PART-URI   (k in parallel, one per part of the lease; SRC-k.img = size/k)"
	b.cmds["direct-read"] = "nbdcopy PART-URI null:   (k in parallel)"
	for _, dir := range []string{"write", "read"} {
		var cmds [][]string
		for _, p := range cf.lease.Parts {
			if dir == "write" {
				cmds = append(cmds, []string{"nbdcopy", "--flush", b.srcPart(k), p.URI})
			} else {
				cmds = append(cmds, []string{"nbdcopy", p.URI, "null:"})
			}
		}
		r, err := b.timedAll(ctx, b.sizeMiB, dir, cmds, 0, 0, cf.agents)
		if err != nil {
			return nil, err
		}
		r.Kind, r.K = "direct-"+dir, k
		res = append(res, r)
	}
	return res, nil
}

// timedAll runs commands in parallel and returns their joint throughput
// for sizeMiB MiB in all, with the CPU of the borrower (the commands and
// the attach process borrower, if any) and of the lenders, and the bytes
// waiting unread at the attach's TCP port (rxPort; 0 for none).
func (b *bench) timedAll(ctx context.Context, sizeMiB int64, label string, cmds [][]string, borrower, rxPort int, lenders []int) (result, error) {
	load := stats.Load()
	rt0 := retrans()
	cs := stats.SampleCPU()
	c0 := stats.ProcCPU(borrower)
	var l0 float64
	for _, p := range lenders {
		l0 += stats.ProcCPU(p)
	}
	rxq := startRxq(ctx, rxPort, 20*time.Millisecond)
	start := time.Now()
	type done struct {
		cpu float64
		err error
	}
	ch := make(chan done, len(cmds))
	for _, argv := range cmds {
		go func() {
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				// Arguments hold credentials: report only the output.
				ch <- done{0, fmt.Errorf("%s: %w: %s", argv[0], err, out)}
				return
			}
			ch <- done{(cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds(), nil}
		}()
	}
	cpu := 0.0
	var errs []error
	for range cmds {
		d := <-ch
		cpu += d.cpu
		if d.err != nil {
			errs = append(errs, d.err)
		}
	}
	el := time.Since(start)
	steal := cs.StealSince()
	rxMean, rxPeak := rxq.stop()
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	cpu += stats.ProcCPU(borrower) - c0
	var l1 float64
	for _, p := range lenders {
		l1 += stats.ProcCPU(p)
	}
	gib := float64(sizeMiB) / 1024
	fmt.Fprintf(os.Stderr, "  (%s: %d TCP segments retransmitted from the borrower)\n", label, retrans()-rt0)
	return result{MiBps: float64(sizeMiB) / el.Seconds(), Steal: steal, CPU: cpu / gib, LenderCPU: (l1 - l0) / gib, Load: load,
		RxqMean: rxMean, RxqPeak: rxPeak}, nil
}

// iperf measures k parallel TCP streams, one to each of k hosts, from the
// root namespace (write) or to it (read, iperf3 -R).
func (b *bench) iperf(ctx context.Context, k int, reverse bool, secs int) (result, error) {
	const port = iperfPort
	load := stats.Load()
	rt0 := retrans()
	defer func() {
		fmt.Fprintf(os.Stderr, "  (iperf3: %d TCP segments retransmitted from the borrower)\n", retrans()-rt0)
	}()
	b.cmds["iperf3"] = fmt.Sprintf("ip netns exec HOST iperf3 -s -B ADDR -p %d; iperf3 -c ADDR -p %d -t %d -J [-R]  (k in parallel)", port, port, secs)
	cs := stats.SampleCPU()
	type out struct {
		bps float64
		err error
	}
	ch := make(chan out, k)
	for i := range k {
		go func() {
			bps, err := iperfOnce(ctx, b.rack.Agent(i).Addr.String(), port, secs, reverse)
			ch <- out{bps, err}
		}()
	}
	var total float64
	for range k {
		o := <-ch
		if o.err != nil {
			return result{}, o.err
		}
		total += o.bps
	}
	steal := cs.StealSince()
	kind := "iperf-write"
	if reverse {
		kind = "iperf-read"
	}
	return result{Kind: kind, K: k, MiBps: total / 8 / (1 << 20), Steal: steal, Load: load}, nil
}

// iperfOnce runs one iperf3 client; an error iperf3 reports (a server not
// yet ready for the next test, for one) is retried.
func iperfOnce(ctx context.Context, addr string, port, secs int, reverse bool) (float64, error) {
	var extra []string
	if reverse {
		extra = []string{"-R"}
	}
	var last error
	for try := 0; try < 5; try++ {
		bps, err := iperf.Client(ctx, iperf.Local, addr, port, secs, extra...)
		if err == nil {
			return bps, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return 0, last
}

// retrans returns the root namespace's TCP RetransSegs counter.
func retrans() int64 {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "RetransSegs" && i < len(f) {
				v, _ := strconv.ParseInt(f[i], 10, 64)
				return v
			}
		}
	}
	return 0
}

func (b *bench) report(path, rate string, reps int, res []result) error {
	get := func(kind string, k int) (vals, steal []float64) {
		for _, r := range res {
			if r.Kind == kind && r.K == k {
				vals = append(vals, r.MiBps)
				steal = append(steal, r.Steal)
			}
		}
		return
	}
	extra := func(kind string, k int) (cpu, lcpu, load, rxq []string) {
		for _, r := range res {
			if r.Kind == kind && r.K == k {
				cpu = append(cpu, strconv.FormatFloat(r.CPU, 'f', 1, 64))
				lcpu = append(lcpu, strconv.FormatFloat(r.LenderCPU, 'f', 1, 64))
				load = append(load, strconv.FormatFloat(r.Load, 'f', 1, 64))
				if !math.IsNaN(r.RxqMean) {
					rxq = append(rxq, fmt.Sprintf("%.1f / %.1f", r.RxqMean, r.RxqPeak))
				}
			}
		}
		return
	}
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	w("## Composition scaling through `rialto agent` lenders (a lease over 1, 2, 3 lenders)\n\n")
	w("Measured %s by `bench/compose/run.sh` (bench/compose) at commit %s on %s.\n", stats.Stamp(), stats.Commit("."), stats.Machine())
	w("An emulated rack (internal/rack): a `rialto server` process and three `rialto agent` processes, each in its own network\n")
	w("namespace joined to the borrower (the root namespace) by a veth pair on a bridge; every link is shaped in both directions\n")
	w("with `tc qdisc add dev IF root tbf rate %s burst B latency 25ms` (B = max(32 KiB, 2 ms at the rate); internal/netns).\n", rate)
	w("Each agent lends a block device on tmpfs. For k lenders the borrower holds a lease made by `rialto lease create` (k = 1: a shared\n")
	w("lease on one lender; k = 2, 3: `--mode composed --count k`, stripe unit %d KiB) served in the root namespace by\n", b.unit>>10)
	w("`rialto attach` (its default connections per part), and copies %d MiB with nbdcopy %s to and from it, so every\n", b.sizeMiB, nbdcopyVersion())
	w("configuration moves the same bytes. Configurations run interleaved in each of %d repetitions; figures are medians.\n", reps)
	w("The link ceiling is iperf3 with k parallel streams to the k hosts, over the same links, in the same run.\n\n")
	w("| lenders | link ceiling w / r (iperf3, MiB/s) | k direct copies w / r (no composition, MiB/s) | volume write MiB/s | write scaling | volume read MiB/s | read scaling | volume ÷ direct (w / r) | volume ÷ ceiling (w / r) |\n")
	w("|---|---|---|---|---|---|---|---|---|\n")
	w1, _ := get("write", 1)
	r1, _ := get("read", 1)
	var scaling [4][2]float64
	for k := 1; k <= 3; k++ {
		iw, _ := get("iperf-write", k)
		ir, _ := get("iperf-read", k)
		dw, _ := get("direct-write", k)
		dr, _ := get("direct-read", k)
		wv, _ := get("write", k)
		rv, _ := get("read", k)
		ws, rs := stats.Median(wv)/stats.Median(w1), stats.Median(rv)/stats.Median(r1)
		scaling[k] = [2]float64{ws, rs}
		w("| %d | %.1f / %.1f | %.1f / %.1f | %.1f | %.2f× | %.1f | %.2f× | %.0f%% / %.0f%% | %.0f%% / %.0f%% |\n", k,
			stats.Median(iw), stats.Median(ir), stats.Median(dw), stats.Median(dr), stats.Median(wv), ws, stats.Median(rv), rs,
			100*stats.Median(wv)/stats.Median(dw), 100*stats.Median(rv)/stats.Median(dr), 100*stats.Median(wv)/stats.Median(iw), 100*stats.Median(rv)/stats.Median(ir))
	}
	w("\n")
	w("Goals (the issue \"The product path is the proven path\"): ≥ 1.9× at 2 lenders and ≥ 2.7× at 3, and ≥ 95%% of the iperf3\n")
	w("ceiling of the same links. Measured: scaling write %.2f× / %.2f×, read %.2f× / %.2f× — %s; of the ceiling (k = 1, 2, 3)\n",
		scaling[2][0], scaling[3][0], scaling[2][1], scaling[3][1], verdict(scaling))
	ceilOK := true
	var ceil []string
	for k := 1; k <= 3; k++ {
		iw, _ := get("iperf-write", k)
		ir, _ := get("iperf-read", k)
		wv, _ := get("write", k)
		rv, _ := get("read", k)
		fw, fr := stats.Median(wv)/stats.Median(iw), stats.Median(rv)/stats.Median(ir)
		if !(fw >= 0.95 && fr >= 0.95) {
			ceilOK = false
		}
		ceil = append(ceil, fmt.Sprintf("%.0f%% / %.0f%%", 100*fw, 100*fr))
	}
	mark := "goal met"
	if !ceilOK {
		mark = "goal NOT met"
	}
	w("write / read %s — %s.\n", strings.Join(ceil, ", "), mark)
	dw1, _ := get("direct-write", 1)
	dr1, _ := get("direct-read", 1)
	var ds [4][2]float64
	for k := 2; k <= 3; k++ {
		dw, _ := get("direct-write", k)
		dr, _ := get("direct-read", k)
		ds[k] = [2]float64{stats.Median(dw) / stats.Median(dw1), stats.Median(dr) / stats.Median(dr1)}
	}
	w("For reference, k independent direct copies (no composition) scaled write %.2f× / %.2f×, read %.2f× / %.2f×\n", ds[2][0], ds[3][0], ds[2][1], ds[3][1])
	w("in the same run: what the links and this shared machine allowed.\n\n")
	w("All runs, in run order: MiB/s; steal %% of all CPU time during the run (/proc/stat); the 1-minute\n")
	w("load average when the run started (the machine's 2 vCPUs are shared with other work, which steal\n")
	w("does not show); borrower CPU seconds per GiB (nbdcopy plus the attach process); lender CPU seconds per GiB (the\n")
	w("`rialto agent` processes serving the parts, utime+stime from /proc/PID/stat); MiB that nbdcopy had sent and the\n")
	w("attach's NBD server had not yet read, mean / peak over the run (rx_queue of its sockets in /proc/net/tcp, every 20 ms):\n")
	w("a backlog that stays (not near 0) while the links have room means the attach's server reads requests more slowly than\n")
	w("nbdcopy sends them, e.g. serving them one at a time:\n\n")
	w("| measurement | lenders | runs MiB/s | steal %% | load | borrower CPU s/GiB | lender CPU s/GiB | unread at the attach, MiB mean / peak |\n|---|---|---|---|---|---|---|---|\n")
	for _, kind := range []string{"iperf-write", "iperf-read", "write", "read", "direct-write", "direct-read"} {
		for k := 1; k <= 3; k++ {
			v, s := get(kind, k)
			if len(v) == 0 {
				continue
			}
			c, lc, l, rq := extra(kind, k)
			cpu, lcpu := strings.Join(c, ", "), strings.Join(lc, ", ")
			if strings.HasPrefix(kind, "iperf") {
				cpu, lcpu, rq = "", "", nil
			}
			w("| %s | %d | %s | %s | %s | %s | %s | %s |\n", kind, k, join(v), join(s), strings.Join(l, ", "), cpu, lcpu, strings.Join(rq, ", "))
		}
	}
	w("\nCommands (HOST, ADDR, URL, LEASE stand for the generated names; a part's URI names a secret export):\n\n```\n")
	for _, c := range b.c.Commands {
		w("%s\n", c)
	}
	for _, key := range []string{"write", "read", "direct-write", "direct-read", "iperf3"} {
		w("%s\n", b.cmds[key])
	}
	w("```\n")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	fmt.Fprint(os.Stderr, sb.String())
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}

func verdict(s [4][2]float64) string {
	if s[2][0] >= 1.9 && s[2][1] >= 1.9 && s[3][0] >= 2.7 && s[3][1] >= 2.7 {
		return "goal met"
	}
	return "goal NOT met"
}

func join(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatFloat(x, 'f', 1, 64)
	}
	return strings.Join(s, ", ")
}

func nbdcopyVersion() string {
	out, err := exec.Command("nbdcopy", "--version").Output()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimPrefix(strings.TrimSpace(line), "nbdcopy ")
}
