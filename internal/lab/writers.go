package lab

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
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/sim"
)

// WritersConfig describes the writers scenario.
type WritersConfig struct {
	Lenders []int  // lender counts to run (default 1, 2, 3)
	Writers []int  // writer counts to run (default 1..6)
	Rate    string // tbf rate of every lender link (default DefaultRate)
	// Queue is the tbf queue limit as time (default: 1.25 MB at Rate, e.g.
	// "250ms" at 40 Mbit/s; see DefaultQueueBytes).
	Queue string
	// CongestionControl is the TCP congestion control of the lab's flows
	// (default "reno"; see DefaultCongestionControl).
	CongestionControl string
	// Bytes is what each writer writes per lender it stripes over (default
	// 4 MiB), so a scenario lasts about writers × Bytes / rate whatever
	// the number of lenders.
	Bytes   int64
	Request int // bytes per write request (default 1 MiB)
	Depth   int // requests in flight per writer (default 8)
	// Probe is how long the headroom probe writes before each scenario
	// (default 300 ms; see WriterRow.Headroom).
	Probe  time.Duration
	Logger *slog.Logger
}

// DefaultRate is the default tbf rate of a lender link. The real side must
// not depend on the CPU: at 40 Mbit/s the busiest scenario (3 lenders) moves
// 14 MB/s, which the data plane delivers with room to spare even under -race
// on a loaded 2-vCPU machine (WriterRow.Headroom measures it).
const DefaultRate = "40mbit"

// DefaultQueueBytes is the depth of a lender link's tbf queue when
// WritersConfig.Queue is empty. Six writers' TCP flows through one tbf FIFO shared
// it evenly (within 0.6–5.5% per writer) with 1–1.25 MB queues (about 860
// full-size frames; 100 ms at 100 Mbit/s) at 20–100 Mbit/s; with 50–750 kB
// one writer of six got 12–73% more than the others, whatever the rate and
// congestion control (docs/simulator.md). So the queue is sized in bytes,
// not in time.
const DefaultQueueBytes = 1_250_000

// DefaultCongestionControl is the lab's TCP congestion control. The
// simulator shares a link max-min fairly among the flows crossing it; that is
// the equilibrium of AIMD congestion control among flows of equal round-trip
// time (Chiu and Jain), which Reno implements. BBR (this machine's
// system-wide default) does not converge to equal shares in a deep FIFO
// within a run of seconds: with it one writer of five got up to 19% more
// than the others (docs/simulator.md). The setting is per route, inside the
// lab only.
const DefaultCongestionControl = "reno"

