package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/rialto-project/rialto/bench/internal/stats"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/gateway"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/mct"
)

var (
	outPath   = flag.String("out", "docs/bench/accel.md", "Markdown fragment to write")
	svgPath   = flag.String("svg", "docs/bench/accel-pareto.svg", "SVG plot to write")
	runs      = flag.Int("runs", 5, "interleaved runs of each comparison")
	dur       = flag.Duration("dur", 1500*time.Millisecond, "measurement time per figure")
	sweepDur  = flag.Duration("sweepdur", 500*time.Millisecond, "measurement time per sweep point and pass")
	sweepRuns = flag.Int("sweepruns", 3, "interleaved passes over the sweep points")
	nRules    = flag.Int("rules", 2000, "MCT rules")
	clients   = flag.Int("clients", 64, "concurrent clients")
	gwBatch   = flag.Int("gw-batch", 32, "gateway max batch (headline figures)")
	gwDelay   = flag.Duration("gw-delay", 500*time.Microsecond, "gateway max queue delay (headline figures)")
	gwWork    = flag.Int("gw-workers", 4, "gateway workers (headline figures)")
	gwInst    = flag.Int("gw-instances", 3, "gateway slot instances (headline figures)")
	doSweep   = flag.Bool("sweep", true, "run the knob sweep")
	rev       = flag.String("rev", "", "source revision to record (default: git's)")
	rialtoBin = flag.String("bin", "bin/rialto", "the rialto binary: the slots are leases of a `rialto agent` process")
	workDir   = flag.String("work", "/dev/shm", "where the cluster keeps its state")
)

// agentPID is the `rialto agent` serving the leases: its CPU time is
// counted with this process's.
var agentPID int

type sample struct {
	qps      float64
	p50, p99 time.Duration
	errs     int64
	cpuPerOp time.Duration // process CPU time (user+system) per call
}

// agentCPU is the agent's CPU time so far.
func agentCPU() time.Duration {
	return time.Duration(stats.ProcCPU(agentPID) * float64(time.Second))
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure runs fn from n goroutines for d and returns throughput and
// latency percentiles of the successful calls.
func measure(d time.Duration, n int, fn func(g int) error) sample {
	// Warm up briefly, unrecorded.
	warm := time.Now().Add(d / 10)
	var wg sync.WaitGroup
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(warm) {
				_ = fn(g)
			}
		}()
	}
	wg.Wait()
	lat := make([][]time.Duration, n)
	var errs atomic.Int64
	cpu0 := cpuTime() + agentCPU()
	start := time.Now()
	deadline := start.Add(d)
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := make([]time.Duration, 0, 4096)
			for {
				t0 := time.Now()
				if t0.After(deadline) {
					break
				}
				if err := fn(g); err != nil {
					errs.Add(1)
					continue
				}
				l = append(l, time.Since(t0))
			}
			lat[g] = l
		}()
	}
	wg.Wait()
	el := time.Since(start)
	cpu := cpuTime() + agentCPU() - cpu0
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	s := sample{errs: errs.Load()}
	if len(all) > 0 {
		s.qps = float64(len(all)) / el.Seconds()
		s.p50 = all[len(all)/2]
		s.p99 = all[min(len(all)-1, len(all)*99/100)]
		s.cpuPerOp = cpu / time.Duration(len(all))
	}
	return s
}

type env struct {
	cl      *cluster
	engine  *mct.Engine
	queries [][]byte // encoded 64-byte queries
	qi      atomic.Uint64
}

func (e *env) query() []byte { return e.queries[e.qi.Add(1)%uint64(len(e.queries))] }

// dial connects to slot 0 (the echo lease's) or 1..3 (the MCT lease's).
func (e *env) dial(ctx context.Context, slot int) *accel.Conn {
	addr, cred := e.cl.echo.addrs[0], e.cl.echo.cred
	if slot > 0 {
		addr, cred = e.cl.mct.addrs[slot-1], e.cl.mct.cred
	}
	c, err := accel.Dial(ctx, addr, cred)
	if err != nil {
		log.Fatal(err)
	}
	return c
}

