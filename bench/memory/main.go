// Command memory-bench drives bench/memory/run.sh: "serve" runs a donor with
// one region in its own process; "run" measures Rialto's memory channels,
// the userfaultfd mapping and the adaptive chooser against redis-server and
// iperf3 running on loopback, interleaved, and prints a Markdown fragment.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/bench/internal/iperf"
	"github.com/rialto-project/rialto/bench/internal/stats"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	memmap "github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
)

func main() {
	memmap.RunFaultHandlerIfChild() // a mapping's fault handler is this binary
	stats.Commit(".")               // the tree measured, before it can change: the report names it
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: memory-bench serve|run [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "run":
		run(os.Args[2:])
	case chainHandlerArg:
		chainHandler(os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, "usage: memory-bench serve|run [flags]")
		os.Exit(2)
	}
}

func serve(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	size := fs.Int64("size", 1<<30, "region bytes")
	spin := fs.Duration("spin", 0, "busy-poll budget of synchronous connections (donor.Donor.Spin)")
	faultSpin := fs.Duration("fault-spin", 0, "busy-poll budget of fault connections (donor.Donor.FaultSpin; 0 = default)")
	pair := fs.Bool("pair", false, "also serve a second region from a donor that never spins on fault connections, and the platform-floor probe (floor.go); print the three addresses")
	side := fs.Bool("side", false, "serve only what a lease of `rialto agent` cannot: the donor that never spins on fault connections and the floor probe; print their two addresses")
	floorOnly := fs.Bool("floor-only", false, "serve only the platform-floor probe; print its address")
	_ = fs.Parse(args)
	// The credential comes from the environment, never the command line
	// (ps shows a command line to every user of the machine).
	cred := os.Getenv("RIALTO_BENCH_CRED")
	// Only SIGTERM (run.sh's cleanup) ends a donor: an interrupt from the
	// terminal reaches memory-bench run too, which stops between parts,
	// and the donor must not go away under a mapping in use meanwhile.
	signal.Ignore(syscall.SIGINT)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	start := func(faultSpin time.Duration) string {
		d := donor.New(slog.New(slog.NewTextHandler(os.Stderr, nil)))
		d.Spin, d.FaultSpin = *spin, faultSpin
		if err := d.AddRegion(cred, *size); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go func() {
			if err := d.Serve(ctx, ln); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
			_ = d.RemoveRegion(cred)
		}()
		return ln.Addr().String()
	}
	var addrs []string
	if !*side && !*floorOnly {
		addrs = append(addrs, start(*faultSpin))
	}
	if *pair || *side || *floorOnly {
		if !*floorOnly {
			addrs = append(addrs, start(-1))
		}
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer ln.Close()
		go serveFloor(ln)
		// The datagram floor listens on the same port number, over UDP.
		if err := serveFloorUDP(ln.Addr().String()); err != nil {
			fmt.Fprintln(os.Stderr, "udp floor:", err)
		}
		addrs = append(addrs, ln.Addr().String())
	}
	fmt.Println(strings.Join(addrs, " "))
	<-ctx.Done()
}

type cfg struct {
	addr, cred, redis string
	iperfPort         int
	runs, ops         int
	bulkBytes         int64
	parts             string
	spin              time.Duration
	addrBlock         string        // donor whose fault connections never spin
	addrFloor         string        // platform-floor probe (floor.go)
	donorPid          int           // donor process, for its CPU time
	blockPid          int           // the side donor of addrBlock, for its CPU time
	bin               string        // the rialto binary: the donor is a lease of a rialto agent
	work              string        // state of the cluster (tmpfs)
	donorDesc         string        // which process served the donor, for the report
	commands          []string      // the cluster's commands, for the report
	mapSpin           time.Duration // mapping.Options.Spin of the polling mapping
}

func (c *cfg) want(part string) bool {
	return c.parts == "" || strings.Contains(","+c.parts+",", ","+part+",")
}

// results: name → one value per run.
type results struct {
	mu sync.Mutex
	v  map[string][]float64
}

func (r *results) add(name string, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.v[name] = append(r.v[name], v)
}

func (r *results) med(name string) float64 { return median(r.v[name]) }

// median is the median of xs (0 for none).
func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

func (r *results) all(name string) string {
	var s []string
	for _, x := range r.v[name] {
		s = append(s, strconv.FormatFloat(x, 'f', 1, 64))
	}
	return strings.Join(s, ", ")
}

