package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"runtime/pprof"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
)

func runCycles(ctx context.Context, b backend, workers int, dur time.Duration) (cycleResult, error) {
	agentURL, stopAgent, err := fakeAgent()
	if err != nil {
		return cycleResult{}, err
	}
	defer stopAgent()
	c, err := start(ctx, b, nil, false)
	if err != nil {
		return cycleResult{}, err
	}
	defer c.stop()
	boot := api.NewClient(c.urlFor(0), bootTok, c.client)
	for i := 0; i < 8; i++ {
		if _, err := join(ctx, boot, fmt.Sprintf("lender%02d", i), agentURL, 4); err != nil {
			return cycleResult{}, err
		}
	}
	var wg sync.WaitGroup
	var errs atomic.Int64
	creates := make([][]float64, workers)
	releases := make([][]float64, workers)
	deadline := time.Now().Add(dur)
	t0 := time.Now()
	cpu0 := cpuSeconds()
	var pg0 float64
	if b.pg != nil {
		pg0 = pgCPU(b.pg.DataDir())
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := api.NewClient(c.urlFor(w), tenantTok, c.client)
			for time.Now().Before(deadline) {
				s := time.Now()
				l, err := tenant.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 30})
				if err != nil || l.State != api.LeaseActive {
					errs.Add(1)
					continue
				}
				m := time.Now()
				if _, err := tenant.ReleaseLease(ctx, l.ID); err != nil {
					errs.Add(1)
					continue
				}
				creates[w] = append(creates[w], m.Sub(s).Seconds())
				releases[w] = append(releases[w], time.Since(m).Seconds())
			}
		}()
	}
	wg.Wait()
	el := time.Since(t0).Seconds()
	cpu := cpuSeconds() - cpu0
	var pgc float64
	if b.pg != nil {
		pgc = pgCPU(b.pg.DataDir()) - pg0
	}
	bsum, bcount, retries := scrape(ctx, c, "lease")
	batch := 0.0
	if bcount > 0 {
		batch = bsum / bcount
	}
	var cr, rr, all []float64
	for w := range creates {
		cr = append(cr, creates[w]...)
		rr = append(rr, releases[w]...)
		for i := range creates[w] {
			all = append(all, creates[w][i]+releases[w][i])
		}
	}
	return cycleResult{cpu: cpu, wall: el, cycles: len(cr), perSec: float64(len(cr)) / el, createP50: pct(cr, 50), createP99: pct(cr, 99),
		releaseP99: pct(rr, 99), cycleP99: pct(all, 99), errors: errs.Load(), batch: batch, retries: retries, pgCPU: pgc}, nil
}

type hbResult struct {
	cpu      float64
	wall     float64
	beats    int
	hbPerSec float64
	hbP50    float64
	hbP99    float64
	apiP99   float64
	lateP99  float64 // all calls that started after settle
	lateN    int
	tenP50   float64 // the tenant's calls alone
	tenP99   float64
	cycles   int
	interval float64 // seconds, as told to the agents at the end
	missed   int64
	errors   int64
	downs    int
}

