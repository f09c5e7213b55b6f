// Command devread measures devices reading devices: an accelerator slot
// hashing a range of a block lease that lives on another lender, reading
// it from the lender itself (`rialto accel run --input-lease`), against the
// same task fed through the borrower (`--relay`: the borrower reads the
// range, then writes it into the slot), in one run over an emulated rack
// whose links are shaped with tc tbf. It is driven by bench/devread/run.sh.
//
// The rack (internal/rack) runs `rialto server` and three `rialto agent`
// processes, each in its own network namespace: node1 lends the block
// lease, node2 the accelerator slot (role sha256), node3 is the borrower
// that runs the CLI. Each run reads the byte counters of the three links
// before and after, so the report says where the bytes went, beside the
// time. Variants run interleaved in every repetition; figures are medians.
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
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
	"github.com/rialto-project/rialto/bench/internal/stats"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/rack"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "devread:", err)
		os.Exit(1)
	}
}

// variant is one way of feeding the slot.
type variant struct {
	Name string
	Args []string // added to accel run's
	What string
}

var variants = []variant{
	{"direct", nil, "the slot reads the range from the block lender itself (`--input-lease`)"},
	{"relay, pipelined", []string{"--relay"}, "the borrower reads the range and writes it into the slot, 4 MiB chunks, 4 in flight (`--relay`)"},
	{"relay, store and forward", []string{"--relay", "--relay-chunk", "RANGE"}, "the borrower reads the whole range, then writes it (`--relay --relay-chunk` = the range)"},
}

type result struct {
	Variant string
	Rep     int
	Seconds float64
	CPU     float64 // the borrower process's CPU seconds
	Steal   float64 // % of all CPU time stolen during the run
	Load    float64 // 1-minute load average at the start
	// MiB over each link: out of the lender, into the appliance, into and
	// out of the borrower.
	LenderOut, ApplIn, BorrowerIn, BorrowerOut float64
	// Phases: the CLI's own (its -o json: input in slot memory, then the
	// task and its output; Setup is the wall time before and after them:
	// process start, the API's lease lookups, the slot connection) and the
	// appliance's (its debug log: the LOAD's volume open and transfer, the
	// role's compute, Streamed when it overlapped the transfer).
	Setup, Input, Task      float64
	Open, Transfer, Compute float64
	Streamed                bool
}

