// Command compose measures how a striped (composed) volume's throughput
// scales with the number of lenders. It is driven by bench/compose/run.sh.
//
//	compose serve -listen ADDR -file PATH -name NAME   # one NBD lender
//	compose run [flags]                                 # the whole benchmark
//
// "run" builds a lab of 3 hosts (network namespaces, internal/netns) whose
// links are shaped with tc tbf to -rate, starts one lender process per host
// (this binary's "serve", through ip netns exec) serving a file on tmpfs,
// attaches a volume striped over 1, 2 and 3 of them (stripe.Attach, in this
// process, on a Unix socket) and times nbdcopy writing and reading it.
// Configurations are interleaved within each repetition; it also measures
// the links' ceiling with iperf3 (k parallel streams to k hosts) and a
// uncomposed reference: k nbdcopy processes in parallel, each straight to one
// lender. It writes a Markdown fragment.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/netns"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: compose serve|run [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "run":
		err = run(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compose:", err)
		os.Exit(1)
	}
}

// serve runs one NBD lender until SIGTERM.
func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", "", "address to listen on")
	file := fs.String("file", "", "file to serve")
	name := fs.String("name", "", "export name")
	fs.Parse(args)
	be, err := nbd.OpenFile(*file, nbd.FileOptions{})
	if err != nil {
		return err
	}
	defer be.Close()
	srv := &nbd.Server{}
	if err := srv.AddExport(nbd.Export{Name: *name, Backend: be}); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return srv.Serve(ctx, ln)
}

const iperfPort = "5201"

type result struct {
	Kind  string  // "write", "read", "iperf-write", "iperf-read", "direct-write", "direct-read"
	K     int     // lenders
	Rep   int     //
	MiBps float64 //
	Steal float64 // % of CPU time stolen during the run
	CPU   float64 // CPU seconds per GiB: nbdcopy + this process (the borrower's stripe layer)
	Load  float64 // 1-minute load average when the run started (other tenants of the machine)
}

type bench struct {
	self    string
	work    string
	lab     *netns.Lab
	sizeMiB int64
	unit    int64
	conns   int
	workers int
	src     string
	log     *slog.Logger
	cmds    map[string]string // exact commands, for the report
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	rate := fs.String("rate", "200mbit", "tc tbf rate of every lender link")
	sizeMiB := fs.Int64("size-mib", 240, "bytes copied per run (MiB; divisible by 1, 2 and 3 MiB units)")
	reps := fs.Int("reps", 5, "repetitions (configurations interleaved within each)")
	unit := fs.Int64("unit", stripe.DefaultStripeUnit, "stripe unit in bytes")
	conns := fs.Int("conns", stripe.DefaultConnsPerPart, "connections per lender")
	workers := fs.Int("workers", stripe.DefaultWorkers, "requests served concurrently per client connection of the attached volume")
	out := fs.String("out", "docs/bench/compose.md", "Markdown fragment to write")
	iperfSecs := fs.Int("iperf-secs", 3, "seconds per iperf3 ceiling measurement")
	cpuprofile := fs.String("cpuprofile", "", "write this process's CPU profile here (experiments)")
	ksFlag := fs.String("k", "1,2,3", "lender counts to measure (experiments; the report needs 1,2,3)")
	fs.Parse(args)
	if *sizeMiB%6 != 0 {
		return fmt.Errorf("-size-mib must be a multiple of 6")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	work, err := os.MkdirTemp("/dev/shm", "rialto-bench-compose.")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	lab, err := netns.New(ctx, netns.Config{Hosts: 3, Rate: *rate, Prefix: "rialto-bench"})
	if err != nil {
		return err
	}
	defer lab.Close()
	b := &bench{self: self, work: work, lab: lab, sizeMiB: *sizeMiB, unit: *unit, conns: *conns, workers: *workers, log: log, cmds: map[string]string{}}

	// Source data and lender files, all on tmpfs and fully allocated.
	b.src = filepath.Join(work, "src.img")
	if err := randomFile(b.src, *sizeMiB<<20); err != nil {
		return err
	}
	for k := 1; k <= 3; k++ {
		if err := randomFile(b.srcPart(k), (*sizeMiB<<20)/int64(k)); err != nil {
			return err
		}
		for i := range k {
			if err := randomFile(b.part(k, i), (*sizeMiB<<20)/int64(k)); err != nil {
				return err
			}
		}
	}

	// One iperf3 server per host for the whole run.
	for i := range lab.Len() {
		s := lab.Command(ctx, i, "iperf3", "-s", "-B", lab.Host(i).Addr.String(), "-p", iperfPort)
		if err := s.Start(); err != nil {
			return err
		}
		defer func() { s.Process.Kill(); s.Wait() }()
		if err := waitTCP(ctx, net.JoinHostPort(lab.Host(i).Addr.String(), iperfPort)); err != nil {
			return err
		}
	}

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var ks []int
	for _, f := range strings.Split(*ksFlag, ",") {
		k, err := strconv.Atoi(f)
		if err != nil || k < 1 || k > 3 {
			return fmt.Errorf("bad -k %q", *ksFlag)
		}
		ks = append(ks, k)
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
			rs, err := b.volume(ctx, k)
			if err != nil {
				return fmt.Errorf("volume k=%d: %w", k, err)
			}
			for _, r := range rs {
				r.Rep = rep
				res = append(res, r)
				fmt.Fprintf(os.Stderr, "rep %d k=%d %s: %.1f MiB/s (steal %.1f%%, borrower CPU %.2f s/GiB)\n", rep, r.K, r.Kind, r.MiBps, r.Steal, r.CPU)
			}
		}
	}
	return b.report(*out, *rate, *reps, res)
}