func run(args []string) {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var c cfg
	fs.StringVar(&c.addr, "addr", "", "donor address (experiments; default: a memory lease of a `rialto agent` started here)")
	fs.StringVar(&c.bin, "bin", "bin/rialto", "the rialto binary (rialto server and rialto agent processes)")
	fs.StringVar(&c.work, "work", "/dev/shm", "where the cluster keeps its state")
	fs.StringVar(&c.redis, "redis", "", "redis-server address")
	fs.IntVar(&c.iperfPort, "iperf-port", 0, "iperf3 server port")
	fs.IntVar(&c.runs, "runs", 3, "interleaved runs")
	fs.IntVar(&c.ops, "ops", 5000, "operations per small-op measurement")
	fs.Int64Var(&c.bulkBytes, "bulk", 1<<30, "bulk transfer bytes")
	fs.DurationVar(&c.spin, "spin", 0, "client busy-poll budget (client.Options.Spin)")
	fs.StringVar(&c.parts, "parts", "", "comma-separated subset of small,bulk,mapping,link,mixed (default all)")
	fs.StringVar(&c.addrBlock, "addr-block", "", "donor (same region size) whose fault connections never spin: the mapping is also measured without polling")
	fs.StringVar(&c.addrFloor, "addr-floor", "", "platform-floor probe of memory-bench serve -side: loopback round trip with both ends polling")
	fs.IntVar(&c.donorPid, "donor-pid", 0, "process id of -addr's donor (CPU time of fault service)")
	fs.IntVar(&c.blockPid, "block-pid", 0, "process id of -addr-block's donor")
	fs.DurationVar(&c.mapSpin, "map-spin", 0, "fault handler busy-poll budget (mapping.Options.Spin; 0 = default)")
	_ = fs.Parse(args)
	// The side processes' credential (the side donor's region; also
	// -addr's), from the environment: never on a command line.
	sideCred := os.Getenv("RIALTO_BENCH_CRED")
	c.cred = sideCred
	ctx := context.Background()
	if c.addr == "" {
		cl, err := startCluster(ctx, &c)
		if err != nil {
			fail(err)
		}
		atExit(func() { _ = cl.Close() })
	} else {
		c.donorDesc = "a donor at " + c.addr + " (-addr)"
	}
	cl, err := client.Dial(ctx, c.addr, c.cred, client.Options{Timeout: 30 * time.Second, Spin: c.spin})
	if err != nil {
		fail(err)
	}
	defer cl.Close()
	var clBlock *client.Client
	if c.addrBlock != "" && c.want("mapping") {
		if clBlock, err = client.Dial(ctx, c.addrBlock, sideCred, client.Options{Timeout: 30 * time.Second}); err != nil {
			fail(err)
		}
		defer clBlock.Close()
	}
	rc, err := newRedisPool(c.redis, 16)
	if err != nil {
		fail(err)
	}
	res := &results{v: map[string][]float64{}}
	// Preload Redis keys and the region.
	const keys = 10000
	for _, n := range []int{64, 4096} {
		val := make([]byte, n)
		for k := range keys {
			if err := rc[0].set(fmt.Sprintf("k%d:%d", n, k), val); err != nil {
				fail(err)
			}
		}
	}
	bulkBuf := make([]byte, c.bulkBytes)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(bulkBuf)
	// A signal ends the run at the next part, through exit, so that the
	// link's namespace is removed (and no mapping is in use as its donor
	// goes); a second one ends it at once.
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		logf("interrupted: stopping after this part (again to stop now)")
		interrupted.Store(true)
		<-sig
		exit(130)
	}()
	var steal []float64
	for r := range c.runs {
		s0 := stats.SampleCPU()
		part(r, "small ops")
		for _, conc := range []int{1, 16} {
			if !c.want("small") {
				break
			}
			for _, n := range []int{64, 4096} {
				for _, op := range []string{"read", "write"} {
					ch := client.ChannelSync
					if conc > 1 {
						ch = client.ChannelAdaptive
					}
					var rl, dl []time.Duration
					var rt, dt time.Duration
					for round := range 5 {
						l, el := smallRialto(ctx, cl, ch, op, n, conc, c.ops/5, round)
						rl, rt = append(rl, l...), rt+el
						l, el = smallRedis(rc, op, n, conc, c.ops/5, keys, round)
						dl, dt = append(dl, l...), dt+el
					}
					key := fmt.Sprintf("%s/%d/c%d", op, n, conc)
					res.add("rialto p50 "+key, pct(rl, 50))
					res.add("rialto p99 "+key, pct(rl, 99))
					res.add("rialto ops "+key, float64(len(rl))/rt.Seconds())
					res.add("redis p50 "+key, pct(dl, 50))
					res.add("redis p99 "+key, pct(dl, 99))
					res.add("redis ops "+key, float64(len(dl))/dt.Seconds())
				}
			}
		}
		part(r, "bulk")
		if c.want("bulk") {
			// bulk read, iperf3 -P1, bulk write, iperf3 -P2, bulk read, bulk write
			bulk := func(op string) {
				t0 := time.Now()
				var err error
				if op == "read" {
					err = cl.Read(ctx, client.ChannelBulk, bulkBuf, 0)
				} else {
					err = cl.Write(ctx, client.ChannelBulk, bulkBuf, 0)
				}
				if err != nil {
					fail(err)
				}
				res.add("bulk "+op, float64(c.bulkBytes)*8/time.Since(t0).Seconds()/1e9)
			}
			bulk("read")
			res.add("iperf3 P1", iperfGbps(ctx, c.iperfPort, 1))
			bulk("write")
			res.add("iperf3 P2", iperfGbps(ctx, c.iperfPort, 2))
			bulk("read")
			bulk("write")
		}
		if c.want("mapping") {
			part(r, "mapping")
			// Polling and blocking fault service alternate in order.
			if clBlock != nil && r%2 == 1 {
				mapReads(ctx, clBlock, "block", memmap.Options{Spin: -1}, c.blockPid, res)
			}
			mapping(ctx, cl, memmap.Options{Spin: c.mapSpin}, c.donorPid, res)
			concurrentFaults(ctx, cl, memmap.Options{Spin: c.mapSpin}, res)
			if c.addrFloor != "" {
				lat, err := floorRTT(c.addrFloor, 20000)
				if err != nil {
					fail(err)
				}
				res.add("floor p50", pct(lat, 50))
				res.add("floor p99", pct(lat, 99))
				if lat, err := floorUDP(c.addrFloor, 20000); err != nil {
					logf("udp floor unavailable: %v", err)
				} else {
					res.add("udp floor p50", pct(lat, 50))
				}
			}
			if lat, err := uffdFloor(20000, ""); err != nil {
				logf("userfaultfd floor unavailable: %v", err)
			} else {
				res.add("uffd floor p50", pct(lat, 50))
				res.add("uffd floor p99", pct(lat, 99))
			}
			res.add("syscall ns", syscallCost())
			if c.addrFloor != "" {
				if lat, err := uffdFloor(20000, c.addrFloor); err != nil {
					logf("chain floor unavailable: %v", err)
				} else {
					res.add("chain floor p50", pct(lat, 50))
					res.add("chain floor p99", pct(lat, 99))
				}
			}
			if clBlock != nil && r%2 == 0 {
				mapReads(ctx, clBlock, "block", memmap.Options{Spin: -1}, c.blockPid, res)
			}
		}
		if c.want("mixed") {
			part(r, "adaptive")
			mixed(ctx, cl, res)
		}
		steal = append(steal, s0.StealSince())
	}
	if c.want("link") {
		// A pass of its own, after the others: while the link's donor
		// holds memory, this VM's page allocations (UFFDIO_COPY's) are
		// measurably slower, for the loopback mapping too (about 10 µs a
		// fault), so the loopback faults it is compared with are measured
		// again here, alternating with it.
		lk, err := startLink(ctx, &c)
		if err != nil {
			logf("donor across a link unavailable: %v", err)
		} else {
			atExit(lk.close) // also on fail and on a signal: the lab is machine state
			for r := range c.runs {
				part(r, "link")
				lk.measure(ctx, cl, &c, res)
			}
			lk.close()
		}
	}
	report(c, res, steal)
	runAtExit()
}