// newGateway builds a gateway over `instances` connections to the MCT
// slots (round-robin over slots 1..3).
func (e *env) newGateway(parent context.Context, maxBatch int, delay time.Duration, workers, instances int) (*gateway.Gateway, func()) {
	var bs []gateway.Backend
	var conns []*accel.Conn
	for i := 0; i < instances; i++ {
		c := e.dial(parent, 1+i%3)
		conns = append(conns, c)
		bs = append(bs, c)
	}
	g, err := gateway.New(gateway.Config{MaxBatch: maxBatch, MaxQueueDelay: delay, Workers: workers, QueueLimit: 1 << 16}, bs)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Run(ctx) }()
	for !g.Running() {
		runtime.Gosched()
	}
	return g, func() {
		cancel()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	}
}

func checkResult(out []byte) error {
	if len(out) != 4 {
		return fmt.Errorf("result of %d bytes", len(out))
	}
	return nil
}

// zmqPipeline is the ERBIUM paper's integration: REQ clients → a ROUTER broker →
// one DEALER per worker (round robin) → REP workers that run the kernel.
// (zmq4's DEALER sends every message to all its peers, so the broker keeps
// one DEALER per worker instead of using zmq4.Proxy with a shared DEALER.)
type zmqPipeline struct {
	front   zmq4.Socket
	dealers []zmq4.Socket
	workers []zmq4.Socket
	clients []zmq4.Socket
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// newZMQ builds the pipeline. With batch, each worker is a DEALER that
// drains whatever requests have arrived (up to 64) into one kernel call and
// answers each with its envelope — the ERBIUM paper's MCT wrapper batching.
func newZMQ(parent context.Context, e *env, nWorkers, nClients int, batch bool) *zmqPipeline {
	ctx, cancel := context.WithCancel(parent)
	z := &zmqPipeline{cancel: cancel}
	fe := "tcp://" + freePort()
	z.front = zmq4.NewRouter(ctx, zmq4.WithTimeout(10*time.Second))
	if err := z.front.Listen(fe); err != nil {
		log.Fatal(err)
	}
	var frontMu sync.Mutex
	for w := 0; w < nWorkers; w++ {
		be := "tcp://" + freePort()
		d := zmq4.NewDealer(ctx, zmq4.WithTimeout(10*time.Second))
		if err := d.Listen(be); err != nil {
			log.Fatal(err)
		}
		z.dealers = append(z.dealers, d)
		if batch {
			wd := zmq4.NewDealer(ctx, zmq4.WithTimeout(10*time.Second))
			if err := wd.Dial(be); err != nil {
				log.Fatal(err)
			}
			z.workers = append(z.workers, wd)
			z.wg.Add(1)
			go func() {
				defer z.wg.Done()
				z.batchWorker(e, wd)
			}()
		} else {
			rep := zmq4.NewRep(ctx)
			if err := rep.Dial(be); err != nil {
				log.Fatal(err)
			}
			z.workers = append(z.workers, rep)
			z.wg.Add(1)
			go func() { // the worker: MCT wrapper + kernel, one query per message
				defer z.wg.Done()
				out := make([]byte, 4)
				for {
					m, err := rep.Recv()
					if err != nil {
						return
					}
					if err := e.engine.MatchBatch(m.Bytes(), out); err != nil {
						return
					}
					if err := rep.Send(zmq4.NewMsg(append([]byte(nil), out...))); err != nil {
						return
					}
				}
			}()
		}
		z.wg.Add(1)
		go func() { // replies back to the clients through the ROUTER
			defer z.wg.Done()
			for {
				m, err := d.Recv()
				if err != nil {
					return
				}
				frontMu.Lock()
				err = z.front.SendMulti(m)
				frontMu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	z.wg.Add(1)
	go func() { // requests to the workers, round robin
		defer z.wg.Done()
		for i := 0; ; i++ {
			m, err := z.front.Recv()
			if err != nil {
				return
			}
			if err := z.dealers[i%len(z.dealers)].SendMulti(m); err != nil {
				return
			}
		}
	}()
	for c := 0; c < nClients; c++ {
		req := zmq4.NewReq(ctx)
		if err := req.Dial(fe); err != nil {
			log.Fatal(err)
		}
		z.clients = append(z.clients, req)
	}
	return z
}

// batchWorker receives [client id, "", query] messages, batches what has
// arrived, runs the kernel once and replies [client id, "", result].
func (z *zmqPipeline) batchWorker(e *env, d zmq4.Socket) {
	msgs := make(chan zmq4.Msg, 256)
	go func() {
		defer close(msgs)
		for {
			m, err := d.Recv()
			if err != nil {
				return
			}
			msgs <- m
		}
	}()
	for m := range msgs {
		batch := []zmq4.Msg{m}
	drain:
		for len(batch) < 64 {
			select {
			case m2, ok := <-msgs:
				if !ok {
					break drain
				}
				batch = append(batch, m2)
			default:
				break drain
			}
		}
		qs := make([]byte, 0, len(batch)*mct.QuerySize)
		for _, b := range batch {
			qs = append(qs, b.Frames[len(b.Frames)-1]...)
		}
		out := make([]byte, len(batch)*mct.ResultSize)
		if err := e.engine.MatchBatch(qs, out); err != nil {
			continue
		}
		for i, b := range batch {
			frames := append(append([][]byte{}, b.Frames[:len(b.Frames)-1]...), out[4*i:4*i+4])
			if err := d.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
				for range msgs { // let the reader finish once the socket closes
				}
				return
			}
		}
	}
}

func (z *zmqPipeline) call(c int, q []byte) ([]byte, error) {
	s := z.clients[c]
	if err := s.Send(zmq4.NewMsg(q)); err != nil {
		return nil, err
	}
	m, err := s.Recv()
	if err != nil {
		return nil, err
	}
	return m.Bytes(), nil
}

func (z *zmqPipeline) close() {
	for _, s := range z.clients {
		_ = s.Close()
	}
	for _, s := range z.workers {
		_ = s.Close()
	}
	for _, s := range z.dealers {
		_ = s.Close()
	}
	_ = z.front.Close()
	z.cancel()
	z.wg.Wait()
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return math.NaN()
	}
	return s[len(s)/2]
}

func medDur(xs []time.Duration) time.Duration {
	f := make([]float64, len(xs))
	for i, x := range xs {
		f[i] = float64(x)
	}
	return time.Duration(median(f))
}

type series struct {
	name  string
	qps   []float64
	p50   []time.Duration
	p99   []time.Duration
	cpu   []time.Duration
	errs  int64
	items float64 // queries per call (1 unless grouped)
}

func (s *series) add(x sample) {
	s.qps = append(s.qps, x.qps)
	s.p50 = append(s.p50, x.p50)
	s.p99 = append(s.p99, x.p99)
	s.cpu = append(s.cpu, x.cpuPerOp)
	s.errs += x.errs
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }

func main() {
	stats.Commit(".") // the tree measured, before it can change: the report names it
	flag.Parse()
	log.SetFlags(0)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(2026, 11))
	rs := mct.Generate(rng, *nRules)
	engine, err := mct.Compile(rs)
	if err != nil {
		log.Fatal(err)
	}
	enc, err := engine.EncodeAll(mct.GenerateQueries(rng, 4096))
	if err != nil {
		log.Fatal(err)
	}
	e := &env{engine: engine}
	for i := 0; i < 4096; i++ {
		e.queries = append(e.queries, enc[i*mct.QuerySize:(i+1)*mct.QuerySize])
	}
	rsJSON, _ := jsonMarshal(rs)
	cl, err := startCluster(ctx, *rialtoBin, *workDir, rsJSON)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.close()
	e.cl = cl
	agentPID = cl.agentPID
	merged, trie := engine.States()
	log.Printf("MCT: %d rules, %d NFA states (%d before suffix merging)", *nRules, merged, trie)

	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }
	w("## Accelerators through accel leases of `rialto agent` (mailbox protocol, batching gateway)\n\n")
	commit := stats.Commit(".")
	if *rev != "" {
		commit = *rev
	}
	w("Measured %s by `bench/accel/run.sh` (bench/accel) at commit %s on %s. ", stats.Stamp(), commit, stats.Machine())
	var sp []svgPoint
	if *doBase {
		sp = runBase(ctx, e, merged, trie, w)
	} else {
		w("The slots are leases of `rialto agent` processes made with `rialto lease create` against a `rialto server` " +
			"(this fragment was written with -base=false: only the shared-gateway sections ran).\n\n")
	}
	if *doShares {
		if err := sharesSections(ctx, e, cl, *rialtoBin, filepath.Join(cl.dir, "mct-rules.json"), w); err != nil {
			log.Fatal(err)
		}
	}
	var args []string
	flag.VisitAll(func(f *flag.Flag) {
		switch f.Name {
		case "out", "svg", "bin", "work", "rev":
			return
		}
		args = append(args, "-"+f.Name+"="+f.Value.String())
	})
	w("\nCommand: `bench/accel/run.sh` (= `accel-bench -bin bin/rialto %s`, built from bench/accel). Rialto's processes:\n\n```\n",
		strings.Join(args, " "))
	for _, c := range cl.lab.Commands {
		w("%s\n", c)
	}
	w("```\n")
	if err := os.MkdirAll(filepath.Dir(*outPath), 0o755); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*outPath, []byte(b.String()), 0o644); err != nil {
		log.Fatal(err)
	}
	if len(sp) > 0 {
		if err := os.WriteFile(*svgPath, []byte(paretoSVG(sp)), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Print(b.String())
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

func fmtList(xs []float64) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprintf("%.1f", x))
	}
	if len(s) == 0 {
		return "n/a"
	}
	return strings.Join(s, ", ")
}