func run() error {
	bin := flag.String("bin", "bin/rialto", "the rialto binary")
	rate := flag.String("rate", "200mbit", "tc tbf rate of every agent's link")
	sizeMiB := flag.Int64("size-mib", 64, "the range the slot hashes (MiB)")
	reps := flag.Int("reps", 5, "repetitions (variants interleaved within each)")
	out := flag.String("out", "docs/bench/devread.md", "Markdown fragment to write")
	logLevel := flag.String("log-level", "debug", "the rack processes' --log-level (debug: the appliance's phase timings, read from its log)")
	iperfSecs := flag.Int("iperf-secs", 3, "seconds of the iperf3 link ceiling measurement (0: skip)")
	flag.Parse()
	if *sizeMiB < 1 || *reps < 1 {
		return fmt.Errorf("-size-mib and -reps must be positive")
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	*bin = abs
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	work, err := os.MkdirTemp("/dev/shm", "rialto-bench-devread.")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	size := *sizeMiB << 20
	slotMem := fmt.Sprintf("%dMiB", *sizeMiB+8)
	r, err := rack.Start(ctx, rack.Config{Binary: *bin, StateDir: filepath.Join(work, "rack"), Agents: 3, Disks: 1,
		DiskSize: size + 32<<20, AccelSlots: 1, LinkRate: *rate, AgentArgs: []string{"--slot-memory", slotMem}, LogLevel: *logLevel,
		// The paths compared are the plaintext ones (bench/tls measures TLS).
		InsecureDataplane: true})
	if err != nil {
		return err
	}
	defer r.Close()
	lender, appl, borrower := r.Agent(0), r.Agent(1), r.Agent(2)
	cl := r.Client()
	blk, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: size + 16<<20, Affinity: []string{lender.Name}})
	if err != nil {
		return err
	}
	acc, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256", Affinity: []string{appl.Name}})
	if err != nil {
		return err
	}
	// The range: random bytes at 16 MiB into the lease.
	data := make([]byte, size)
	rand.Read(data)
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	nc, err := nbd.DialURI(ctx, blk.URI)
	if err != nil {
		return err
	}
	if _, err := nc.WriteAtContext(ctx, data, 16<<20, true); err != nil {
		nc.Close()
		return err
	}
	nc.Close()
	data = nil

	rng := fmt.Sprintf("%s:16MiB:%dMiB", blk.ID, *sizeMiB)
	base := []string{"accel", "run", acc.ID, "sha256", "--input-lease", rng, "-o", "json"}
	cmds := map[string]string{}
	var res []result
	for rep := 1; rep <= *reps; rep++ {
		// Rotate the order so that no variant always runs first.
		for k := range variants {
			v := variants[(k+rep-1)%len(variants)]
			args := append(append([]string(nil), base...), v.Args...)
			for i, a := range args {
				if a == "RANGE" {
					args[i] = fmt.Sprintf("%dMiB", *sizeMiB)
				}
			}
			cmds[v.Name] = "ip netns exec NODE3 rialto " + strings.Join(args, " ")
			x, err := measure(ctx, r, []rack.Node{lender, appl, borrower}, *bin, args, want, appl.Log)
			if err != nil {
				return fmt.Errorf("%s: %w", v.Name, err)
			}
			x.Variant, x.Rep = v.Name, rep
			fmt.Fprintf(os.Stderr, "rep %d %s: %.2f s, %.1f MiB/s; setup %.2f, input %.2f (open %.3f, transfer %.2f), task %.2f (compute %.2f, streamed %v); lender out %.1f MiB, appliance in %.1f MiB, borrower in %.1f / out %.1f MiB (load %.1f, steal %.1f%%)\n",
				rep, v.Name, x.Seconds, float64(*sizeMiB)/x.Seconds, x.Setup, x.Input, x.Open, x.Transfer, x.Task, x.Compute, x.Streamed,
				x.LenderOut, x.ApplIn, x.BorrowerIn, x.BorrowerOut, x.Load, x.Steal)
			res = append(res, x)
		}
	}
	var ceiling float64
	if *iperfSecs > 0 {
		if ceiling, err = iperfCeiling(ctx, r, lender, appl, *iperfSecs); err != nil {
			fmt.Fprintln(os.Stderr, "devread: iperf3 ceiling not measured:", err)
		}
	}
	return report(*out, *rate, *sizeMiB, slotMem, *reps, *iperfSecs, ceiling, res, cmds)
}