func (c *WritersConfig) defaults() {
	if len(c.Lenders) == 0 {
		c.Lenders = []int{1, 2, 3}
	}
	if len(c.Writers) == 0 {
		c.Writers = []int{1, 2, 3, 4, 5, 6}
	}
	if c.Rate == "" {
		c.Rate = DefaultRate
	}
	if c.CongestionControl == "" {
		c.CongestionControl = DefaultCongestionControl
	}
	if c.Probe <= 0 {
		c.Probe = 300 * time.Millisecond
	}
	if c.Bytes <= 0 {
		c.Bytes = 4 << 20
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

// WriterRow is one scenario: per-writer delivered bandwidth measured on the real
// data plane and predicted by the simulator, in bytes/s.
//
// Real and Sim are measured while every writer is active (from 20% of the
// time to the first writer's completion to that completion): the delivered
// bandwidth each writer gets from the shared links, which is what the
// simulator predicts and what the 10% goal is about. RealWhole and SimWhole
// are each writer's bytes over its own elapsed time (writers that finish
// early leave bandwidth to the others, so these depend on TCP's unfairness
// too).
//
// Headroom is what the real data plane could deliver at the time, measured
// just before the scenario (the same writers striping over the same number
// of exports through an unshaped link for WritersConfig.Probe), over what the
// scenario needs (the lenders' shaped payload rate): near or below 1 the
// CPU, not the links, is likely to bound the real side. It is a forecast;
// LinkBusy is the check.
//
// LinkBusy is the least, over the lenders, of the bytes the lender link's
// tbf sent during the scenario (frames, from its qdisc counters) over what
// the link can send in the scenario's makespan: about 1 when the links were
// the bottleneck throughout, as the simulator assumes; well below 1 when the
// writers could not keep them busy (a starved CPU, a stalled connection).
type WriterRow struct {
	Lenders, Writers    int
	Real, Sim           []float64
	RealWhole, SimWhole []float64
	Headroom, LinkBusy  float64
}

// MaxError is the largest relative error |real−sim|/sim over the writers.
func (r WriterRow) MaxError() float64 { return maxErr(r.Real, r.Sim) }

// MaxWholeError is MaxError for the whole-run figures.
func (r WriterRow) MaxWholeError() float64 { return maxErr(r.RealWhole, r.SimWhole) }

// AggregateError is the relative error of the writers' mean whole-run
// bandwidth (total bytes over the time to the last completion, per writer).
func (r WriterRow) AggregateError() float64 {
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

// WireEfficiency is the share of a shaped link's rate left for NBD payload
// (sim.WireEfficiency).
const WireEfficiency = sim.WireEfficiency

// SimulateWriters is sim.SimulateWriters: the simulator's prediction for a
// scenario.
func SimulateWriters(k, w int, rate float64, bytes int64) (steady, whole []float64) {
	return sim.SimulateWriters(k, w, rate, bytes)
}

// RunWriters runs every scenario of cfg on the real data plane and in the
// simulator.
func RunWriters(ctx context.Context, cfg WritersConfig) ([]WriterRow, error) {
	cfg.defaults()
	if err := netns.Available(); err != nil {
		return nil, err
	}
	rate, err := netns.ParseRate(cfg.Rate)
	if err != nil {
		return nil, err
	}
	if cfg.Queue == "" {
		cfg.Queue = strconv.FormatInt(DefaultQueueBytes*8*1000/rate, 10) + "ms"
	}
	maxW := 0
	for _, w := range cfg.Writers {
		maxW = max(maxW, w)
	}
	var rows []WriterRow
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

func runLenders(ctx context.Context, cfg WritersConfig, k, maxW int, rate float64) (rows []WriterRow, err error) {
	// Hosts 0..k-1 are the shaped lenders; host k is the headroom probe's
	// lender, shaped far above what the machine can move.
	rates := make([]string, k+1)
	rates[k] = "100gbit"
	lab, err := netns.New(ctx, netns.Config{Hosts: k + 1, Rate: cfg.Rate, HostRates: rates, Latency: cfg.Queue, CongestionControl: cfg.CongestionControl, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("lab: netns: %w", err)
	}
	defer func() {
		if cerr := lab.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	sctx, stop := context.WithCancel(ctx)
	lenders := make([]*lender, k+1)
	defer func() {
		stop()
		for _, l := range lenders {
			if l != nil {
				l.ln.Close()
				<-l.done
			}
		}
	}()
	// Every writer has its own export (a partition) on every lender; the
	// probe lender has as many, for the probe's writers.
	part := (cfg.Bytes + stripe.DefaultStripeUnit) / stripe.DefaultStripeUnit * stripe.DefaultStripeUnit
	names := make([][]string, maxW)
	probe := make([][]string, maxW)
	for i := 0; i <= k; i++ {
		h := lab.Host(i)
		ln, err := lab.Listen(ctx, i, "tcp", netip.AddrPortFrom(h.Addr, 0).String())
		if err != nil {
			return nil, fmt.Errorf("lab: listen in %s: %w", h.Namespace, err)
		}
		l := &lender{ln: ln, srv: &nbd.Server{Logger: cfg.Logger}, done: make(chan struct{}), addr: ln.Addr().String()}
		for w := 0; w < maxW && i < k; w++ {
			if i == 0 {
				names[w] = make([]string, k)
			}
			names[w][i] = randomName()
			if err := l.srv.AddExport(nbd.Export{Name: names[w][i], Backend: nbd.NewMemBackend(part)}); err != nil {
				ln.Close()
				return nil, err
			}
		}
		for w := 0; w < maxW && i == k; w++ {
			for j := 0; j < k; j++ {
				name := randomName()
				probe[w] = append(probe[w], name)
				if err := l.srv.AddExport(nbd.Export{Name: name, Backend: nbd.NewMemBackend(part)}); err != nil {
					ln.Close()
					return nil, err
				}
			}
		}
		lenders[i] = l
		go func() {
			defer close(l.done)
			_ = l.srv.Serve(sctx, ln)
		}()
	}
	pattern := newPattern(cfg.Request)
	for _, w := range cfg.Writers {
		avail, err := probeRate(ctx, cfg, lenders[k], probe[:w], pattern)
		if err != nil {
			return rows, fmt.Errorf("lab: %d lenders: headroom probe: %w", k, err)
		}
		sent0, err := linkSent(ctx, lab, k)
		if err != nil {
			return rows, err
		}
		steady, whole, err := measureWriters(ctx, cfg, lenders[:k], names[:w], pattern)
		if err != nil {
			return rows, fmt.Errorf("lab: %d lenders, %d writers: %w", k, w, err)
		}
		sent1, err := linkSent(ctx, lab, k)
		if err != nil {
			return rows, err
		}
		makespan := 0.0
		for _, r := range whole {
			makespan = math.Max(makespan, float64(cfg.Bytes*int64(k))/r)
		}
		busy := math.Inf(1)
		for i := range sent0 {
			busy = math.Min(busy, float64(sent1[i]-sent0[i])/(rate*makespan))
		}
		ss, sw := SimulateWriters(k, w, rate, cfg.Bytes*int64(k))
		rows = append(rows, WriterRow{Lenders: k, Writers: w, Real: steady, Sim: ss, RealWhole: whole, SimWhole: sw,
			Headroom: avail / (float64(k) * rate * WireEfficiency), LinkBusy: busy})
	}
	return rows, nil
}

// runWriters starts one writer per names entry at once and returns each
// writer's delivered bandwidth while all are active (see WriterRow) and over its
// own elapsed time.
func measureWriters(ctx context.Context, cfg WritersConfig, lenders []*lender, names [][]string, pattern []byte) (steady, whole []float64, err error) {
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
	bytes := cfg.Bytes * int64(len(lenders))
	for w := range vols {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[w] = writeSeq(ctx, vols[w], bytes, pattern, cfg, &done[w])
			whole[w] = float64(bytes) / time.Since(t0).Seconds()
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

// linkSent returns the bytes sent so far by the tbf of each of the first k
// hosts' links towards them (the root-namespace end of the veth, where the
// writers' data is shaped).
func linkSent(ctx context.Context, lab *netns.Lab, k int) ([]int64, error) {
	out := make([]int64, k)
	for i := range out {
		dev := lab.Host(i).RootIface
		b, err := exec.CommandContext(ctx, "tc", "-s", "qdisc", "show", "dev", dev).Output()
		if err != nil {
			return nil, fmt.Errorf("lab: tc -s qdisc show dev %s: %w", dev, err)
		}
		f := strings.Fields(string(b))
		for j := 0; j+2 < len(f); j++ {
			if f[j] == "Sent" && f[j+2] == "bytes" {
				out[i], err = strconv.ParseInt(f[j+1], 10, 64)
				break
			}
		}
		if err != nil || out[i] == 0 && !strings.Contains(string(b), "tbf") {
			return nil, fmt.Errorf("lab: no tbf counters on %s: %q", dev, b)
		}
	}
	return out, nil
}

// probeRate measures what len(names) writers, each striping over its
// len(names[w]) exports of the unshaped probe lender, deliver together in
// cfg.Probe: the rate the machine can move through the data plane right now
// for the scenario's workload (NBD, stripe, TCP, veth and bridge: the same
// code and kernel path, without the shaping).
func probeRate(ctx context.Context, cfg WritersConfig, l *lender, names [][]string, pattern []byte) (float64, error) {
	vols := make([]*stripe.Volume, len(names))
	for w := range names {
		var devs []stripe.Device
		for _, name := range names[w] {
			c, err := nbd.Dial(ctx, "tcp", l.addr, name)
			if err != nil {
				return 0, err
			}
			defer c.Close()
			devs = append(devs, c)
		}
		v, err := stripe.New(devs, stripe.Config{})
		if err != nil {
			return 0, err
		}
		vols[w] = v
	}
	// Each writer writes its volume over and over (sequentially, as in the
	// scenario) until the probe time is up.
	size := cfg.Bytes * int64(len(names[0])) / int64(cfg.Request) * int64(cfg.Request)
	pctx, cancel := context.WithTimeout(ctx, cfg.Probe)
	defer cancel()
	var done atomic.Int64
	errs := make([]error, len(vols))
	var wg sync.WaitGroup
	t0 := time.Now()
	for w, v := range vols {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for pctx.Err() == nil {
				if err := writeSeq(pctx, v, size, pattern, cfg, &done); err != nil && pctx.Err() == nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return float64(done.Load()) / time.Since(t0).Seconds(), ctx.Err()
}

// writeSeq writes bytes sequentially with cfg.Depth requests in flight, from
// pattern (cfg.Request bytes, filled once by the caller: the writers only
// read it, and filling it per writer would cost CPU inside the measurement).
func writeSeq(ctx context.Context, v *stripe.Volume, bytes int64, pattern []byte, cfg WritersConfig, done *atomic.Int64) error {
	n := (bytes + int64(cfg.Request) - 1) / int64(cfg.Request)
	next := make(chan int64)
	errs := make([]error, cfg.Depth)
	var wg sync.WaitGroup
	for d := 0; d < cfg.Depth; d++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for off := range next {
				b := pattern
				if rest := bytes - off; rest < int64(len(b)) {
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

// newPattern returns the bytes every write request carries.
func newPattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

// WritersResult turns rows into a sim.Result (CSV and SVG through package
// sim/report).
func WritersResult(rows []WriterRow, cfg WritersConfig) sim.Result {
	cfg.defaults()
	r := sim.Result{Name: "validate-writers", Description: "real data plane (netns + tc tbf + NBD + stripe) vs simulator: per-writer bandwidth, 1–6 writers on 1–3 lenders",
		Header: []string{"lenders", "writers", "writer", "real_MBps", "sim_MBps", "error_pct", "real_all_active_MBps", "sim_all_active_MBps", "headroom", "link_busy"}}
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
					strconv.FormatFloat(row.Real[i]/1e6, 'f', 2, 64), strconv.FormatFloat(row.Sim[i]/1e6, 'f', 2, 64),
					strconv.FormatFloat(row.Headroom, 'f', 1, 64), strconv.FormatFloat(row.LinkBusy, 'f', 3, 64)})
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
