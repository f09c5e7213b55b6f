// Command block is the block data-plane benchmark of bench/block/run.sh:
// Rialto through leases of `rialto agent` processes (a dedicated lease, a
// shared partition lease, a 3-way composed lease through `rialto attach`,
// and optionally the dedicated lease through `rialto attach`) against
// nbdkit's file plugin, nbd-server and qemu-nbd, every export the same size
// on tmpfs, measured interleaved with nbdcopy and fio's nbd engine. It
// records steal, the serving processes' CPU and the client's CPU per run
// and writes a Markdown fragment with medians, ratios against the best peer
// and the goals.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
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
		fmt.Fprintln(os.Stderr, "bench/block:", err)
		os.Exit(1)
	}
}

// metric is one row of the table.
type metric struct {
	Key   string // for -metrics
	Name  string
	Unit  string
	Lower bool // lower is better (latencies)
	// Goal: "best" (≥ 1.0× the best peer) or "nbdkit" (≤ nbdkit's).
	Goal string
	Cmd  string // the client command, for the fragment
	Note string // which figure of its output
	run  func(ctx context.Context, b *bench, t *targets.Target) (sample, error)
}

// sample is what one client run measured.
type sample struct {
	value     float64 // in the metric's unit
	clientCPU float64 // client CPU seconds (rusage of nbdcopy or fio)
	iops      float64 // fio: I/Os per second of the data direction
	bytes     float64 // nbdcopy: bytes moved
	extra     string  // secondary figure (e.g. the other latency), for the runs table
}

var metrics = []metric{
	{Key: "copyread", Name: "nbdcopy read", Unit: "MiB/s", Goal: "best", Cmd: "nbdcopy URI null:",
		run: func(ctx context.Context, b *bench, t *targets.Target) (sample, error) {
			return b.nbdcopy(ctx, t.URI, "null:")
		}},
	{Key: "copywrite", Name: "nbdcopy write", Unit: "MiB/s", Goal: "best", Cmd: "nbdcopy SRC URI",
		run: func(ctx context.Context, b *bench, t *targets.Target) (sample, error) {
			return b.nbdcopy(ctx, b.src, t.URI)
		}},
	{Key: "rr1", Name: "4K randread QD1", Unit: "IOPS", Goal: "best", Cmd: "fio --rw=randread --bs=4k --iodepth=1",
		run: func(ctx context.Context, b *bench, t *targets.Target) (sample, error) {
			return b.fio(ctx, t, "randread", "4k", 1, false, "iops")
		}},
	{Key: "rr32", Name: "4K randread QD32", Unit: "IOPS", Goal: "best", Cmd: "fio --rw=randread --bs=4k --iodepth=32",
		run: func(ctx context.Context, b *bench, t *targets.Target) (sample, error) {
			return b.fio(ctx, t, "randread", "4k", 32, false, "iops")
		}},
	{Key: "rw32", Name: "4K randwrite QD32", Unit: "IOPS", Goal: "best", Cmd: "fio --rw=randwrite --bs=4k --iodepth=32",
		run: func(ctx context.Context, b *bench, t *targets.Target) (sample, error) {
			return b.fio(ctx, t, "randwrite", "4k", 32, false, "iops")
		}},
	{Key: "sw32", Name: "1M seq write QD32", Unit: "MiB/s", Goal: "best", Cmd: "fio --rw=write --bs=1M --iodepth=32",
		run: func(ctx context.Context, b *bench, t *targets.Target) (sample, error) {
			return b.fio(ctx, t, "write", "1M", 32, false, "bw")
		}},
	{Key: "w1", Name: "8K randwrite QD1 write p50", Unit: "µs", Lower: true, Goal: "nbdkit", Cmd: "fio --rw=randwrite --bs=8k --iodepth=1", Note: "lat p50: submission and completion",
		run: func(ctx context.Context, b *bench, t *targets.Target) (sample, error) {
			return b.fio(ctx, t, "randwrite", "8k", 1, false, "lat")
		}},
	{Key: "flush", Name: "8K randwrite QD1 + fsync FLUSH p50", Unit: "µs", Lower: true, Goal: "nbdkit", Cmd: "fio --rw=randwrite --bs=8k --iodepth=1 --fsync=1", Note: "sync p50",
		run: func(ctx context.Context, b *bench, t *targets.Target) (sample, error) {
			return b.fio(ctx, t, "randwrite", "8k", 1, true, "sync")
		}},
}

type bench struct {
	work       string
	src        string
	sizeMiB    int64
	fioRuntime int
	fioRamp    int
}

// result is one measurement.
type result struct {
	target, metric string
	rep            int
	s              sample
	err            error
	steal          float64
	serverCPU      float64
	wall           float64
	load           float64
}

