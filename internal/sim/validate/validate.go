package validate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/sim"
)

// Config describes the validation scenario.
type Config struct {
	Lenders []int  // lender counts to run (default 1, 2, 3)
	Writers []int  // writer counts to run (default 1..6)
	Rate    string // tbf rate of every lender link (default "100mbit")
	// Queue is the tbf queue limit as time (default "100ms": deep enough
	// that the writers' TCP flows share the link without tail drops).
	Queue   string
	Bytes   int64 // bytes each writer writes (default 16 MiB)
	Request int   // bytes per write request (default 1 MiB)
	Depth   int   // requests in flight per writer (default 8)
	Logger  *slog.Logger
}

func (c *Config) defaults() {
	if len(c.Lenders) == 0 {
		c.Lenders = []int{1, 2, 3}
	}
	if len(c.Writers) == 0 {
		c.Writers = []int{1, 2, 3, 4, 5, 6}
	}
	if c.Rate == "" {
		c.Rate = "100mbit"
	}
	if c.Queue == "" {
		c.Queue = "100ms"
	}
	if c.Bytes <= 0 {
		c.Bytes = 16 << 20
	}
	if c.Request <= 0 {
		c.Request = 1 << 20
	}
	if c.Depth <= 0 {
		c.Depth = 8
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Row is one scenario: per-writer delivered bandwidth measured on the real
// data plane and predicted by the simulator, in bytes/s.
//
// Real and Sim are measured while every writer is active (from 20% of the
// time to the first writer's completion to that completion): the delivered
// bandwidth each writer gets from the shared links, which is what the
// simulator predicts and what the 10% goal is about. RealWhole and SimWhole
// are each writer's bytes over its own elapsed time (writers that finish
// early leave bandwidth to the others, so these depend on TCP's unfairness
// too).
type Row struct {
	Lenders, Writers    int
	Real, Sim           []float64
	RealWhole, SimWhole []float64
}

// MaxError is the largest relative error |real−sim|/sim over the writers.
func (r Row) MaxError() float64 { return maxErr(r.Real, r.Sim) }

// MaxWholeError is MaxError for the whole-run figures.
func (r Row) MaxWholeError() float64 { return maxErr(r.RealWhole, r.SimWhole) }

// AggregateError is the relative error of the writers' mean whole-run
// bandwidth (total bytes over the time to the last completion, per writer).
func (r Row) AggregateError() float64 {
	// Real: the writers' mean of bytes/elapsed is not total/makespan; use the
	// slowest writer's elapsed time for the makespan.
	minR, minS := math.Inf(1), math.Inf(1)
	for i := range r.RealWhole {
		minR = math.Min(minR, r.RealWhole[i])
		minS = math.Min(minS, r.SimWhole[i])
	}
	return math.Abs(minR-minS) / minS
}

func maxErr(real, sim []float64) float64 {
	m := 0.0
	for i := range real {
		if e := math.Abs(real[i]-sim[i]) / sim[i]; e > m {
			m = e
		}
	}
	return m
}

// WireEfficiency is the share of a shaped link's rate left for NBD payload:
// tbf counts whole Ethernet frames (1,514 bytes for a full 1,500-byte MTU
// segment) of which 1,448 are TCP payload (IPv4 20 B, TCP 20 B + 12 B of
// timestamps); NBD's 28-byte request header per 1 MiB is negligible.
const WireEfficiency = 1448.0 / 1514.0

// Simulate predicts the per-writer bandwidth of w writers striping evenly
// over k lenders whose links carry rate bytes/s each: one flow per writer
// and lender, sharing the lender links max-min fairly, each writer done when
// its last stripe is. It returns each writer's rate while all are active and
// its bytes over its own elapsed time.
func Simulate(k, w int, rate float64, bytes int64) (steady, whole []float64) {
	var e sim.Engine
	n := sim.NewNet(&e)
	links := make([]*sim.Resource, k)
	for i := range links {
		links[i] = &sim.Resource{Name: fmt.Sprintf("lender%d", i), Capacity: rate * WireEfficiency}
	}
	whole = make([]float64, w)
	steady = make([]float64, w)
	flows := make([][]*sim.Flow, w)
	for j := 0; j < w; j++ {
		left := k
		for i := 0; i < k; i++ {
			f := n.Start(float64(bytes)/float64(k), []*sim.Resource{links[i]}, 0, func(*sim.Flow) {
				left--
				if left == 0 {
					whole[j] = float64(bytes) / e.Now()
				}
			})
			flows[j] = append(flows[j], f)
		}
	}
	// Rates are set at time 0 once the simultaneous starts are solved.
	e.At(0, func() {
		for j := range flows {
			for _, f := range flows[j] {
				steady[j] += f.Rate()
			}
		}
	})
	e.Run(0)
	return steady, whole
}

// Run runs every scenario of cfg on the real data plane and in the
// simulator.
func Run(ctx context.Context, cfg Config) ([]Row, error) {
	cfg.defaults()
	if err := netns.Available(); err != nil {
		return nil, err
	}
	rate, err := netns.ParseRate(cfg.Rate)
	if err != nil {
		return nil, err
	}
	maxW := 0
	for _, w := range cfg.Writers {
		maxW = max(maxW, w)
	}
	var rows []Row
	for _, k := range cfg.Lenders {
		rs, err := runLenders(ctx, cfg, k, maxW, float64(rate)/8) // tc rates are bits/s
		if err != nil {
			return rows, err
		}
		rows = append(rows, rs...)
	}
	return rows, nil
}

// lender is one namespace serving NBD exports.
type lender struct {
	addr string
	ln   net.Listener
	srv  *nbd.Server
	done chan struct{}
}

func randomName() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func runLenders(ctx context.Context, cfg Config, k, maxW int, rate float64) (rows []Row, err error) {
	lab, err := netns.New(ctx, netns.Config{Hosts: k, Rate: cfg.Rate, Latency: cfg.Queue, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("validate: lab: %w", err)
	}
	defer func() {
		if cerr := lab.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	sctx, stop := context.WithCancel(ctx)
	lenders := make([]*lender, k)
	defer func() {
		stop()
		for _, l := range lenders {
			if l != nil {
				l.ln.Close()
				<-l.done
			}
		}
	}()
	// Every writer has its own export (a partition) on every lender.
	part := (cfg.Bytes/int64(k) + stripe.DefaultStripeUnit) / stripe.DefaultStripeUnit * stripe.DefaultStripeUnit
	names := make([][]string, maxW)
	for i := 0; i < k; i++ {
		h := lab.Host(i)
		ln, err := lab.Listen(ctx, i, "tcp", netip.AddrPortFrom(h.Addr, 0).String())
		if err != nil {
			return nil, fmt.Errorf("validate: listen in %s: %w", h.Namespace, err)
		}
		l := &lender{ln: ln, srv: &nbd.Server{Logger: cfg.Logger}, done: make(chan struct{}), addr: ln.Addr().String()}
		for w := 0; w < maxW; w++ {
			if i == 0 {
				names[w] = make([]string, k)
			}
			names[w][i] = randomName()
			if err := l.srv.AddExport(nbd.Export{Name: names[w][i], Backend: nbd.NewMemBackend(part)}); err != nil {
				ln.Close()
				return nil, err
			}
		}
		lenders[i] = l
		go func() {
			defer close(l.done)
			_ = l.srv.Serve(sctx, ln)
		}()
	}
	for _, w := range cfg.Writers {
		steady, whole, err := runWriters(ctx, cfg, lenders, names[:w])
		if err != nil {
			return rows, fmt.Errorf("validate: %d lenders, %d writers: %w", k, w, err)
		}
		ss, sw := Simulate(k, w, rate, cfg.Bytes)
		rows = append(rows, Row{Lenders: k, Writers: w, Real: steady, Sim: ss, RealWhole: whole, SimWhole: sw})
	}
	return rows, nil
}

// runWriters starts one writer per names entry at once and returns each
// writer's delivered bandwidth while all are active (see Row) and over its
// own elapsed time.
func runWriters(ctx context.Context, cfg Config, lenders []*lender, names [][]string) (steady, whole []float64, err error) {
	vols := make([]*stripe.Volume, len(names))
	var clients []*nbd.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for w := range names {
		var devs []stripe.Device
		for i, l := range lenders {
			c, err := nbd.Dial(ctx, "tcp", l.addr, names[w][i])
			if err != nil {
				return nil, nil, err
			}
			clients = append(clients, c)
			devs = append(devs, c)
		}
		v, err := stripe.New(devs, stripe.Config{})
		if err != nil {
			return nil, nil, err
		}
		vols[w] = v
	}
	n := len(names)
	whole = make([]float64, n)
	errs := make([]error, n)
	done := make([]atomic.Int64, n)
	firstDone := make(chan struct{})
	var once sync.Once
	type sample struct {
		t     time.Duration
		bytes []int64
	}
	var samples []sample
	var wg sync.WaitGroup
	start := make(chan struct{})
	t0 := time.Now()
	// The sampler records every writer's completed bytes until the first
	// writer finishes (and once more at that instant).
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		take := func() {
			s := sample{t: time.Since(t0), bytes: make([]int64, n)}
			for i := range done {
				s.bytes[i] = done[i].Load()
			}
			samples = append(samples, s)
		}
		for {
			select {
			case <-firstDone:
				take()
				return
			case <-tick.C:
				take()
			}
		}
	}()
	for w := range vols {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[w] = writeSeq(ctx, vols[w], cfg, &done[w])
			whole[w] = float64(cfg.Bytes) / time.Since(t0).Seconds()
			once.Do(func() { close(firstDone) })
		}()
	}
	t0 = time.Now()
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	// Window: from the first sample at or after 20% of the first completion
	// to the first completion.
	last := samples[len(samples)-1]
	first := samples[0]
	for _, s := range samples {
		if s.t >= last.t/5 {
			first = s
			break
		}
	}
	steady = make([]float64, n)
	dt := (last.t - first.t).Seconds()
	for i := range steady {
		if dt > 0 {
			steady[i] = float64(last.bytes[i]-first.bytes[i]) / dt
		}
	}
	return steady, whole, nil
}

// writeSeq writes cfg.Bytes sequentially with cfg.Depth requests in flight.
func writeSeq(ctx context.Context, v *stripe.Volume, cfg Config, done *atomic.Int64) error {
	n := (cfg.Bytes + int64(cfg.Request) - 1) / int64(cfg.Request)
	next := make(chan int64)
	errs := make([]error, cfg.Depth)
	var wg sync.WaitGroup
	for d := 0; d < cfg.Depth; d++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, cfg.Request)
			for i := range buf {
				buf[i] = byte(i*7 + d)
			}
			for off := range next {
				b := buf
				if rest := cfg.Bytes - off; rest < int64(len(b)) {
					b = b[:rest]
				}
				if _, err := v.WriteAt(b, off); err != nil && errs[d] == nil {
					errs[d] = err
				}
				done.Add(int64(len(b)))
			}
		}()
	}
	var err error
	for i := int64(0); i < n; i++ {
		if err = ctx.Err(); err != nil {
			break
		}
		next <- i * int64(cfg.Request)
	}
	close(next)
	wg.Wait()
	return errors.Join(append(errs, err)...)
}