func logf(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }

// interrupted is set by the first SIGINT or SIGTERM.
var interrupted atomic.Bool

// part announces part name of run r, or exits if the run was interrupted.
func part(r int, name string) {
	if interrupted.Load() {
		exit(130)
	}
	logf("run %d: %s", r+1, name)
}

// atExit registers f to run before the process exits through fail or a
// signal (what a deferred call in run would not get to do).
func atExit(f func()) {
	exitMu.Lock()
	defer exitMu.Unlock()
	exitFuncs = append(exitFuncs, f)
}

var (
	exitMu    sync.Mutex
	exitFuncs []func()
	exitOnce  sync.Once
)

// runAtExit runs the atExit functions, last registered first, once; a
// concurrent caller (fail while a signal's exit is cleaning up) waits for
// them to finish.
func runAtExit() {
	exitOnce.Do(func() {
		exitMu.Lock()
		fs := exitFuncs
		exitMu.Unlock()
		for i := len(fs) - 1; i >= 0; i-- {
			fs[i]()
		}
	})
}

func exit(code int) {
	runAtExit()
	os.Exit(code)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "memory-bench:", err)
	exit(1)
}

func pct(d []time.Duration, p int) float64 {
	slices.Sort(d)
	return float64(d[min(len(d)*p/100, len(d)-1)]) / 1e3
}

// smallRialto returns the latencies and the elapsed time.
func smallRialto(ctx context.Context, cl *client.Client, ch client.Channel, op string, n, conc, ops, round int) ([]time.Duration, time.Duration) {
	lat := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	t0 := time.Now()
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), uint64(n*10+round)))
			buf := make([]byte, n)
			span := cl.Size()/int64(n) - 1
			for range ops / conc {
				off := rng.Int64N(span) * int64(n)
				t := time.Now()
				var err error
				if op == "read" {
					err = cl.Read(ctx, ch, buf, off)
				} else {
					err = cl.Write(ctx, ch, buf, off)
				}
				if err != nil {
					fail(err)
				}
				lat[g] = append(lat[g], time.Since(t))
			}
		}()
	}
	wg.Wait()
	return slices.Concat(lat...), time.Since(t0)
}

func smallRedis(rc []*redisConn, op string, n, conc, ops, keys, round int) ([]time.Duration, time.Duration) {
	lat := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	t0 := time.Now()
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), uint64(n*10+round)))
			val := make([]byte, n)
			for range ops / conc {
				k := fmt.Sprintf("k%d:%d", n, rng.IntN(keys))
				t := time.Now()
				var err error
				if op == "read" {
					err = rc[g].get(k, n)
				} else {
					err = rc[g].set(k, val)
				}
				if err != nil {
					fail(err)
				}
				lat[g] = append(lat[g], time.Since(t))
			}
		}()
	}
	wg.Wait()
	return slices.Concat(lat...), time.Since(t0)
}

// iperfGbps runs a 4-second iperf3 client on loopback and returns Gbit/s
// received.
func iperfGbps(ctx context.Context, port, streams int) float64 {
	bps, err := iperf.Client(ctx, iperf.Local, "127.0.0.1", port, 4, "-P", strconv.Itoa(streams))
	if err != nil {
		fail(err)
	}
	return bps / 1e9
}

