// Command move measures live migration of a block lease between lenders
// (`rialto lease move`) over an emulated rack whose links are shaped with
// tc tbf: the migration's throughput against the link's ceiling measured
// with iperf3 in the same run, and the borrower's I/O latency (fio
// through `rialto attach`, 4 KiB random reads and writes at queue depth 1)
// while a move runs against the same workload without one. It is driven
// by bench/move/run.sh.
//
// The rack (internal/rack) runs `rialto server` and three `rialto agent`
// processes in network namespaces: node1 and node2 lend block devices,
// node3 borrows (rialto attach, fio). Each repetition moves the lease
// from where it is to the other lender (node1 → node2, then back), and
// runs, in rotated order, the iperf3 ceiling between the two lenders, fio
// without a move and fio with a move started a second into it.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
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
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/rack"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "move:", err)
		os.Exit(1)
	}
}

type bench struct {
	r        *rack.Rack
	bin      string
	env      []string
	lease    api.Lease
	lenders  [2]rack.Node
	borrower rack.Node
	names    map[string]string // node ID → name
	attURI   string
	sizeMiB  int64
	fioSecs  int
}

// moveResult is one migration.
type moveResult struct {
	Seconds       float64 // wall time of `rialto lease move`
	CopiedMiB     float64 // bytes the source sent (every pass)
	Passes        int
	HeldMs        float64
	SrcOutMiB     float64 // the source's link, out
	DstInMiB      float64 // the destination's link, in
	BorrowerMiB   float64 // the borrower's link, both ways
	Steal         float64
	From, To      string
	ReadP99Us     float64 // fio during the move (0 when fio did not run)
	WriteP99Us    float64
	ReadP50Us     float64
	WriteP50Us    float64
	WriteMaxUs    float64
	FioIOPS       float64
	FioErrors     int
	BaseReadP99   float64 // fio without a move, same repetition
	BaseWriteP99  float64
	BaseReadP50   float64
	BaseWriteP50  float64
	BaseWriteMax  float64
	BaseIOPS      float64
	CeilingMiBps  float64 // iperf3 between the lenders, same repetition
	MigrationMiBs float64 // size / seconds
}