func (b *bench) srcPart(k int) string {
	return filepath.Join(b.work, fmt.Sprintf("src-k%d.img", k))
}

func (b *bench) part(k, i int) string {
	return filepath.Join(b.work, fmt.Sprintf("lender-k%d-%d.img", k, i))
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

// volume starts k lenders, attaches a volume striped over them, and times an
// nbdcopy write and read of it, then k parallel nbdcopy runs straight to the
// lenders
// against the lender.
func (b *bench) volume(ctx context.Context, k int) ([]result, error) {
	var uris []string
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			p.Process.Signal(syscall.SIGTERM)
			p.Wait()
		}
	}()
	for i := range k {
		var nb [16]byte
		rand.Read(nb[:])
		name := hex.EncodeToString(nb[:])
		addr := net.JoinHostPort(b.lab.Host(i).Addr.String(), nbd.DefaultPort)
		cmd := b.lab.Command(ctx, i, b.self, "serve", "-listen", addr, "-file", b.part(k, i), "-name", name)
		cmd.Stderr = os.Stderr
		b.cmds["lender"] = fmt.Sprintf("ip netns exec HOST compose serve -listen ADDR:%s -file LENDER.img -name CREDENTIAL", nbd.DefaultPort)
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		procs = append(procs, cmd)
		uri := nbd.URI{Network: "tcp", Address: addr, Export: name}.String()
		if err := waitNBD(ctx, addr, name); err != nil {
			return nil, err
		}
		uris = append(uris, uri)
	}
	a, err := stripe.Attach(ctx, stripe.AttachConfig{
		URIs: uris, StripeUnit: b.unit, ConnsPerPart: b.conns, Workers: b.workers,
		Listen: "unix:" + filepath.Join(b.work, "vol.sock"), Logger: b.log,
	})
	if err != nil {
		return nil, err
	}
	defer a.Close()
	if got, want := a.Volume().Size(), b.sizeMiB<<20; got != want {
		return nil, fmt.Errorf("volume size %d, want %d", got, want)
	}
	b.cmds["write"] = "nbdcopy --flush SRC.img 'nbd+unix:///VOLUME?socket=vol.sock'"
	b.cmds["read"] = "nbdcopy 'nbd+unix:///VOLUME?socket=vol.sock' null:"
	var res []result
	for _, dir := range []string{"write", "read"} {
		args := []string{"--flush", b.src, a.URI()}
		if dir == "read" {
			args = []string{a.URI(), "null:"}
		}
		r, err := b.timed(ctx, b.sizeMiB, dir, args...)
		if err != nil {
			return nil, err
		}
		r.Kind, r.K = dir, k
		res = append(res, r)
	}
	// The uncomposed reference: k independent nbdcopy processes, one per
	// lender, each moving size/k directly.
	b.cmds["direct-write"] = "nbdcopy --flush SRC-k.img nbd://ADDR/CREDENTIAL   (k in parallel, SRC-k.img = size/k)"
	b.cmds["direct-read"] = "nbdcopy nbd://ADDR/CREDENTIAL null:   (k in parallel)"
	for _, dir := range []string{"write", "read"} {
		var cmds [][]string
		for _, u := range uris {
			if dir == "write" {
				cmds = append(cmds, []string{"nbdcopy", "--flush", b.srcPart(k), u})
			} else {
				cmds = append(cmds, []string{"nbdcopy", u, "null:"})
			}
		}
		r, err := b.timedAll(ctx, b.sizeMiB, dir, cmds)
		if err != nil {
			return nil, err
		}
		r.Kind, r.K = "direct-"+dir, k
		res = append(res, r)
	}
	return res, nil
}