// measure runs accel run once in the borrower's namespace.
func measure(ctx context.Context, r *rack.Rack, nodes []rack.Node, bin string, args []string, want, applLog string) (result, error) {
	logFrom := int64(0)
	if st, err := os.Stat(applLog); err == nil {
		logFrom = st.Size()
	}
	var before []netns.Counters
	for _, n := range nodes {
		c, err := r.Counters(n)
		if err != nil {
			return result{}, err
		}
		before = append(before, c)
	}
	s0 := stats.SampleCPU()
	load := stats.Load()
	cmd := r.Command(ctx, nodes[2], bin, args...)
	cmd.Env = append(os.Environ(), r.Env()...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	t0 := time.Now()
	out, err := cmd.Output()
	secs := time.Since(t0).Seconds()
	if err != nil {
		return result{}, fmt.Errorf("%v: %s", err, stderr.String())
	}
	var cli struct {
		Output       []byte  `json:"output"`
		Seconds      float64 `json:"seconds"`
		InputSeconds float64 `json:"input_seconds"`
		TaskSeconds  float64 `json:"task_seconds"`
	}
	if err := json.Unmarshal(out, &cli); err != nil {
		return result{}, fmt.Errorf("accel run's output: %w", err)
	}
	if got := hex.EncodeToString(cli.Output); got != want {
		return result{}, fmt.Errorf("digest %s, want %s", got, want)
	}
	s1 := stats.SampleCPU()
	var after []netns.Counters
	for _, n := range nodes {
		c, err := r.Counters(n)
		if err != nil {
			return result{}, err
		}
		after = append(after, c)
	}
	mib := func(d int64) float64 { return float64(d) / (1 << 20) }
	x := result{Seconds: secs, Load: load, Steal: s0.StealPercent(s1),
		CPU:        (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds(),
		LenderOut:  mib(after[0].FromHost - before[0].FromHost),
		ApplIn:     mib(after[1].ToHost - before[1].ToHost),
		BorrowerIn: mib(after[2].ToHost - before[2].ToHost), BorrowerOut: mib(after[2].FromHost - before[2].FromHost),
		Setup: secs - cli.Seconds, Input: cli.InputSeconds, Task: cli.TaskSeconds}
	if err := applPhases(applLog, logFrom, &x); err != nil {
		return result{}, err
	}
	return x, nil
}

// applPhases reads the appliance's debug lines of one run (from offset
// on): the LOAD's "open_s", transfer ("seconds" less "open_s") and
// streamed compute ("stream_compute_s"), or the task's compute.
func applPhases(path string, from int64, x *result) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if from > int64(len(b)) {
		from = 0
	}
	field := func(line, key string) (string, bool) {
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, key+"="); ok {
				return v, true
			}
		}
		return "", false
	}
	num := func(line, key string) float64 {
		v, _ := field(line, key)
		f, _ := strconv.ParseFloat(v, 64)
		return f
	}
	for _, line := range strings.Split(string(b[from:]), "\n") {
		switch {
		case strings.Contains(line, "loaded from a block lease"):
			x.Open, x.Transfer = num(line, "open_s"), num(line, "seconds")-num(line, "open_s")
			if v, _ := field(line, "streamed"); v == "true" {
				x.Streamed, x.Compute = true, num(line, "stream_compute_s")
			}
		case strings.Contains(line, "ran a task"):
			if v, _ := field(line, "streamed"); v != "true" {
				x.Compute = num(line, "seconds")
			}
		}
	}
	return nil
}

// iperfCeiling measures the from → to link ceiling with iperf3 (MiB/s).
func iperfCeiling(ctx context.Context, r *rack.Rack, from, to rack.Node, secs int) (float64, error) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		return 0, err
	}
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