// mapReads maps the region of cl and measures read faults only.
func mapReads(ctx context.Context, cl *client.Client, mode string, opts memmap.Options, donorPid int, res *results) {
	m, err := memmap.Map(ctx, cl, opts)
	if err != nil {
		logf("mapping unavailable: %v", err)
		return
	}
	readFaults(m, mode, donorPid, res)
	if err := m.Close(); err != nil {
		fail(err)
	}
}

// fullCacheFaults times random read faults once the cache is full, so that
// each one also evicts a (clean) page: the steady state of a mapping larger
// than its cache.
func fullCacheFaults(m *memmap.Mapping, res *results) {
	b := m.Bytes()
	pages := len(b) / 4096
	rng := rand.New(rand.NewPCG(9, 9))
	var sink byte
	st := m.Stats()
	for range st.CachePages - st.Resident + 1000 { // fill the cache, unmeasured
		sink += b[rng.IntN(pages)*4096]
	}
	const n = 20000
	lat := make([]time.Duration, 0, n)
	m.ResetStats()
	for range n {
		off := rng.IntN(pages) * 4096
		t := time.Now()
		sink += b[off]
		lat = append(lat, time.Since(t))
	}
	st = m.Stats()
	res.add("fault read p50 full", pct(lat, 50))
	res.add("fault read p99 full", pct(lat, 99))
	res.add("fault evict full", float64(st.EvictTime.Microseconds())/float64(max(st.Evictions, 1)))
	res.add("fault evictions full", float64(st.Evictions)/float64(max(st.Faults, 1)))
	if sink == 1 {
		logf("")
	}
}

// readFaults times 20,000 first touches of random pages and the CPU time
// the handler and the donor spent serving them.
func readFaults(m *memmap.Mapping, mode string, donorPid int, res *results) {
	b := m.Bytes()
	pages := len(b) / 4096
	rng := rand.New(rand.NewPCG(7, 7))
	var sink byte
	const n = 20000
	lat := make([]time.Duration, 0, n)
	m.ResetStats()
	h0, d0, t0 := m.Stats().HandlerCPU, procCPU(donorPid), time.Now()
	for range n {
		off := rng.IntN(pages) * 4096
		t := time.Now()
		sink += b[off]
		lat = append(lat, time.Since(t))
	}
	wall := time.Since(t0)
	st := m.Stats()
	hc, dc := st.HandlerCPU-h0, procCPU(donorPid)-d0
	res.add("fault read p50 "+mode, pct(lat, 50))
	res.add("fault read p99 "+mode, pct(lat, 99))
	res.add("fault handler p50 "+mode, pct(st.ServiceTime, 50))
	res.add("fault handler p99 "+mode, pct(st.ServiceTime, 99))
	res.add("fault fetch "+mode, float64(st.FetchTime.Microseconds())/float64(max(st.Faults, 1)))
	res.add("fault install "+mode, float64(st.InstallTime.Microseconds())/float64(max(st.Faults, 1)))
	logf("  %s: read p50 %.1f µs, fetch %.1f µs, install %.1f µs per fault", mode, pct(lat, 50),
		float64(st.FetchTime.Microseconds())/float64(max(st.Faults, 1)), float64(st.InstallTime.Microseconds())/float64(max(st.Faults, 1)))
	res.add("fault handler cpu/fault "+mode, float64(hc.Microseconds())/n)
	res.add("fault handler cores "+mode, hc.Seconds()/wall.Seconds())
	if donorPid > 0 {
		res.add("fault donor cpu/fault "+mode, float64(dc.Microseconds())/n)
		res.add("fault donor cores "+mode, dc.Seconds()/wall.Seconds())
	}
	if sink == 1 {
		logf("")
	}
}

// concurrentFaults times first touches of random pages by one thread, then
// by four threads at once (whose faults the handler batches), each on a
// fresh mapping and within its cache, as faults per second.
func concurrentFaults(ctx context.Context, cl *client.Client, opts memmap.Options, res *results) {
	// A thread waiting on a fault keeps its P.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), 6)))
	for _, threads := range []int{1, 4} {
		m, err := memmap.Map(ctx, cl, opts) // fresh for each: no eviction in either
		if err != nil {
			logf("mapping unavailable: %v", err)
			return
		}
		b := m.Bytes()
		n := min(20000, m.Stats().CachePages)
		pages := rand.New(rand.NewPCG(11, 11)).Perm(len(b) / 4096)[:n]
		sinks := make([]byte, threads*64)
		var wg sync.WaitGroup
		t0 := time.Now()
		for k := range threads {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := k; j < n; j += threads {
					sinks[k*64] += b[pages[j]*4096]
				}
			}()
		}
		wg.Wait()
		res.add(fmt.Sprintf("fault conc %d/s", threads), float64(n)/time.Since(t0).Seconds())
		if st := m.Stats(); st.Faults > 0 {
			res.add(fmt.Sprintf("fault conc %d batched", threads), float64(st.Batched)/float64(st.Faults))
		}
		if err := m.Close(); err != nil {
			fail(err)
		}
	}
}