// waitNBD polls until an NBD server answers the handshake (bench code: a
// lender in another process, with a deadline).
func waitNBD(ctx context.Context, addr, name string) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := nbd.Dial(ctx, "tcp", addr, name)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lender at %s did not start: %w", addr, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// timed runs a command and returns its throughput for sizeMiB MiB.
func (b *bench) timed(ctx context.Context, sizeMiB int64, label string, args ...string) (result, error) {
	return b.timedAll(ctx, sizeMiB, label, [][]string{append([]string{"nbdcopy"}, args...)})
}

// timedAll runs commands in parallel and returns their joint throughput for
// sizeMiB MiB in all.
func (b *bench) timedAll(ctx context.Context, sizeMiB int64, label string, cmds [][]string) (result, error) {
	load := loadAvg()
	rt0 := retrans()
	s0, t0 := cpuStat()
	c0 := selfCPU()
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
	s1, t1 := cpuStat()
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	cpu += selfCPU() - c0
	fmt.Fprintf(os.Stderr, "  (%s: %d TCP segments retransmitted from the borrower)\n", label, retrans()-rt0)
	return result{MiBps: float64(sizeMiB) / el.Seconds(), Steal: pct(s1-s0, t1-t0), CPU: cpu / (float64(sizeMiB) / 1024), Load: load}, nil
}