func run() error {
	bin := flag.String("bin", "bin/rialto", "the rialto binary")
	rate := flag.String("rate", "400mbit", "tc tbf rate of every agent's link")
	sizeMiB := flag.Int64("size-mib", 256, "the block lease's size (MiB), filled with random bytes")
	reps := flag.Int("reps", 3, "repetitions")
	fioSecs := flag.Int("fio-secs", 12, "seconds of each fio run")
	iperfSecs := flag.Int("iperf-secs", 4, "seconds of each iperf3 run")
	out := flag.String("out", "docs/bench/move.md", "Markdown fragment to write")
	flag.Parse()
	if *sizeMiB < 16 || *reps < 1 {
		return fmt.Errorf("-size-mib must be at least 16 and -reps positive")
	}
	for _, tool := range []string{"fio", "iperf3"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is needed: %w", tool, err)
		}
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	work, err := os.MkdirTemp("/dev/shm", "rialto-bench-move.")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	size := *sizeMiB << 20
	r, err := rack.Start(ctx, rack.Config{Binary: abs, StateDir: filepath.Join(work, "rack"), Agents: 3, Disks: 1,
		DiskSize: 2*size + 64<<20, LinkRate: *rate, LogLevel: "warn", AgentArgs: lab.InsecureDataplaneArgs(abs)})
	if err != nil {
		return err
	}
	defer r.Close()
	b := &bench{r: r, bin: abs, lenders: [2]rack.Node{r.Agent(0), r.Agent(1)}, borrower: r.Agent(2), sizeMiB: *sizeMiB, fioSecs: *fioSecs,
		names: map[string]string{}}
	b.env = append(append(os.Environ(), r.Env()...), "XDG_RUNTIME_DIR="+filepath.Join(work, "run"))
	cl := r.Client()
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		b.names[n.ID] = n.Name
	}
	if b.lease, err = cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: size, Affinity: []string{b.lenders[0].Name}}); err != nil {
		return err
	}
	if err := fill(ctx, b.lease.URI, size); err != nil {
		return err
	}
	att, uri, err := b.attach(ctx)
	if err != nil {
		return err
	}
	defer func() { att.Process.Kill(); att.Wait() }()
	b.attURI = uri

	var res []moveResult
	for rep := 1; rep <= *reps; rep++ {
		var x moveResult
		steps := []func() error{
			func() error { // the link's ceiling, between the two lenders
				c, err := iperfCeiling(ctx, r, b.lenders[0], b.lenders[1], *iperfSecs)
				x.CeilingMiBps = c
				return err
			},
			func() error { // the borrower's latency without a move
				f, err := b.fio(ctx)
				x.BaseReadP99, x.BaseWriteP99, x.BaseReadP50, x.BaseWriteP50, x.BaseWriteMax, x.BaseIOPS = f.readP99, f.writeP99, f.readP50, f.writeP50, f.writeMax, f.iops
				return err
			},
			func() error { // a move, with the same fio running
				m, err := b.moveUnderFio(ctx)
				base := x
				x = m
				x.CeilingMiBps, x.BaseReadP99, x.BaseWriteP99, x.BaseReadP50, x.BaseWriteP50, x.BaseWriteMax, x.BaseIOPS =
					base.CeilingMiBps, base.BaseReadP99, base.BaseWriteP99, base.BaseReadP50, base.BaseWriteP50, base.BaseWriteMax, base.BaseIOPS
				return err
			},
		}
		for k := range steps {
			if err := steps[(k+rep-1)%len(steps)](); err != nil {
				return fmt.Errorf("rep %d: %w", rep, err)
			}
		}
		fmt.Fprintf(os.Stderr, "rep %d: %s → %s: %.1f s, %.1f MiB/s (ceiling %.1f MiB/s), %d passes, writes held %.1f ms; borrower link %.1f MiB; read p99 %.0f µs (%.0f without), write p99 %.0f µs (%.0f without)\n",
			rep, x.From, x.To, x.Seconds, x.MigrationMiBs, x.CeilingMiBps, x.Passes, x.HeldMs, x.BorrowerMiB, x.ReadP99Us, x.BaseReadP99, x.WriteP99Us, x.BaseWriteP99)
		res = append(res, x)
	}
	return report(*out, *rate, *sizeMiB, *fioSecs, *iperfSecs, *reps, res)
}

// fill writes size random bytes into the lease (once; the moves copy them).
func fill(ctx context.Context, uri string, size int64) error {
	c, err := nbd.DialURI(ctx, uri)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 8<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		rand.Read(buf)
		if _, err := c.WriteAtContext(ctx, buf[:min(int64(len(buf)), size-off)], off, false); err != nil {
			return err
		}
	}
	return c.Flush()
}

// attach runs `rialto attach` on the borrower and returns its URI.
func (b *bench) attach(ctx context.Context) (*exec.Cmd, string, error) {
	// On loopback TCP, as the measurements before the Unix-socket default
	// were (rialto attach's default is a Unix socket).
	cmd := b.r.Command(ctx, b.borrower, b.bin, "attach", b.lease.ID, "--listen", "127.0.0.1:0")
	cmd.Env = b.env
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	br := bufio.NewReader(out)
	line, err := br.ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, "", fmt.Errorf("attach: %w", err)
	}
	go io.Copy(io.Discard, br)
	return cmd, strings.TrimSpace(line), nil
}

// fioResult is one fio run's latencies (µs) and IOPS.
type fioResult struct {
	readP99, writeP99, readP50, writeP50, writeMax, iops float64
	errors                                               int
}

func (b *bench) fioCmd(ctx context.Context) *exec.Cmd {
	return b.r.Command(ctx, b.borrower, "fio", "--name=lat", "--ioengine=nbd", "--uri="+b.attURI, "--rw=randrw", "--rwmixread=70",
		"--bs=4k", "--iodepth=1", "--time_based", "--runtime="+strconv.Itoa(b.fioSecs), "--size="+strconv.FormatInt(b.sizeMiB, 10)+"m",
		"--randrepeat=0", "--output-format=json")
}

func (b *bench) fio(ctx context.Context) (fioResult, error) {
	out, err := b.fioCmd(ctx).Output()
	if err != nil {
		return fioResult{}, fmt.Errorf("fio: %w", err)
	}
	return parseFio(out)
}