// procCPU is the user+system CPU time of process pid (0 when unknown).
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// mapping measures the app-visible time of first touches of random pages
// through the userfaultfd mapping (cache: 10% of the region).
func mapping(ctx context.Context, cl *client.Client, opts memmap.Options, donorPid int, res *results) {
	m, err := memmap.Map(ctx, cl, opts)
	if err != nil {
		logf("mapping unavailable: %v", err)
		return
	}
	b := m.Bytes()
	pages := len(b) / 4096
	rng := rand.New(rand.NewPCG(7, 8)) // writes touch other pages than readFaults
	var sink byte
	readFaults(m, "poll", donorPid, res)
	fullCacheFaults(m, res)
	lat := make([]time.Duration, 0, 20000)
	// Writes: every touched page becomes dirty and is written back on
	// eviction. First fill the cache with dirty pages (unmeasured), so that
	// each measured fault evicts a dirty page.
	for range m.Stats().CachePages {
		b[rng.IntN(pages)*4096]++
	}
	m.ResetStats()
	lat = lat[:0]
	for range 20000 {
		off := rng.IntN(pages) * 4096
		t := time.Now()
		b[off]++
		lat = append(lat, time.Since(t))
	}
	res.add("fault write p50", pct(lat, 50))
	res.add("fault write p99", pct(lat, 99))
	if st := m.Stats(); st.Faults > 0 {
		res.add("fault write writebacks", float64(st.WriteBacks)/float64(st.Faults))
		res.add("fault write in-fault writebacks", float64(st.FaultWriteBacks)/float64(st.Faults))
	}
	// Sequential scan with readahead, the cache full of clean pages (the
	// write-backs of the writes above are not part of it).
	if err := m.Flush(); err != nil {
		fail(err)
	}
	m.ResetStats()
	t0 := time.Now()
	for off := 0; off < len(b)/4; off += 4096 {
		sink += b[off]
	}
	res.add("mapped seq MiB/s", float64(len(b)/4)/time.Since(t0).Seconds()/(1<<20))
	if st := m.Stats(); st.Punches > 0 {
		res.add("mapped seq evictions/punch", float64(st.Evictions)/float64(st.Punches))
	}
	if err := m.Close(); err != nil {
		fail(err)
	}
	if sink == 1 {
		logf("")
	}
}

// williams4 is the first row of a Williams square of order 4: row r is
// (williams4[k]+r) mod 4, and the 4 rows hold every ordered pair of
// distinct channels once as neighbours.
var williams4 = [4]int{0, 1, 3, 2}

// mixed compares the adaptive chooser with each fixed channel on workloads.
func mixed(ctx context.Context, cl *client.Client, res *results) {
	type wl struct {
		name  string
		conc  int
		ops   int
		sizes []int
	}
	wls := []wl{
		{"small random, 1 thread", 1, 6000, []int{64, 4096}},
		{"small random, 8 threads", 8, 24000, []int{64, 4096}},
		{"4 MiB transfers, 1 thread", 1, 40, []int{4 << 20}},
		{"mixed 64 B–4 MiB, 8 threads", 8, 4000, []int{64, 64, 64, 512, 4096, 4096, 4096, 65536, 1 << 20}},
	}
	chans := []client.Channel{client.ChannelSync, client.ChannelBulk, client.ChannelQueue, client.ChannelAdaptive}
	// The channels run in a balanced order (a Williams square, twice): in
	// every 4 rounds each channel runs once in each position and once right
	// after each other channel. Rotating one order instead put the adaptive
	// chooser right after the queue channel, and the bulk channel right
	// after the sync channel, in 3 rounds of every 4, so that whatever one
	// channel leaves behind (the queue pair's goroutines, the donor's
	// caches, the offsets it just touched) fell mostly on the same other one.
	const rounds = 8
	for _, w := range wls {
		var el [4]time.Duration
		for round := range rounds {
			for k := range chans {
				ci := (williams4[k] + round) % len(chans)
				ch := chans[ci]
				var wg sync.WaitGroup
				t0 := time.Now()
				for g := range w.conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(uint64(g), uint64(round)))
						buf := make([]byte, slices.Max(w.sizes))
						for i := range w.ops / w.conc / rounds {
							n := w.sizes[rng.IntN(len(w.sizes))]
							off := rng.Int64N(cl.Size() - int64(n))
							var err error
							if i%4 == 3 {
								err = cl.Write(ctx, ch, buf[:n], off)
							} else {
								err = cl.Read(ctx, ch, buf[:n], off)
							}
							if err != nil {
								fail(err)
							}
						}
					}()
				}
				wg.Wait()
				el[ci] += time.Since(t0)
			}
		}
		for ci, ch := range chans {
			ops := w.ops / w.conc / rounds * w.conc * rounds
			res.add("mixed "+w.name+" "+ch.String(), float64(ops)/el[ci].Seconds())
		}
	}
}