// Result turns rows into a sim.Result (CSV and SVG through package
// sim/report).
func Result(rows []Row, cfg Config) sim.Result {
	cfg.defaults()
	r := sim.Result{Name: "validate-writers", Description: "real data plane (netns + tc tbf + NBD + stripe) vs simulator: per-writer bandwidth, 1–6 writers on 1–3 lenders",
		Header: []string{"lenders", "writers", "writer", "real_MBps", "sim_MBps", "error_pct", "real_all_active_MBps", "sim_all_active_MBps"}}
	r.Plot = sim.Plot{Title: "Per-writer bandwidth: real vs simulated (tbf " + cfg.Rate + " per lender)", XLabel: "concurrent writers", YLabel: "MB/s per writer"}
	worst := 0.0
	for _, k := range cfg.Lenders {
		real := sim.Series{Name: fmt.Sprintf("%d lender(s) real (mean)", k)}
		simS := sim.Series{Name: fmt.Sprintf("%d lender(s) simulated", k)}
		for _, row := range rows {
			if row.Lenders != k {
				continue
			}
			sum := 0.0
			for i := range row.Real {
				e := (row.RealWhole[i] - row.SimWhole[i]) / row.SimWhole[i]
				r.Rows = append(r.Rows, []string{strconv.Itoa(k), strconv.Itoa(row.Writers), strconv.Itoa(i + 1),
					strconv.FormatFloat(row.RealWhole[i]/1e6, 'f', 2, 64), strconv.FormatFloat(row.SimWhole[i]/1e6, 'f', 2, 64), strconv.FormatFloat(100*e, 'f', 1, 64),
					strconv.FormatFloat(row.Real[i]/1e6, 'f', 2, 64), strconv.FormatFloat(row.Sim[i]/1e6, 'f', 2, 64)})
				sum += row.RealWhole[i]
			}
			worst = math.Max(worst, row.MaxWholeError())
			real.X, real.Y = append(real.X, float64(row.Writers)), append(real.Y, sum/float64(len(row.RealWhole))/1e6)
			simS.X, simS.Y = append(simS.X, float64(row.Writers)), append(simS.Y, row.SimWhole[0]/1e6)
		}
		r.Plot.Series = append(r.Plot.Series, real, simS)
	}
	r.Metrics = []sim.Metric{{Name: "worst per-writer error |real-sim|/sim (bytes over own elapsed time)", Value: worst}}
	return r
}