func parseFio(out []byte) (fioResult, error) {
	var j struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  fioSide
			Write fioSide
		} `json:"jobs"`
	}
	// fio may print notes before the JSON.
	if i := strings.IndexByte(string(out), '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &j); err != nil || len(j.Jobs) == 0 {
		return fioResult{}, fmt.Errorf("fio output: %v", err)
	}
	jb := j.Jobs[0]
	return fioResult{readP99: jb.Read.pct("99.000000"), writeP99: jb.Write.pct("99.000000"), readP50: jb.Read.pct("50.000000"),
		writeP50: jb.Write.pct("50.000000"), writeMax: jb.Write.ClatNs.Max / 1e3, iops: jb.Read.IOPS + jb.Write.IOPS, errors: jb.Error}, nil
}

type fioSide struct {
	IOPS   float64 `json:"iops"`
	ClatNs struct {
		Max        float64            `json:"max"`
		Percentile map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
}

func (s fioSide) pct(k string) float64 { return s.ClatNs.Percentile[k] / 1e3 }

// moveUnderFio starts fio on the borrower, moves the lease to the other
// lender a second into it, and waits for both.
func (b *bench) moveUnderFio(ctx context.Context) (moveResult, error) {
	var x moveResult
	cl := b.r.Client()
	l, err := cl.Lease(ctx, b.lease.ID)
	if err != nil {
		return x, err
	}
	from, to := b.lenders[0], b.lenders[1]
	if b.names[l.NodeID] == b.lenders[1].Name {
		from, to = to, from
	}
	x.From, x.To = from.Name, to.Name
	fio := b.fioCmd(ctx)
	var fioOut strings.Builder
	fio.Stdout = &fioOut
	if err := fio.Start(); err != nil {
		return x, err
	}
	defer func() {
		if fio.ProcessState == nil {
			fio.Process.Kill()
			fio.Wait()
		}
	}()
	t := time.NewTimer(time.Second)
	select {
	case <-ctx.Done():
		t.Stop()
		return x, ctx.Err()
	case <-t.C:
	}
	before, err := b.counters()
	if err != nil {
		return x, err
	}
	s0 := stats.SampleCPU()
	cmd := exec.CommandContext(ctx, b.bin, "lease", "move", b.lease.ID, "--to", to.Name)
	cmd.Env = b.env
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	x.Seconds = time.Since(t0).Seconds()
	if err != nil {
		return x, fmt.Errorf("lease move: %w: %s", err, out)
	}
	x.Steal = s0.StealSince()
	after, err := b.counters()
	if err != nil {
		return x, err
	}
	mib := func(d int64) float64 { return float64(d) / (1 << 20) }
	x.SrcOutMiB = mib(after[from.Name].FromHost - before[from.Name].FromHost)
	x.DstInMiB = mib(after[to.Name].ToHost - before[to.Name].ToHost)
	x.BorrowerMiB = mib(after[b.borrower.Name].ToHost - before[b.borrower.Name].ToHost + after[b.borrower.Name].FromHost - before[b.borrower.Name].FromHost)
	x.MigrationMiBs = float64(b.sizeMiB) / x.Seconds
	ms, err := cl.Moves(ctx, b.lease.ID)
	if err != nil || len(ms) == 0 {
		return x, fmt.Errorf("moves: %v", err)
	}
	m := ms[len(ms)-1]
	if m.State != api.MoveDone {
		return x, fmt.Errorf("move %s: %s", m.State, m.Error)
	}
	x.CopiedMiB, x.Passes, x.HeldMs = float64(m.Copied)/(1<<20), m.Pass, m.HeldMillis
	if err := fio.Wait(); err != nil {
		return x, fmt.Errorf("fio during the move: %w", err)
	}
	f, err := parseFio([]byte(fioOut.String()))
	if err != nil {
		return x, err
	}
	if f.errors != 0 {
		return x, fmt.Errorf("fio saw errors during the move (%d)", f.errors)
	}
	x.ReadP99Us, x.WriteP99Us, x.ReadP50Us, x.WriteP50Us, x.WriteMaxUs, x.FioIOPS = f.readP99, f.writeP99, f.readP50, f.writeP50, f.writeMax, f.iops
	return x, nil
}

func (b *bench) counters() (map[string]netns.Counters, error) {
	m := map[string]netns.Counters{}
	for _, n := range b.r.Agents() {
		c, err := b.r.Counters(n)
		if err != nil {
			return nil, err
		}
		m[n.Name] = c
	}
	return m, nil
}

// iperfCeiling measures the from → to link ceiling with iperf3 (MiB/s).
func iperfCeiling(ctx context.Context, r *rack.Rack, from, to rack.Node, secs int) (float64, error) {
	on := func(n rack.Node) iperf.Command {
		return func(ctx context.Context, args ...string) *exec.Cmd { return r.Command(ctx, n, "iperf3", args...) }
	}
	// The server listens on the bridge, which reaches every namespace.
	bps, err := iperf.Measure(ctx, on(to), on(from), to.Addr.String(), 5299, secs)
	if err != nil {
		return 0, err
	}
	return bps / 8 / (1 << 20), nil
}

func report(path, rate string, sizeMiB int64, fioSecs, iperfSecs, reps int, res []moveResult) error {
	col := func(f func(moveResult) float64) []float64 {
		var out []float64
		for _, x := range res {
			out = append(out, f(x))
		}
		return out
	}
	med := func(f func(moveResult) float64) float64 { return stats.Median(col(f)) }
	ratio := med(func(x moveResult) float64 { return x.MigrationMiBs / x.CeilingMiBps })
	var b strings.Builder
	fmt.Fprintf(&b, "## Live migration of a block lease (`rialto lease move`)\n\n")
	fmt.Fprintf(&b, "Measured %s by `bench/move/run.sh`. An emulated rack (internal/rack): `rialto server` and three `rialto agent`\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "processes, each in its own network namespace, every agent's link shaped in both directions with tc tbf at %s; state\n", rate)
	fmt.Fprintf(&b, "and disk images on tmpfs. node1 and node2 lend block devices; a %d MiB block lease (created through the API, filled with\n", sizeMiB)
	fmt.Fprintf(&b, "random bytes) moves from one to the other in each repetition (`rialto lease move LEASE --to NODE`, alternating\n")
	fmt.Fprintf(&b, "direction); node3 borrows it through `rialto attach` and runs fio on it (4 KiB random reads and writes, 70%% reads,\n")
	fmt.Fprintf(&b, "queue depth 1, %d s) once without a move and once with a move started a second into the run. The link's ceiling\n", fioSecs)
	fmt.Fprintf(&b, "is iperf3 (one stream, %d s) between the two lenders. The three run in rotated order in each of %d repetitions;\n", iperfSecs, reps)
	fmt.Fprintf(&b, "figures are medians. This is the everyday consequence of the Device Lending paper (Markussen et al.): devices on\n")
	fmt.Fprintf(&b, "different lenders talking to each other directly — here a lender copying a lease to another while its borrower works.\n\n")
	fmt.Fprintf(&b, "| | median | runs |\n|---|---|---|\n")
	rows := []struct {
		name string
		f    func(moveResult) float64
		prec int
	}{
		{"migration, MiB/s (lease size ÷ time of `rialto lease move`)", func(x moveResult) float64 { return x.MigrationMiBs }, 1},
		{"link ceiling (iperf3), MiB/s", func(x moveResult) float64 { return x.CeilingMiBps }, 1},
		{"migration ÷ ceiling", func(x moveResult) float64 { return x.MigrationMiBs / x.CeilingMiBps }, 2},
		{"move time, s", func(x moveResult) float64 { return x.Seconds }, 2},
		{"bytes sent by the source, MiB (every pass)", func(x moveResult) float64 { return x.CopiedMiB }, 1},
		{"passes", func(x moveResult) float64 { return float64(x.Passes) }, 0},
		{"writes held for the last pass and the switch, ms", func(x moveResult) float64 { return x.HeldMs }, 1},
		{"source link out during the move, MiB", func(x moveResult) float64 { return x.SrcOutMiB }, 1},
		{"destination link in during the move, MiB", func(x moveResult) float64 { return x.DstInMiB }, 1},
		{"borrower link (both ways) during the move, MiB", func(x moveResult) float64 { return x.BorrowerMiB }, 1},
		{"borrower read latency p50, µs, without a move", func(x moveResult) float64 { return x.BaseReadP50 }, 0},
		{"borrower read latency p50, µs, with a move", func(x moveResult) float64 { return x.ReadP50Us }, 0},
		{"borrower read latency p99, µs, without a move", func(x moveResult) float64 { return x.BaseReadP99 }, 0},
		{"borrower read latency p99, µs, with a move", func(x moveResult) float64 { return x.ReadP99Us }, 0},
		{"borrower write latency p50, µs, without a move", func(x moveResult) float64 { return x.BaseWriteP50 }, 0},
		{"borrower write latency p50, µs, with a move", func(x moveResult) float64 { return x.WriteP50Us }, 0},
		{"borrower write latency p99, µs, without a move", func(x moveResult) float64 { return x.BaseWriteP99 }, 0},
		{"borrower write latency p99, µs, with a move", func(x moveResult) float64 { return x.WriteP99Us }, 0},
		{"borrower write latency max, µs, without a move", func(x moveResult) float64 { return x.BaseWriteMax }, 0},
		{"borrower write latency max, µs, with a move", func(x moveResult) float64 { return x.WriteMaxUs }, 0},
		{"borrower IOPS (reads and writes), without a move", func(x moveResult) float64 { return x.BaseIOPS }, 0},
		{"borrower IOPS (reads and writes), with a move", func(x moveResult) float64 { return x.FioIOPS }, 0},
		{"CPU steal during the move, %", func(x moveResult) float64 { return x.Steal }, 1},
	}
	for _, row := range rows {
		fmt.Fprintf(&b, "| %s | %.*f | %s |\n", row.name, row.prec, med(row.f), stats.Join(col(row.f), row.prec))
	}
	fmt.Fprintln(&b)
	goal := "met"
	if ratio < 0.8 {
		goal = "not met"
	}
	fmt.Fprintf(&b, "Goal (issue: live migration): migration throughput ≥ 80%% of the link's iperf3 ceiling — %s: %.0f%% (median of the\n", goal, 100*ratio)
	fmt.Fprintf(&b, "ratios). The time of `rialto lease move` counts everything: placement, the lenders' setup, every pass and the switch\n")
	fmt.Fprintf(&b, "(the source wipes the old range after it answers the commit); the borrower's own traffic shares the source's link during the move. The copied bytes leave the\n")
	fmt.Fprintf(&b, "source's link and enter the destination's; the borrower's link carries only its own I/O (table). The borrower's\n")
	fmt.Fprintf(&b, "latency \"with a move\" is over the whole fio run, which the move covers about half of: the copy fills the source's\n")
	fmt.Fprintf(&b, "shaped link, so the borrower's requests queue behind it in the shaper (p99), and its writes wait while they are held\n")
	fmt.Fprintf(&b, "for the last pass and the switch (write max). The copy runs at the link's full rate; a cap on it (not implemented)\n")
	fmt.Fprintf(&b, "would trade migration time for the borrower's tail latency.\n\n")
	fmt.Fprintf(&b, "Commands (NODE3 is the borrower's namespace; LEASE and NODE are the run's):\n\n```\n")
	fmt.Fprintf(&b, "bench/move/run.sh   # RATE=%s SIZE_MIB=%d REPS=%d FIO_SECS=%d\n", rate, sizeMiB, reps, fioSecs)
	fmt.Fprintf(&b, "ip netns exec NODE3 rialto attach LEASE --listen 127.0.0.1:0\n")
	fmt.Fprintf(&b, "ip netns exec NODE3 fio --name=lat --ioengine=nbd --uri=ATTACH_URI --rw=randrw --rwmixread=70 --bs=4k --iodepth=1 \\\n")
	fmt.Fprintf(&b, "    --time_based --runtime=%d --size=%dm --randrepeat=0 --output-format=json\n", fioSecs, sizeMiB)
	fmt.Fprintf(&b, "rialto lease move LEASE --to NODE\n")
	fmt.Fprintf(&b, "ip netns exec NODE2 iperf3 -s -p 5299; ip netns exec NODE1 iperf3 -c NODE2 -p 5299 -t %d -J\n", iperfSecs)
	fmt.Fprintf(&b, "```\n")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