func report(c cfg, r *results, steal []float64) {
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	p := func(f string, a ...any) { fmt.Fprintf(w, f, a...) }
	p("## Remote memory through a memory lease of `rialto agent`\n\n")
	p("Measured %s by `bench/memory/run.sh` (bench/memory) at commit %s on %s.\n", stats.Stamp(), stats.Commit("."), stats.Machine())
	p("Medians of %d interleaved runs (Rialto and each peer alternate inside every run). The donor is %s;\n", c.runs, c.donorDesc)
	p("the client (memory-bench run) reaches it with the lease's URI. redis-server and iperf3 are separate processes on\n")
	p("127.0.0.1; everything is in RAM (anonymous memory, Redis without persistence). Steal time per run: %s %%.\n", fmtList(steal))
	p("Load average at the end: %s.\n\n", loadavg())
	p("### Small random reads and writes vs Redis GET/SET (same value sizes, same concurrency)\n\n")
	p("Rialto at concurrency 1 uses the synchronous channel; at 16 the adaptive chooser (which\n")
	p("pipelines on the queue pair). Redis: one connection per client goroutine, GET/SET of\n")
	p("10,000 preloaded keys. Within each run the two alternate in 5 rounds. Latency in µs;\n")
	p("throughput in operations per second.\n\n")
	p("| op | size | conc | Rialto p50 | Redis p50 | p50 ratio (Rialto/Redis) | Rialto p99 | Redis p99 | Rialto ops/s | Redis ops/s |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, conc := range []int{1, 16} {
		for _, n := range []int{64, 4096} {
			for _, op := range []string{"read", "write"} {
				k := fmt.Sprintf("%s/%d/c%d", op, n, conc)
				rp, dp := r.med("rialto p50 "+k), r.med("redis p50 "+k)
				rop := "GET"
				if op == "write" {
					rop = "SET"
				}
				p("| %s (vs %s) | %d B | %d | %.1f | %.1f | %.2f | %.1f | %.1f | %.0f | %.0f |\n", op, rop, n, conc, rp, dp, rp/dp,
					r.med("rialto p99 "+k), r.med("redis p99 "+k), r.med("rialto ops "+k), r.med("redis ops "+k))
			}
		}
	}
	p("\nGoal: 4 KiB random-read p50 ≤ Redis GET 4 KiB p50 (ratio ≤ 1.00). Per-run 4 KiB read p50, Rialto: %s; Redis: %s.\n\n",
		r.all("rialto p50 read/4096/c1"), r.all("redis p50 read/4096/c1"))
	p("### Bulk transfer of %d MiB vs the loopback TCP ceiling (iperf3)\n\n", c.bulkBytes>>20)
	p("| measurement | Gbit/s (median) | runs |\n|---|---|---|\n")
	for _, k := range []string{"iperf3 P1", "iperf3 P2", "bulk read", "bulk write"} {
		p("| %s | %.2f | %s |\n", k, r.med(k), r.all(k))
	}
	i1, i2 := r.med("iperf3 P1"), r.med("iperf3 P2")
	p("\nBulk uses 2 streams of 512 KiB chunks; each run moves the region twice each way, interleaved with the two iperf3 runs. Read/iperf3 single stream = %.2f, read/iperf3 -P 2 = %.2f;\n", r.med("bulk read")/i1, r.med("bulk read")/i2)
	p("write/iperf3 single stream = %.2f, write/iperf3 -P 2 = %.2f (goal ≥ 0.80).\n\n", r.med("bulk write")/i1, r.med("bulk write")/i2)
	p("### Transparent mapping: page-fault service time\n\n")
	p("1 GiB region mapped with a 10%% local cache, faults served by the mapping's handler process;\n")
	p("20,000 first touches of random pages (timed around the load or store in the application)\n")
	p("and the handler's own service time. The handler and the donor's fault connection busy-poll\n")
	p("(with sched_yield) before sleeping: MapOptions.Spin and Donor.FaultSpin, 50 µs by default.\n\n")
	p("| measurement | p50 µs | p99 µs |\n|---|---|---|\n")
	p("| read fault, application-visible | %.1f | %.1f |\n", r.med("fault read p50 poll"), r.med("fault read p99 poll"))
	p("| read fault, handler service | %.1f | %.1f |\n", r.med("fault handler p50 poll"), r.med("fault handler p99 poll"))
	p("| read fault with the cache full (%.2f evictions per fault, %.1f µs each, done while the page travels), application-visible | %.1f | %.1f |\n",
		r.med("fault evictions full"), r.med("fault evict full"), r.med("fault read p50 full"), r.med("fault read p99 full"))
	p("| write fault (`b[i]++`, read-modify-write of a random page, the cache full of dirty pages: %.2f write-backs per fault, %.2f of them behind the fault's READ), application-visible | %.1f | %.1f |\n",
		r.med("fault write writebacks"), r.med("fault write in-fault writebacks"), r.med("fault write p50"), r.med("fault write p99"))
	p("\nThe first two rows are 20,000 faults on a fresh mapping, before the cache is full; the third, 20,000\n")
	p("more once it is (after an unmeasured fill), so each fault also drops the least recently used page.\n")
	p("\nGoal: p50 ≤ 30 µs. Per-run read-fault p50: %s (cache full: %s). A fault costs at least one round trip to the\n", r.all("fault read p50 poll"), r.all("fault read p50 full"))
	p("donor: compare with the 4 KiB sync read p50 above (%.1f µs) measured in the same run.\n", r.med("rialto p50 read/4096/c1"))
	if len(r.v["floor p50"]) > 0 {
		p("The platform's floor, measured in the same run: a loopback TCP round trip with both ends\n")
		p("busy-polling with raw system calls (no Rialto code; 16-byte request, 4 KiB reply): p50 %.1f µs,\n", r.med("floor p50"))
		p("p99 %.1f µs (per run: %s). A fault adds to it the userfaultfd hand-offs: the fault's\n", r.med("floor p99"), r.all("floor p50"))
		p("delivery to the handler, UFFDIO_COPY and the faulting thread's wake-up.\n")
	}
	if len(r.v["uffd floor p50"]) > 0 {
		p("The userfaultfd floor, measured in the same run: the same kind of mapping (memfd, missing and\n")
		p("write-protect modes) with each first touch served by a thread of the same process that\n")
		p("busy-polls the userfaultfd and installs a page already in memory (no network, no handler\n")
		p("process; uffdfloor.go): p50 %.1f µs, p99 %.1f µs (per run: %s).\n", r.med("uffd floor p50"), r.med("uffd floor p99"), r.all("uffd floor p50"))
		if len(r.v["floor p50"]) > 0 {
			p("The two floors add up to %.1f µs p50: what a mapped remote fault would cost here with\n", r.med("floor p50")+r.med("uffd floor p50"))
			p("nothing but one loopback round trip and one userfaultfd hand-off.\n")
		}
		if len(r.v["udp floor p50"]) > 0 {
			p("The same round trip over UDP datagrams (connected sockets, both ends polling; per run: %s) has\n", r.all("udp floor p50"))
			p("a p50 of %.1f µs; with the userfaultfd floor, %.1f µs.\n", r.med("udp floor p50"), r.med("udp floor p50")+r.med("uffd floor p50"))
		}
	}
	if len(r.v["chain floor p50"]) > 0 {
		p("The whole path, measured end to end in the same run (the chain floor): the same probe, its\n")
		p("faults served by a process of its own (as a mapping's are) that fetches each page over a\n")
		p("loopback connection from the round-trip probe's server, both ends polling, before installing\n")
		p("it. That is a mapped remote fault with nothing but its system calls (no framing, no cache,\n")
		p("no eviction): p50 %.1f µs, p99 %.1f µs (per run: %s).\n",
			r.med("chain floor p50"), r.med("chain floor p99"), r.all("chain floor p50"))
		var gap []float64
		for i, x := range r.v["fault read p50 poll"] {
			if i < len(r.v["chain floor p50"]) {
				gap = append(gap, x-r.v["chain floor p50"][i])
			}
		}
		p("Rialto's read fault p50 minus the chain floor's, per run: %s µs.\n", fmtList(gap))
	}
	if len(r.v["syscall ns"]) > 0 {
		p("A system call (getpid) costs %.0f ns on this machine (per run: %s ns): each round trip and\n",
			r.med("syscall ns"), r.all("syscall ns"))
		p("hand-off above is a few of them.\n")
	}
	p("Sequential scan of 256 MiB through the mapping (readahead up to 64 pages; the cache full of clean\n")
	p("pages, so every window evicts as many — %.1f pages per punch, since the first 100 MiB evict the\n", r.med("mapped seq evictions/punch"))
	p("random pages cached before): %.0f MiB/s (per run: %s).\n\n", r.med("mapped seq MiB/s"), r.all("mapped seq MiB/s"))
	if len(r.v["fault read p50 block"]) > 0 {
		p("What polling costs: the same read faults served with polling (defaults) and without (handler\n")
		p("and donor sleep in poll(2) whenever idle), alternating within each run. The polling row's donor is the\n")
		p("lease's (`rialto agent`, defaults); the blocking row's is an extra, side donor process (`memory-bench serve -side`,\n")
		p("a donor.Donor whose fault connections never spin: the agent has no such setting), shown only to price\n")
		p("the polling. CPU is the handler process's and the donor process's user+system time during\n")
		p("the 20,000 faults, per fault and as cores busy (the faulting thread sleeps in the kernel).\n\n")
		p("| fault service | read p50 µs | read p99 µs | handler p50 µs | handler CPU µs/fault | donor CPU µs/fault | handler cores | donor cores |\n|---|---|---|---|---|---|---|---|\n")
		spin := c.mapSpin
		if spin == 0 {
			spin = memmap.DefaultSpin
		}
		polling := fmt.Sprintf("polling (handler spins %v)", spin)
		for _, m := range []struct{ name, key string }{{polling, "poll"}, {"blocking (no spin; side donor, extra row)", "block"}} {
			p("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f |\n", m.name, r.med("fault read p50 "+m.key), r.med("fault read p99 "+m.key),
				r.med("fault handler p50 "+m.key), r.med("fault handler cpu/fault "+m.key), r.med("fault donor cpu/fault "+m.key),
				r.med("fault handler cores "+m.key), r.med("fault donor cores "+m.key))
		}
		p("\nPer-run read-fault p50 without polling: %s. Mean per fault, polling / blocking: waiting\n", r.all("fault read p50 block"))
		p("for the donor %.1f / %.1f µs; UFFDIO_COPY (which includes waking the faulting thread, and its\n", r.med("fault fetch poll"), r.med("fault fetch block"))
		p("run until it faults again when it preempts the handler on the same CPU) %.1f / %.1f µs.\n\n", r.med("fault install poll"), r.med("fault install block"))
	}
	if len(r.v["fault conc 4/s"]) > 0 {
		p("Threads faulting at once: 20,000 random first touches of a fresh mapping (within its cache) by\n")
		p("one thread, then as many on another fresh mapping by four threads together. The handler\n")
		p("fetches the faults that arrive together with their READs in one write (%.0f%% of the four\n", 100*r.med("fault conc 4 batched"))
		p("threads' faults were batched): %.0f faults/s with one thread, %.0f with four (per run: %s\n", r.med("fault conc 1/s"), r.med("fault conc 4/s"), r.all("fault conc 1/s"))
		p("and %s).\n\n", r.all("fault conc 4/s"))
	}
	if len(r.v["fault read p50 link"]) > 0 {
		p("Across a link: 20,000 random first touches of a fresh mapping with the donor in a network\n")
		p("namespace joined to the borrower's by a veth pair and a bridge (unshaped, same machine; a\n")
		p("256 MiB region, 100 MiB cache), alternating with the same faults against the loopback donor\n")
		p("(same cache), and the two floors against probes in each place. A pass of its own after the\n")
		p("runs above: while the namespace's donor holds memory, every fault here is slower, loopback\n")
		p("ones too (this VM's page allocations slow down when other processes hold memory).\n\n")
		p("| donor | read fault p50 µs | read fault p99 µs | handler p50 µs | TCP floor p50 µs | UDP floor p50 µs |\n|---|---|---|---|---|---|\n")
		for _, w := range []struct{ name, key, floor string }{{"loopback", "loop", ""}, {"veth + bridge", "link", "link "}} {
			p("| %s | %.1f | %.1f | %.1f | %.1f | %.1f |\n", w.name, r.med("fault read p50 "+w.key), r.med("fault read p99 "+w.key),
				r.med("fault handler p50 "+w.key), r.med(w.floor+"pass floor p50"), r.med(w.floor+"pass udp floor p50"))
		}
		p("\nPer-run read-fault p50, loopback: %s; across the link: %s.\n\n", r.all("fault read p50 loop"), r.all("fault read p50 link"))
	}
	p("### Adaptive chooser vs each fixed channel (operations per second, 3/4 reads)\n\n")
	p("Random offsets over the region (the same ones for each channel in a round); within each run the\n")
	p("four channels alternate in 8 rounds in a balanced order: every channel runs in each position, and\n")
	p("right after each other channel, equally often. Adaptive / sync is the median of the per-run ratios.\n\n")
	p("| workload | sync | bulk | queue | adaptive | adaptive / best fixed | adaptive / sync | adaptive runs |\n|---|---|---|---|---|---|---|---|\n")
	for _, w := range []string{"small random, 1 thread", "small random, 8 threads", "4 MiB transfers, 1 thread", "mixed 64 B–4 MiB, 8 threads"} {
		s, b, q, a := r.med("mixed "+w+" sync"), r.med("mixed "+w+" bulk"), r.med("mixed "+w+" queue"), r.med("mixed "+w+" adaptive")
		var paired []float64
		for i, x := range r.v["mixed "+w+" adaptive"] {
			if ss := r.v["mixed "+w+" sync"]; i < len(ss) && ss[i] > 0 {
				paired = append(paired, x/ss[i])
			}
		}
		p("| %s | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f | %s |\n", w, s, b, q, a, a/max(s, b, q), median(paired), r.all("mixed "+w+" adaptive"))
	}
	defer func() {
		p("\nRialto's processes (the donor of every Rialto row; the link pass has its own server and agent in a namespace):\n\n```\n")
		for _, cmd := range c.commands {
			p("%s\n", cmd)
		}
		p("```\n")
	}()
	p("\nGoal: adaptive ≥ 0.90 of the best fixed channel on every workload. With one thread and\n")
	p("requests below its bulk threshold (2 MiB) the adaptive chooser runs the sync channel's code (plus a\n")
	p("few atomic operations, no clock), so the spread between those two columns shows the noise of this\n")
	p("shared machine.\n")
}