// iperf measures k parallel TCP streams, one to each of k hosts, from the
// root namespace (write) or to it (read, iperf3 -R).
func (b *bench) iperf(ctx context.Context, k int, reverse bool, secs int) (result, error) {
	const port = iperfPort
	load := loadAvg()
	rt0 := retrans()
	defer func() {
		fmt.Fprintf(os.Stderr, "  (iperf3: %d TCP segments retransmitted from the borrower)\n", retrans()-rt0)
	}()
	b.cmds["iperf3"] = fmt.Sprintf("ip netns exec HOST iperf3 -s -B ADDR -p %s; iperf3 -c ADDR -p %s -t %d -J [-R]  (k in parallel)", port, port, secs)
	s0, t0 := cpuStat()
	type out struct {
		bps float64
		err error
	}
	ch := make(chan out, k)
	for i := range k {
		go func() {
			bps, err := iperfOnce(ctx, b.lab.Host(i).Addr.String(), port, secs, reverse)
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
	s1, t1 := cpuStat()
	kind := "iperf-write"
	if reverse {
		kind = "iperf-read"
	}
	return result{Kind: kind, K: k, MiBps: total / 8 / (1 << 20), Steal: pct(s1-s0, t1-t0), Load: load}, nil
}

// iperfOnce runs one iperf3 client; a server still recovering from the
// readiness probe answers with an error, so that case is retried.
func iperfOnce(ctx context.Context, addr, port string, secs int, reverse bool) (float64, error) {
	args := []string{"-c", addr, "-p", port, "-t", strconv.Itoa(secs), "-J"}
	if reverse {
		args = append(args, "-R")
	}
	var last error
	for try := 0; try < 5; try++ {
		o, _ := exec.CommandContext(ctx, "iperf3", args...).Output()
		var j struct {
			Error string `json:"error"`
			End   struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal(o, &j); err != nil {
			last = fmt.Errorf("iperf3 output: %w", err)
		} else if j.Error != "" || j.End.SumReceived.BitsPerSecond == 0 {
			last = fmt.Errorf("iperf3: %q", j.Error)
		} else {
			return j.End.SumReceived.BitsPerSecond, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return 0, last
}

func waitTCP(ctx context.Context, addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not open: %w", addr, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
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

func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// selfCPU returns this process's user+system CPU seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// cpuStat returns steal and total jiffies from /proc/stat.
func cpuStat() (steal, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		x, _ := strconv.ParseFloat(v, 64)
		if i < 8 { // user nice system idle iowait irq softirq steal
			total += x
		}
		if i == 7 {
			steal = x
		}
	}
	return steal, total
}

func pct(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return 100 * a / b
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
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
	extra := func(kind string, k int) (cpu, load []float64) {
		for _, r := range res {
			if r.Kind == kind && r.K == k {
				cpu = append(cpu, r.CPU)
				load = append(load, r.Load)
			}
		}
		return
	}
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	w("## Composition scaling (striped volume over 1, 2, 3 lenders)\n\n")
	w("Measured %s by `bench/compose/run.sh`. Three lender hosts are network namespaces\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	w("joined to the borrower (the root namespace) by veth pairs on a bridge; every link is\n")
	w("shaped in both directions with `tc qdisc add dev IF root tbf rate %s burst B latency 25ms`\n(B = max(32 KiB, 2 ms at the rate); internal/netns).\n", rate)
	w("Each lender is a Rialto NBD server process (`compose serve`, internal/dataplane/block/nbd)\n")
	w("serving a random-data file on tmpfs; the borrower attaches a volume striped over k of them\n")
	w("(`stripe.Attach`: stripe unit %d KiB, %d connections per lender, served on a Unix socket)\n", b.unit>>10, b.conns)
	w("and copies %d MiB with nbdcopy %s. The lenders' files hold %d/k MiB each, so every\n", b.sizeMiB, nbdcopyVersion(), b.sizeMiB)
	w("configuration moves the same bytes. Configurations run interleaved in each of %d repetitions;\n", reps)
	w("figures are medians. The link ceiling is iperf3 with k parallel streams to the k hosts, in the same run.\n\n")
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
		ws, rs := median(wv)/median(w1), median(rv)/median(r1)
		scaling[k] = [2]float64{ws, rs}
		w("| %d | %.1f / %.1f | %.1f / %.1f | %.1f | %.2f× | %.1f | %.2f× | %.0f%% / %.0f%% | %.0f%% / %.0f%% |\n", k,
			median(iw), median(ir), median(dw), median(dr), median(wv), ws, median(rv), rs,
			100*median(wv)/median(dw), 100*median(rv)/median(dr), 100*median(wv)/median(iw), 100*median(rv)/median(ir))
	}
	w("\n")
	w("Goal (issue 3): ≥ 1.9× at 2 lenders and ≥ 2.7× at 3. Measured: write %.2f× / %.2f×, read %.2f× / %.2f× — %s.\n",
		scaling[2][0], scaling[3][0], scaling[2][1], scaling[3][1], verdict(scaling))
	dw1, _ := get("direct-write", 1)
	dr1, _ := get("direct-read", 1)
	var ds [4][2]float64
	for k := 2; k <= 3; k++ {
		dw, _ := get("direct-write", k)
		dr, _ := get("direct-read", k)
		ds[k] = [2]float64{median(dw) / median(dw1), median(dr) / median(dr1)}
	}
	w("For reference, k independent direct copies (no composition) scaled write %.2f× / %.2f×, read %.2f× / %.2f×\n", ds[2][0], ds[3][0], ds[2][1], ds[3][1])
	w("in the same run: what the links and this shared machine allowed.\n\n")
	w("All runs, in run order: MiB/s; steal %% of all CPU time during the run (/proc/stat); the 1-minute\n")
	w("load average when the run started (the machine's 2 vCPUs are shared with other work, which steal\n")
	w("does not show); borrower CPU seconds per GiB (nbdcopy plus the attaching process):\n\n")
	w("| measurement | lenders | runs MiB/s | steal %% | load | borrower CPU s/GiB |\n|---|---|---|---|---|---|\n")
	for _, kind := range []string{"iperf-write", "iperf-read", "write", "read", "direct-write", "direct-read"} {
		for k := 1; k <= 3; k++ {
			v, s := get(kind, k)
			if len(v) == 0 {
				continue
			}
			c, l := extra(kind, k)
			cpu := join(c)
			if strings.HasPrefix(kind, "iperf") {
				cpu = ""
			}
			w("| %s | %d | %s | %s | %s | %s |\n", kind, k, join(v), join(s), join(l), cpu)
		}
	}
	w("\nCommands (HOST, ADDR, CREDENTIAL and VOLUME stand for the generated names):\n\n```\n")
	for _, key := range []string{"lender", "write", "read", "direct-write", "direct-read", "iperf3"} {
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