// runBase measures the round trips, the MCT setups against ZeroMQ and the
// gateway sweep on the first agent's leases, writes their sections with w
// and returns the sweep's points for the plot.
func runBase(ctx context.Context, e *env, merged, trie int, w func(string, ...any)) []svgPoint {
	cl, engine := e.cl, e.engine
	var err error
	// Fixed setups reused by every run.
	echoConn := e.dial(ctx, 0)
	echoLocal, _ := roles.New(ctx, roles.Spec{Name: "echo"})
	payload := make([]byte, 64)

	n := *clients
	unbatchedConns := make([]*accel.Conn, n)
	for i := range unbatchedConns {
		unbatchedConns[i] = e.dial(ctx, 1+i%3)
	}
	const groupSize = 16
	gwBatch, gwDelay, gwWorkers, gwInstances := *gwBatch, *gwDelay, *gwWork, *gwInst
	gIn, stopIn := e.newGateway(ctx, gwBatch, gwDelay, gwWorkers, gwInstances)
	// The lender's batching gateway: three shared leases of the MCT role
	// (each lends the gateway one slot), the clients spread over them.
	gwConns := make([]*accel.Conn, n)
	for i := range gwConns {
		g := cl.gw[i%len(cl.gw)]
		if gwConns[i], err = accel.Dial(ctx, g.addrs[0], g.cred); err != nil {
			log.Fatal(err)
		}
	}
	zmqWorkers := gwInstances
	z := newZMQ(ctx, e, zmqWorkers, n, false)
	zb := newZMQ(ctx, e, zmqWorkers, n, true)

	// Sanity: every path returns the brute-force answer.
	for i := 0; i < 50; i++ {
		q := e.queries[i]
		want, _, _ := engine.BruteForce(q)
		paths := map[string]func() ([]byte, error){
			"direct":  func() ([]byte, error) { return unbatchedConns[0].Call(ctx, "match", q) },
			"gateway": func() ([]byte, error) { return gIn.Call(ctx, "match", q) },
			"gw-tcp":  func() ([]byte, error) { return gwConns[0].Call(ctx, "match", q) },
			"zmq":     func() ([]byte, error) { return z.call(0, q) },
			"zmq-b":   func() ([]byte, error) { return zb.call(0, q) },
		}
		for name, p := range paths {
			out, err := p()
			if err != nil || len(out) != 4 || binary.LittleEndian.Uint32(out) != want {
				log.Fatalf("%s: query %d: %x %v (want %d)", name, i, out, err, want)
			}
		}
	}

	echoRemote := &series{name: "remote echo (accel.Conn.Call, 64 B, 1 client)"}
	echoMailbox := &series{name: "remote echo, mailbox path (write, start, wait, read)"}
	echoIn := &series{name: "in-process echo (Role.Run, 64 B)"}
	echoPipe := &series{name: "remote echo, pipelined mailbox (Conn.Mailbox: write+start, then read)"}
	unb := &series{name: "unbatched: each query one remote task"}
	bat := &series{name: "batched: in-process gateway → remote slots"}
	zq := &series{name: "ZeroMQ REQ → ROUTER/DEALER → REP workers (MCT in worker)"}
	zqb := &series{name: "ZeroMQ, workers batching what has arrived (DEALER workers, ≤64 per kernel call)"}
	gwt := &series{name: "the lender's gateway (3 shared leases of the agent, accel protocol) → its slots"}
	grp := &series{name: "the lender's gateway, 16 related queries per request (CallBatch)", items: groupSize}
	var steals []float64
	for r := 0; r < *runs; r++ {
		s0 := stats.SampleCPU()
		log.Printf("run %d/%d", r+1, *runs)
		echoRemote.add(measure(*dur, 1, func(int) error { _, err := echoConn.Call(ctx, "echo", payload); return err }))
		echoIn.add(measure(*dur, 1, func(int) error { _, err := echoLocal.Run(ctx, "echo", payload); return err }))
		echoMailbox.add(measure(*dur, 1, func(int) error {
			if err := echoConn.WriteMem(ctx, 0, payload); err != nil {
				return err
			}
			t, err := echoConn.Start(ctx, accel.TaskSpec{Entry: "echo", In: 0, InLen: 64, Out: 4096, OutCap: 64})
			if err != nil {
				return err
			}
			if _, err := t.Wait(ctx); err != nil {
				return err
			}
			_, err = echoConn.ReadMem(ctx, 4096, 64)
			return err
		}))
		echoPipe.add(measure(*dur, 1, func(int) error {
			_, err := echoConn.Mailbox(ctx, "echo", payload, 0, 4096, 64)
			return err
		}))
		unb.add(measure(*dur, n, func(g int) error {
			q := e.query()
			out, err := unbatchedConns[g].Call(ctx, "match", q)
			if err == nil {
				err = checkResult(out)
			}
			return err
		}))
		bat.add(measure(*dur, n, func(g int) error {
			q := e.query()
			out, err := gIn.Call(ctx, "match", q)
			if err == nil {
				err = checkResult(out)
			}
			return err
		}))
		zq.add(measure(*dur, n, func(g int) error {
			q := e.query()
			out, err := z.call(g, q)
			if err == nil {
				err = checkResult(out)
			}
			return err
		}))
		zqb.add(measure(*dur, n, func(g int) error {
			out, err := zb.call(g, e.query())
			if err == nil {
				err = checkResult(out)
			}
			return err
		}))
		gwt.add(measure(*dur, n, func(g int) error {
			q := e.query()
			out, err := gwConns[g].Call(ctx, "match", q)
			if err == nil {
				err = checkResult(out)
			}
			return err
		}))
		grp.add(measure(*dur, n, func(g int) error {
			group := make([][]byte, groupSize)
			for i := range group {
				group[i] = e.query()
			}
			outs, err := gwConns[g].CallBatch(ctx, "match", group)
			if err == nil && len(outs) != groupSize {
				err = fmt.Errorf("%d results", len(outs))
			}
			return err
		}))
		if pct, ok := s0.StealUntil(stats.SampleCPU()); ok {
			steals = append(steals, pct)
		}
	}
	gStats := gIn.Stats()

	// Sweep of the gateway knobs (in-process clients → remote slots).
	type point struct {
		label                     string
		batch, workers, instances int
		delay                     time.Duration
		s                         sample
		pareto                    bool
	}
	var pts []point
	sweepBatches := []int{1, 8, 32, 64}
	if !*doSweep {
		sweepBatches = nil
	}
	for _, b := range sweepBatches {
		for _, d := range []time.Duration{0, 500 * time.Microsecond} {
			if b == 1 && d > 0 {
				continue
			}
			for _, w := range []int{1, 2, 4} {
				for _, inst := range []int{1, 3} {
					label := fmt.Sprintf("b%d d%v w%d i%d", b, d, w, inst)
					pts = append(pts, point{label: label, batch: b, workers: w, instances: inst, delay: d})
				}
			}
		}
	}
	// Every point is measured in each of `runs` passes (interleaved in
	// time) and reported as the median.
	samples := make([]series, len(pts))
	for pass := 0; pass < *sweepRuns && len(pts) > 0; pass++ {
		for i, p := range pts {
			g, stop := e.newGateway(ctx, p.batch, p.delay, p.workers, p.instances)
			s := measure(*sweepDur, n, func(int) error { _, err := g.Call(ctx, "match", e.query()); return err })
			stop()
			samples[i].add(s)
			log.Printf("sweep %d %-22s %9.0f q/s p99 %s µs", pass+1, p.label, s.qps, us(s.p99))
		}
	}
	for i := range pts {
		pts[i].s = sample{qps: median(samples[i].qps), p50: medDur(samples[i].p50), p99: medDur(samples[i].p99)}
	}
	for i := range pts {
		pts[i].pareto = true
		for j := range pts {
			if j != i && pts[j].s.qps >= pts[i].s.qps && pts[j].s.p99 <= pts[i].s.p99 &&
				(pts[j].s.qps > pts[i].s.qps || pts[j].s.p99 < pts[i].s.p99) {
				pts[i].pareto = false
				break
			}
		}
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].s.qps > pts[j].s.qps })

	// Tear down.
	for _, c := range gwConns {
		_ = c.Close()
	}
	stopIn()
	z.close()
	zb.close()
	for _, c := range unbatchedConns {
		_ = c.Close()
	}
	_ = echoConn.Close()

	w("The slots are leases of a `rialto agent` process (`--accel 7 --slot-memory 1MiB`; its appliance runs 2 workers per slot), "+
		"made with `rialto lease create` against a `rialto server`: one dedicated slot with the echo role, a dedicated lease of "+
		"3 slots with the MCT role (%d rules compiled into %d NFA states — %d before suffix merging — passed with --role-config), "+
		"and 3 shared leases of the MCT role (`--share 1` each: a slot apiece), served by the agent's batching gateway with its defaults. The clients "+
		"(%d concurrent, 64-byte MCT queries, one query per request) and the ZeroMQ peer run in the benchmark's process, on loopback. "+
		"Figures are medians of %d interleaved runs of %v each (A B C D … per run); steal time per run: %s%%. "+
		"No images are involved (everything is in memory).\n\n",
		*nRules, merged, trie, *clients, *runs, *dur, fmtList(steals))
	w("### Remote round trip vs in-process call (1 client, 64 B)\n\n| path | calls/s | p50 µs | p99 µs |\n|---|---|---|---|\n")
	for _, s := range []*series{echoIn, echoRemote, echoMailbox, echoPipe} {
		w("| %s | %.0f | %s | %s |\n", s.name, median(s.qps), us(medDur(s.p50)), us(medDur(s.p99)))
	}
	w("\nRemote/in-process latency ratio (p50): %.0f×.\n\n", float64(medDur(echoRemote.p50))/math.Max(1, float64(medDur(echoIn.p50))))
	w("### MCT queries/s with %d concurrent clients\n\n"+
		"p50/p99 are per request; CPU is the user+system time of the benchmark's process (clients, in-process gateway, "+
		"ZeroMQ sockets and workers alike) plus the agent's (slots, the lender's gateway) per query, a figure less "+
		"sensitive than throughput to the other tenants of this machine.\n\n"+
		"Setups: *unbatched* — each client has its own connection to an MCT slot and sends one query per task; "+
		"*batched* — the clients call a gateway in their own process (the gateway package as a sidecar, like the ERBIUM "+
		"paper's MCT wrapper feeding its kernel), which ships batches to the dedicated lease's slots; *ZeroMQ* — REQ "+
		"clients, a ROUTER broker, one DEALER per worker, REP workers running the same MCT engine in-process (the ERBIUM "+
		"paper's pipeline); *the lender's gateway* — the same clients hold shared leases and call the agent's gateway over "+
		"the accel protocol, which batches onto its slots (so each query crosses two hops, as in the ZeroMQ pipeline).\n\n"+
		"| setup | queries/s | p50 µs | p99 µs | CPU µs/query | errors |\n|---|---|---|---|---|---|\n", n)
	for _, s := range []*series{unb, bat, zq, zqb, gwt, grp} {
		k := max(s.items, 1)
		w("| %s | %.0f | %s | %s | %.1f | %d |\n", s.name, k*median(s.qps), us(medDur(s.p50)), us(medDur(s.p99)),
			float64(medDur(s.cpu))/1e3/k, s.errs)
	}
	bRatio := median(bat.qps) / median(unb.qps)
	gRatio := median(gwt.qps) / median(zq.qps)
	var bRuns, gRuns []float64
	for i := range bat.qps {
		bRuns = append(bRuns, bat.qps[i]/unb.qps[i])
		gRuns = append(gRuns, gwt.qps[i]/zq.qps[i])
	}
	w("\nIn-process gateway settings (picked from the Pareto front of earlier sweeps on this machine, as the ERBIUM paper "+
		"picks p/w/k/e): max batch %d, max queue delay %v, %d workers, %d slot instances (connections to the 3 slots); "+
		"the lender's gateway runs the agent's defaults (docs/accelerators.md: max batch 64, max delay 200µs, a worker per slot); "+
		"ZeroMQ: %d workers. The in-process gateway ran %d executions for %d queries over all runs "+
		"(average batch %.1f).\n\n", gwBatch, gwDelay, gwWorkers, gwInstances, zmqWorkers, gStats.Executions, gStats.Items, gStats.AvgBatch)
	w("| goal | measured (ratio of medians; per run) | met |\n|---|---|---|\n")
	w("| batching ≥ 5× unbatched throughput | %.1f× (%s) | %s |\n", bRatio, fmtList(bRuns), yes(bRatio >= 5))
	w("| (same, as CPU time per query, unbatched ÷ batched) | %.1f× | — |\n", float64(medDur(unb.cpu))/math.Max(1, float64(medDur(bat.cpu))))
	p99ok := medDur(gwt.p99) <= medDur(zq.p99)
	w("| gateway ≥ 1.5× ZeroMQ throughput at equal or lower p99 | %.2f× (%s) at p99 %s vs %s µs | %s |\n",
		gRatio, fmtList(gRuns), us(medDur(gwt.p99)), us(medDur(zq.p99)), yes(gRatio >= 1.5 && p99ok))
	gbRatio := median(gwt.qps) / median(zqb.qps)
	w("| (same against the ZeroMQ pipeline whose workers batch) | %.2f× at p99 %s vs %s µs | %s |\n\n",
		gbRatio, us(medDur(gwt.p99)), us(medDur(zqb.p99)), yes(gbRatio >= 1.5 && medDur(gwt.p99) <= medDur(zqb.p99)))
	w("The ZeroMQ baseline uses github.com/go-zeromq/zmq4 (pure Go, a dependency of the bench module only), not libzmq; " +
		"its per-message cost is part of what is compared. Its broker keeps one DEALER per worker because zmq4's " +
		"DEALER sends each message to every peer. The first variant's REP workers answer one query per message; the " +
		"second variant's DEALER workers batch whatever queries have arrived (up to 64) into one kernel call, as the " +
		"ERBIUM paper's MCT wrapper did, and answer each query with its own message.\n\n")
	w("### Gateway sweep: batch size, queue delay, workers, instances\n\n")
	w("In-process gateway, %d clients, the dedicated lease's MCT slots; medians of %d interleaved passes of %v per point. "+
		"Label `bB dD wW iI`: max batch B, max queue delay D, W workers, I slot instances. "+
		"★ marks the Pareto front (no other point has both more throughput and a lower p99).\n\n", n, *sweepRuns, *sweepDur)
	w("![latency–throughput](bench/accel-pareto.svg)\n\n| config | queries/s | p50 µs | p99 µs | Pareto |\n|---|---|---|---|---|\n")
	for _, p := range pts {
		star := ""
		if p.pareto {
			star = "★"
		}
		w("| %s | %.0f | %s | %s | %s |\n", p.label, p.s.qps, us(p.s.p50), us(p.s.p99), star)
	}
	var sp []svgPoint
	for _, p := range pts {
		sp = append(sp, svgPoint{label: p.label, x: p.s.qps, y: float64(p.s.p99) / 1e3, pareto: p.pareto})
	}
	return sp
}