func fmtList(xs []float64) string {
	var s []string
	for _, x := range xs {
		s = append(s, strconv.FormatFloat(x, 'f', 1, 64))
	}
	return strings.Join(s, ", ")
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// A minimal RESP client: one connection, TCP_NODELAY, GET and SET.
type redisConn struct {
	c  net.Conn
	br *bufio.Reader
	bw *bufio.Writer
	rb []byte
}

func newRedisPool(addr string, n int) ([]*redisConn, error) {
	var out []*redisConn
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		_ = c.(*net.TCPConn).SetNoDelay(true)
		out = append(out, &redisConn{c: c, br: bufio.NewReaderSize(c, 64<<10), bw: bufio.NewWriterSize(c, 64<<10), rb: make([]byte, 64<<10)})
	}
	return out, nil
}

func (r *redisConn) cmd(args ...[]byte) error {
	fmt.Fprintf(r.bw, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(r.bw, "$%d\r\n", len(a))
		r.bw.Write(a)
		r.bw.WriteString("\r\n")
	}
	return r.bw.Flush()
}

func (r *redisConn) set(k string, v []byte) error {
	if err := r.cmd([]byte("SET"), []byte(k), v); err != nil {
		return err
	}
	line, err := r.br.ReadSlice('\n')
	if err != nil {
		return err
	}
	if line[0] != '+' {
		return fmt.Errorf("redis SET: %q", line)
	}
	return nil
}

func (r *redisConn) get(k string, n int) error {
	if err := r.cmd([]byte("GET"), []byte(k)); err != nil {
		return err
	}
	line, err := r.br.ReadSlice('\n')
	if err != nil {
		return err
	}
	if line[0] != '$' {
		return fmt.Errorf("redis GET: %q", line)
	}
	l, _ := strconv.Atoi(strings.TrimSpace(string(line[1:])))
	if l != n {
		return fmt.Errorf("redis GET: length %d, want %d", l, n)
	}
	_, err = ioReadFull(r.br, r.rb[:l+2])
	return err
}

func ioReadFull(br *bufio.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := br.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