func run() error {
	reps := flag.Int("reps", 5, "repetitions (every target runs once per metric per repetition, in rotating order)")
	sizeMiB := flag.Int64("size-mib", 900, "size of every export (MiB; a multiple of 3)")
	fioRuntime := flag.Int("fio-runtime", 4, "seconds of each fio run (after the ramp)")
	fioRamp := flag.Int("fio-ramp", 1, "fio ramp time, seconds")
	bin := flag.String("bin", "bin/rialto", "the rialto binary")
	peersFlag := flag.String("peers", "nbdkit,nbd-server,qemu-nbd,nbdkit-proxy", "peer servers: nbdkit, nbd-server, qemu-nbd, and nbdkit-proxy (nbdkit's nbd plugin in front of its file plugin: a reference row, never a goal's best peer)")
	rialtoFlag := flag.String("rialto", "dedicated,shared,composed", "Rialto targets: dedicated, shared, composed, attach, composed-unix (the composed lease through `rialto attach --socket`, an extra row), attach-unix (a dedicated lease through `rialto attach --socket`, an extra row)")
	metricsFlag := flag.String("metrics", "", "metric keys to run (default all): copyread,copywrite,rr1,rr32,rw32,sw32,w1,flush")
	out := flag.String("out", "docs/bench/block.md", "Markdown fragment to write")
	workRoot := flag.String("work", "/dev/shm", "tmpfs directory for the images")
	flag.Parse()
	if *sizeMiB%3 != 0 {
		return errors.New("-size-mib must be a multiple of 3")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	for _, tool := range []string{"nbdkit", "qemu-nbd", "nbd-server", "nbdcopy", "nbdinfo", "fio"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not installed", tool)
		}
	}
	rialtoBin, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	ms := metrics
	if *metricsFlag != "" {
		ms = nil
		for _, k := range strings.Split(*metricsFlag, ",") {
			i := slices.IndexFunc(metrics, func(m metric) bool { return m.Key == k })
			if i < 0 {
				return fmt.Errorf("unknown metric %q", k)
			}
			ms = append(ms, metrics[i])
		}
	}

	work, err := os.MkdirTemp(*workRoot, "rialto-bench-block.")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	b := &bench{work: work, sizeMiB: *sizeMiB, fioRuntime: *fioRuntime, fioRamp: *fioRamp}
	b.src = filepath.Join(work, "src.img")
	if err := randomFile(b.src, *sizeMiB<<20); err != nil {
		return err
	}
	peerImg := filepath.Join(work, "peer.img")
	if err := randomFile(peerImg, *sizeMiB<<20); err != nil {
		return err
	}

	var all []*targets.Target
	for _, p := range split(*peersFlag) {
		t, stopPeer, err := targets.StartPeer(ctx, p, work, peerImg)
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
	rnames := split(*rialtoFlag)
	ls, err := targets.StartRialto(ctx, c, work, *sizeMiB, rnames)
	if err != nil {
		return err
	}
	for _, n := range rnames {
		all = append(all, ls.Targets[n])
	}
	// Every export holds the same random data before anything is
	// measured (a lease's device starts empty; reading holes would flatter).
	for _, t := range all {
		if t.Rialto {
			fmt.Fprintf(os.Stderr, "filling %s\n", t.Name)
			if _, err := b.nbdcopy(ctx, b.src, t.URI); err != nil {
				return fmt.Errorf("fill %s: %w", t.Name, err)
			}
		}
	}

	loadStart := stats.Load()
	var res []result
	i := 0
	for rep := 1; rep <= *reps; rep++ {
		for _, m := range ms {
			k := i % len(all)
			i++
			order := append(slices.Clone(all[k:]), all[:k]...)
			for _, t := range order {
				if err := ctx.Err(); err != nil {
					return err
				}
				r := b.measure(ctx, t, m, rep)
				res = append(res, r)
				if r.err != nil {
					fmt.Fprintf(os.Stderr, "rep %d %-34s %-10s ERROR %v\n", rep, m.Name, t.Name, r.err)
				} else {
					fmt.Fprintf(os.Stderr, "rep %d %-34s %-10s %10.1f %s (steal %.1f%%, server CPU %.2f s)\n", rep, m.Name, t.Name, r.s.value, m.Unit, r.steal, r.serverCPU)
				}
			}
		}
	}
	rep := report{reps: *reps, sizeMiB: *sizeMiB, fioRuntime: *fioRuntime, fioRamp: *fioRamp, targets: all, metrics: ms,
		res: res, commands: c.Commands, loadStart: loadStart, loadEnd: stats.Load()}
	text := rep.markdown()
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	fmt.Fprint(os.Stderr, text)
	return os.WriteFile(*out, []byte(text), 0o644)
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

// measure runs one client command against t, with steal and the serving
// processes' CPU around it.
func (b *bench) measure(ctx context.Context, t *targets.Target, m metric, rep int) result {
	load := stats.Load()
	cs := stats.SampleCPU()
	c0 := t.CPU()
	start := time.Now()
	s, err := m.run(ctx, b, t)
	wall := time.Since(start).Seconds()
	// A server that forks per connection (nbd-server) charges the child's
	// CPU to the parent when it reaps it: give it a moment.
	if t.Name == "nbd-server" {
		time.Sleep(50 * time.Millisecond)
	}
	return result{target: t.Name, metric: m.Name, rep: rep, s: s, err: err, steal: cs.StealSince(),
		serverCPU: t.CPU() - c0, wall: wall, load: load}
}

// nbdcopy copies src to dst and returns MiB/s.
func (b *bench) nbdcopy(ctx context.Context, src, dst string) (sample, error) {
	start := time.Now()
	cmd := exec.CommandContext(ctx, "nbdcopy", src, dst)
	out, err := cmd.CombinedOutput()
	el := time.Since(start).Seconds()
	if err != nil {
		// The URI names a secret export: report the output only.
		return sample{}, fmt.Errorf("nbdcopy: %w: %s", err, out)
	}
	cpu := (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	return sample{value: float64(b.sizeMiB) / el, clientCPU: cpu, bytes: float64(b.sizeMiB << 20)}, nil
}

// fioJob is the part of fio's JSON output the benchmark reads.
type fioJob struct {
	Read, Write struct {
		IOPS    float64 `json:"iops"`
		BW      float64 `json:"bw_bytes"`
		TotalIO float64 `json:"total_ios"`
		Clat    fioLat  `json:"clat_ns"`
		Lat     fioLat  `json:"lat_ns"`
	}
	Sync struct {
		TotalIO float64 `json:"total_ios"`
		Lat     fioLat  `json:"lat_ns"`
	} `json:"sync"`
	UsrCPU float64 `json:"usr_cpu"`
	SysCPU float64 `json:"sys_cpu"`
}

type fioLat struct {
	Mean       float64            `json:"mean"`
	Percentile map[string]float64 `json:"percentile"`
}

func (l fioLat) p50us() float64 {
	v, ok := l.Percentile["50.000000"]
	if !ok {
		return math.NaN()
	}
	return v / 1000
}

// fio runs fio's nbd engine against t (the URI goes in a job file, not on
// the command line) and returns the figure named by want: iops, bw
// (MiB/s), lat (p50 µs of the data direction, submission included: fio's
// clat leaves out the time a request takes to submit, which a slower
// server can shift there) or sync (FLUSH p50 µs).
func (b *bench) fio(ctx context.Context, t *targets.Target, rw, bs string, qd int, fsync bool, want string) (sample, error) {
	job := filepath.Join(b.work, "job.fio")
	out := filepath.Join(b.work, "fio.json")
	text := fmt.Sprintf("[j]\nioengine=nbd\nuri=%s\nrw=%s\nbs=%s\niodepth=%d\nruntime=%d\nramp_time=%d\ntime_based=1\nlat_percentiles=1\nclat_percentiles=1\n",
		t.URI, rw, bs, qd, b.fioRuntime, b.fioRamp)
	if fsync {
		text += "fsync=1\n"
	}
	if err := os.WriteFile(job, []byte(text), 0o600); err != nil {
		return sample{}, err
	}
	os.Remove(out)
	cmd := exec.CommandContext(ctx, "fio", "--output-format=json", "--output="+out, job)
	msg, err := cmd.CombinedOutput()
	if err != nil {
		return sample{}, fmt.Errorf("fio: %w: %s", err, msg)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		return sample{}, err
	}
	// fio writes its own messages ("fio: connected to NBD server") into
	// the output file before the JSON.
	if i := strings.IndexByte(string(raw), '{'); i > 0 {
		raw = raw[i:]
	}
	var doc struct {
		Jobs []fioJob `json:"jobs"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc.Jobs) != 1 {
		return sample{}, fmt.Errorf("fio output: %v: %.200s", err, raw)
	}
	j := doc.Jobs[0]
	dir := j.Read
	if rw != "read" && rw != "randread" {
		dir = j.Write
	}
	s := sample{clientCPU: (j.UsrCPU + j.SysCPU) / 100 * float64(b.fioRuntime), iops: dir.IOPS}
	switch want {
	case "iops":
		s.value = dir.IOPS
		s.extra = fmt.Sprintf("p50 %.1f µs", dir.Lat.p50us())
	case "bw":
		s.value = dir.BW / (1 << 20)
	case "lat":
		s.value = dir.Lat.p50us()
		s.extra = fmt.Sprintf("clat p50 %.1f µs, %.0f IOPS", dir.Clat.p50us(), dir.IOPS)
	case "sync":
		s.value = j.Sync.Lat.p50us()
		s.extra = fmt.Sprintf("write clat p50 %.1f µs, mean FLUSH %.1f µs, %.0f writes/s", dir.Clat.p50us(), j.Sync.Lat.Mean/1000, dir.IOPS)
	}
	if s.value == 0 || math.IsNaN(s.value) {
		return s, fmt.Errorf("fio measured nothing (%s %s QD%d)", rw, bs, qd)
	}
	return s, nil
}