// runHeartbeats joins agents simulated agents (lightweight clients over
// real HTTP, each at the interval the control plane tells it) and a
// tenant running lease cycles and reads meanwhile.
//
// When prof is set, the CPU profile of the heartbeat phase alone (after
// the joins) is written to it.
//
// maxBeats, when not 0, is the control plane's MaxHeartbeatsPerSecond
// (else its default).
//
// tlsOn serves the control plane over HTTPS (start).
func runHeartbeats(ctx context.Context, b backend, agents int, dur time.Duration, maxBeats float64, tlsOn bool, prof io.Writer) (hbResult, error) {
	agentURL, stopAgent, err := fakeAgent()
	if err != nil {
		return hbResult{}, err
	}
	defer stopAgent()
	c, err := start(ctx, b, func(cfg *controlplane.Config) { cfg.MaxHeartbeatsPerSecond = maxBeats }, tlsOn)
	if err != nil {
		return hbResult{}, err
	}
	defer c.stop()
	joined := make([]api.JoinResponse, agents)
	var jwg sync.WaitGroup
	var jerr atomic.Value
	next := atomic.Int64{}
	for g := 0; g < 32; g++ {
		jwg.Add(1)
		go func() {
			defer jwg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= agents {
					return
				}
				// An agent joins through the replica it will heartbeat to.
				boot := api.NewClient(c.urlFor(i), bootTok, c.client)
				jr, err := join(ctx, boot, fmt.Sprintf("agent%05d", i), agentURL, 2)
				if err != nil {
					jerr.Store(err)
					return
				}
				joined[i] = jr
			}
		}()
	}
	jwg.Wait()
	if err, ok := jerr.Load().(error); ok {
		return hbResult{}, err
	}
	c.warm(ctx)
	// Every replica counts its own joins at once but the others' only
	// when it next counts the nodes (within 5 s): until then it tells a
	// shorter interval, and agents whose first beats were spread over
	// that would offer more than the cap. Spread them over the interval
	// every replica tells once it counts every node.
	spread := c.interval(ctx, time.Duration(joined[agents-1].HeartbeatSeconds*float64(time.Second)))
	log.Printf("%s: %d agents joined; %d connections open; first beats spread over %v (the last join was told %.1fs)", b.name, agents, c.dials.Load(), spread, joined[agents-1].HeartbeatSeconds)
	var wg sync.WaitGroup
	var errs, missed atomic.Int64
	var lastInterval atomic.Int64
	lat := make([][]float64, agents)
	late := make([][]float64, agents+4)  // calls that started after settle
	slow := make([][]slowCall, agents+4) // calls over slowAt, for the timeline
	if prof != nil {
		if err := pprof.StartCPUProfile(prof); err != nil {
			return hbResult{}, err
		}
	}
	start := time.Now()
	cpu0 := cpuSeconds()
	end := start.Add(dur)
	for i := 0; i < agents; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := api.NewClient(c.urlFor(i), joined[i].Credential, c.client)
			// The agents joined within seconds, so those that joined early
			// were told a shorter interval than the cluster now has; their
			// first heartbeat answer tells them the current one. Start
			// them spread evenly over the current interval (spread), as
			// agents that joined over time would be.
			iv := spread
			next := start.Add(time.Duration(i) * iv / time.Duration(agents))
			hb := api.Heartbeat{Health: "ok", Links: []api.LinkReport{{To: "controlplane", RTTMicros: 80, Up: true}}}
			for next.Before(end) {
				time.Sleep(time.Until(next))
				s := time.Now()
				r, err := cl.Heartbeat(ctx, joined[i].NodeID, hb)
				if err != nil {
					errs.Add(1)
				} else {
					d := time.Since(s)
					lat[i] = append(lat[i], d.Seconds())
					if s.Sub(start) >= settle {
						late[i] = append(late[i], d.Seconds())
					}
					if d > slowAt {
						slow[i] = append(slow[i], slowCall{s.Sub(start), d, "heartbeat"})
					}
					if r.HeartbeatSeconds > 0 {
						iv = time.Duration(r.HeartbeatSeconds * float64(time.Second))
						lastInterval.Store(int64(iv))
					}
				}
				next = next.Add(iv)
				if time.Now().After(next) {
					missed.Add(1) // the agent fell behind its period
				}
			}
		}()
	}
	// Meanwhile a tenant uses the API: lease cycles and reads.
	apiLat := make([][]float64, 4)
	var cycles atomic.Int64
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := api.NewClient(c.urlFor(w), tenantTok, c.client)
			for time.Now().Before(end) {
				s := time.Now()
				var err error
				switch w {
				case 0, 1:
					var l api.Lease
					l, err = tenant.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 30})
					if err == nil {
						apiLat[w] = append(apiLat[w], time.Since(s).Seconds())
						if s.Sub(start) >= settle {
							late[agents+w] = append(late[agents+w], time.Since(s).Seconds())
						}
						s = time.Now()
						_, err = tenant.ReleaseLease(ctx, l.ID)
						if err == nil {
							cycles.Add(1)
						}
					}
				case 2:
					var ls []api.Lease
					err = tenant.Do(ctx, "GET", "/v1/leases?live=1", nil, &ls)
				case 3:
					_, err = tenant.Node(ctx, joined[len(joined)/2].NodeID)
				}
				if err != nil {
					errs.Add(1)
					continue
				}
				d := time.Since(s)
				apiLat[w] = append(apiLat[w], d.Seconds())
				if s.Sub(start) >= settle {
					late[agents+w] = append(late[agents+w], d.Seconds())
				}
				if d > slowAt {
					slow[agents+w] = append(slow[agents+w], slowCall{s.Sub(start), d, [...]string{"release", "release", "list leases", "read node"}[w]})
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	cpu := cpuSeconds() - cpu0
	if prof != nil {
		pprof.StopCPUProfile()
	}
	logSlow(b.name, slow)
	var hl, al []float64
	for _, l := range lat {
		hl = append(hl, l...)
	}
	for _, l := range apiLat {
		al = append(al, l...)
	}
	all := append(append([]float64(nil), hl...), al...)
	var ll []float64
	for _, l := range late {
		ll = append(ll, l...)
	}
	nodes, err := api.NewClient(c.urlFor(0), tenantTok, c.client).Nodes(ctx)
	if err != nil {
		return hbResult{}, err
	}
	downs := 0
	for _, n := range nodes {
		if n.State != api.NodeReady {
			downs++
		}
	}
	return hbResult{cpu: cpu, wall: el, beats: len(hl), hbPerSec: float64(len(hl)) / el, hbP50: pct(hl, 50), hbP99: pct(hl, 99), apiP99: pct(all, 99),
		lateP99: pct(ll, 99), lateN: len(ll), tenP50: pct(al, 50), tenP99: pct(al, 99), cycles: int(cycles.Load()), interval: time.Duration(lastInterval.Load()).Seconds(), missed: missed.Load(), errors: errs.Load(), downs: downs}, nil
}

// settle is how long after the joins the calls of the "settled" figure
// start: the first seconds after 10,000 joins carry their aftermath (the
// first placement loads the whole inventory, garbage collection).
const settle = 5 * time.Second

// slowAt is the latency above which a call is logged in the timeline.
const slowAt = 50 * time.Millisecond

type slowCall struct {
	at, took time.Duration // start since the phase began, latency
	what     string
}

// logSlow logs, per second of the heartbeat phase, how many calls took
// over slowAt and the longest: stalls of the whole process show as
// seconds where many calls are slow at once.
func logSlow(name string, slow [][]slowCall) {
	type sec struct {
		n    int
		max  time.Duration
		what map[string]int
	}
	secs := map[int]*sec{}
	for _, l := range slow {
		for _, c := range l {
			k := int(c.at / time.Second)
			if secs[k] == nil {
				secs[k] = &sec{what: map[string]int{}}
			}
			secs[k].n++
			secs[k].max = max(secs[k].max, c.took)
			secs[k].what[c.what]++
		}
	}
	var ks []int
	for k := range secs {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	for _, k := range ks {
		log.Printf("%s: second %d: %d calls over %v (longest %v): %v", name, k, secs[k].n, slowAt, secs[k].max.Round(time.Millisecond), secs[k].what)
	}
}