func report(path, rate string, sizeMiB int64, slotMem string, reps, iperfSecs int, ceiling float64, res []result, cmds map[string]string) error {
	by := map[string][]result{}
	for _, x := range res {
		by[x.Variant] = append(by[x.Variant], x)
	}
	col := func(v string, f func(result) float64) []float64 {
		var out []float64
		for _, x := range by[v] {
			out = append(out, f(x))
		}
		return out
	}
	med := func(v string, f func(result) float64) float64 { return stats.Median(col(v, f)) }
	secs := func(x result) float64 { return x.Seconds }
	direct := med("direct", secs)

	var b strings.Builder
	fmt.Fprintf(&b, "## Devices reading devices (an accelerator reading a block lease directly vs through the borrower)\n\n")
	fmt.Fprintf(&b, "Measured %s by `bench/devread/run.sh` (bench/devread) at commit %s on %s. An emulated rack (internal/rack): `rialto server` and three\n", stats.Stamp(), stats.Commit("."), stats.Machine())
	fmt.Fprintf(&b, "`rialto agent` processes, each in its own network namespace, every agent's link shaped in both directions with\n")
	fmt.Fprintf(&b, "tc tbf at %s; state and disk images on tmpfs. node1 lends a block lease (created through the API, served by its agent),\n", rate)
	fmt.Fprintf(&b, "node2 an accelerator slot (%s of slot memory, role sha256), node3 is the borrower running `rialto accel run`.\n", slotMem)
	fmt.Fprintf(&b, "The task hashes %d MiB of random bytes of the block lease; every run's digest was checked against Go's\n", sizeMiB)
	fmt.Fprintf(&b, "sha256 of the bytes written. The variants run interleaved (order rotated) in each of %d repetitions; figures are medians.\n", reps)
	fmt.Fprintf(&b, "Link bytes are the veth counters of each agent's link (payload plus TCP/IP and protocol overhead), read before and after each run.\n")
	fmt.Fprintf(&b, "This is the Device Lending paper's (Markussen et al.) peer-to-peer case — a GPU reading an NVMe drive of\n")
	fmt.Fprintf(&b, "another host without the borrower relaying — over TCP instead of PCIe NTBs.\n\n")
	fmt.Fprintf(&b, "| path | seconds | MiB/s | time ÷ direct | lender link out MiB | appliance link in MiB | borrower link in / out MiB | borrower CPU s |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|\n")
	for _, v := range variants {
		s := med(v.Name, secs)
		fmt.Fprintf(&b, "| %s | %.2f | %.1f | %.2f× | %.1f | %.1f | %.1f / %.1f | %.2f |\n", v.Name, s, float64(sizeMiB)/s, s/direct,
			med(v.Name, func(x result) float64 { return x.LenderOut }), med(v.Name, func(x result) float64 { return x.ApplIn }),
			med(v.Name, func(x result) float64 { return x.BorrowerIn }), med(v.Name, func(x result) float64 { return x.BorrowerOut }),
			med(v.Name, func(x result) float64 { return x.CPU }))
	}
	fmt.Fprintln(&b)
	for _, v := range variants {
		fmt.Fprintf(&b, "- **%s**: %s.\n", v.Name, v.What)
	}
	fmt.Fprintln(&b)
	fmt.Fprintf(&b, "Where the time goes (medians; wall = setup + input + task). Setup: the `rialto accel run` process's start, its lease\n")
	fmt.Fprintf(&b, "lookups through the API and its slot connection. Input: until the range is in slot memory (the LOAD's reply, or the\n")
	fmt.Fprintf(&b, "relay's last write), split for the LOAD by the appliance's debug log into opening the block volume (dial and NBD\n")
	fmt.Fprintf(&b, "negotiation) and the transfer. Task: START to the output read back; compute is the role's own time in the appliance's log.\n\n")
	fmt.Fprintf(&b, "| path | wall s | setup s | input s | LOAD open / transfer s | task s | role compute s |\n|---|---|---|---|---|---|---|\n")
	for _, v := range variants {
		load, comp := "—", fmt.Sprintf("%.2f", med(v.Name, func(x result) float64 { return x.Compute }))
		if v.Name == "direct" {
			load = fmt.Sprintf("%.3f / %.2f", med(v.Name, func(x result) float64 { return x.Open }), med(v.Name, func(x result) float64 { return x.Transfer }))
			if by[v.Name][0].Streamed {
				comp += ", during the transfer"
			}
		}
		fmt.Fprintf(&b, "| %s | %.2f | %.2f | %.2f | %s | %.2f | %s |\n", v.Name, med(v.Name, secs), med(v.Name, func(x result) float64 { return x.Setup }),
			med(v.Name, func(x result) float64 { return x.Input }), load, med(v.Name, func(x result) float64 { return x.Task }), comp)
	}
	fmt.Fprintln(&b)
	transfer := med("direct", func(x result) float64 { return x.Transfer })
	if ceiling > 0 {
		fmt.Fprintf(&b, "Link ceiling in the same run (iperf3, one stream node1 → node2): %.1f MiB/s. The direct path's transfer ran at %.0f%% of it,\n",
			ceiling, 100*float64(sizeMiB)/transfer/ceiling)
		fmt.Fprintf(&b, "the whole command (process start to digest) at %.0f%%", 100*float64(sizeMiB)/direct/ceiling)
		if bps, err := netns.ParseRate(rate); err == nil {
			// The shaper counts frames: the payload's share of them is
			// what the lender's link counter says the range cost.
			wire := float64(bps) / 8 / (1 << 20)
			payload := wire * float64(sizeMiB) / med("direct", func(x result) float64 { return x.LenderOut })
			fmt.Fprintf(&b, " (iperf3's %d-second stream includes its own ramp; the shaper's %s is %.1f MiB/s of frames,\n", iperfSecs, rate, wire)
			fmt.Fprintf(&b, "%.1f MiB/s of payload at the direct path's overhead, and the transfer reached %.0f%% of that)", payload, 100*float64(sizeMiB)/transfer/payload)
		}
		fmt.Fprintf(&b, ".\n\n")
	}
	sf, pl := med("relay, store and forward", secs), med("relay, pipelined", secs)
	fmt.Fprintf(&b, "Goal (issue: devices reading devices): the direct path moves the bytes across one link instead of two and is faster\n")
	fmt.Fprintf(&b, "accordingly. Measured: directly, the range crossed the lender's and the appliance's links and %.1f MiB crossed the\n",
		med("direct", func(x result) float64 { return x.BorrowerIn + x.BorrowerOut }))
	fmt.Fprintf(&b, "borrower's; relayed, it crossed the borrower's link twice, in and out. The relay took %.2f× the direct path's time\n", sf/direct)
	fmt.Fprintf(&b, "store and forward (two transfers one after the other: the expected 2× of \"one link instead of two\") and %.2f× pipelined.\n", pl/direct)
	fmt.Fprintf(&b, "On these full-duplex links a pipelined relay overlaps its two transfers, so its input phase is one transfer plus a chunk's\n")
	fmt.Fprintf(&b, "latency (%.2f s against the direct LOAD's %.2f s), and its task then copies the input out of slot memory and hashes it\n",
		med("relay, pipelined", func(x result) float64 { return x.Input }), med("direct", func(x result) float64 { return x.Input }))
	fmt.Fprintf(&b, "(%.2f s). The direct path hashes each window as it lands in slot memory (roles that stream: sha256), so its task ends\n",
		med("relay, pipelined", func(x result) float64 { return x.Task }))
	fmt.Fprintf(&b, "with the transfer (%.2f s): the data lands where it is computed. Either way the direct path leaves the borrower's link and\n",
		med("direct", func(x result) float64 { return x.Task }))
	fmt.Fprintf(&b, "CPU free (table).\n\n")
	fmt.Fprintf(&b, "All runs, in run order:\n\n| path | runs s | steal %% | load | borrower CPU s |\n|---|---|---|---|---|\n")
	for _, v := range variants {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", v.Name, stats.Join(col(v.Name, secs), 2), stats.Join(col(v.Name, func(x result) float64 { return x.Steal }), 1),
			stats.Join(col(v.Name, func(x result) float64 { return x.Load }), 1), stats.Join(col(v.Name, func(x result) float64 { return x.CPU }), 2))
	}
	fmt.Fprintf(&b, "\nCommands (NODE3 is the borrower's namespace; LEASE IDs are the run's):\n\n```\n")
	fmt.Fprintf(&b, "bench/devread/run.sh   # RATE=%s SIZE_MIB=%d REPS=%d\n", rate, sizeMiB, reps)
	for _, v := range variants {
		fmt.Fprintf(&b, "%s\n", cmds[v.Name])
	}
	fmt.Fprintf(&b, "```\n")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
