package main

// Two tenants on one shared gateway, through leases: weighted shares under
// saturation, the cost of one tenant's cancelled calls to the other, and
// the time to stop a runaway Wasm call when its lease is released.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/bench/internal/lab"
	"github.com/rialto-project/rialto/bench/internal/stats"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

var (
	doShares       = flag.Bool("shares", true, "measure two tenants' weighted shares of one shared gateway, the cost of cancellation, and stopping a runaway")
	doBase         = flag.Bool("base", true, "measure the round trips, the MCT setups against ZeroMQ and the sweep (with -base=false the fragment holds only the shares sections: for trying them)")
	shareA         = flag.Float64("share-a", 0.25, "tenant A's share of a slot (rialto lease create --share; weight 1 of 1:3 with the default -share-b)")
	shareB         = flag.Float64("share-b", 0.75, "tenant B's share of a slot")
	shareSlots     = flag.Int("share-slots", 3, "slots of the agent lending the shared gateway (its gateway runs a worker per slot)")
	shareClients   = flag.Int("share-clients", 32, "concurrent clients per tenant, each with its own connection to its lease")
	shareGroup     = flag.Int("share-group", 16, "items per request of the tenants (CallBatch; a request is never split)")
	shareRole      = flag.String("share-role", "wasm", "the tenants' role: wasm (a CPU-bound WebAssembly kernel, -work-rounds per item) or mct (64-byte MCT queries)")
	workRounds     = flag.Int("work-rounds", 500, "rounds of the wasm role's kernel per item (-share-role wasm)")
	cancelDeadline = flag.Duration("cancel-deadline", 10*time.Millisecond, "deadline of tenant A's calls in the cancellation figure")
	runaways       = flag.Int("runaways", 5, "runaway Wasm calls stopped by releasing their lease (median of this many)")
)

// tenant is a shared lease and its clients' connections to its gateway.
type tenant struct {
	name  string // "A", "B"
	share float64
	lease api.Lease
	conns []*accel.Conn
}

func (t *tenant) close() {
	for _, c := range t.conns {
		_ = c.Close()
	}
}

// kernel is what the tenants' requests run: an entry and its items.
type kernel struct {
	entry string
	item  func() []byte
	desc  string // for the report
}

// tenantLoad is a tenant driven in a measurement; deadline > 0 gives each
// request that deadline.
type tenantLoad struct {
	t        *tenant
	deadline time.Duration
}

// tenantSample is what a tenant's clients got in one measurement.
type tenantSample struct {
	qps      float64 // queries answered per second
	p50, p99 time.Duration
	ok       int64 // requests answered
	expired  int64 // requests whose deadline ended them
	failed   int64 // other errors
	firstErr string
	secs     float64
}

// runTenants drives every load at once for d (after an unrecorded warm-up
// of d/10) and returns each tenant's sample.
func runTenants(ctx context.Context, k kernel, d time.Duration, group int, loads []tenantLoad) []tenantSample {
	type clientRes struct {
		lat             []time.Duration
		expired, failed int64
		firstErr        error
	}
	res := make([][]clientRes, len(loads))
	start := time.Now()
	warmEnd := start.Add(d / 10)
	end := warmEnd.Add(d)
	var wg sync.WaitGroup
	for i, l := range loads {
		res[i] = make([]clientRes, len(l.t.conns))
		for c, conn := range l.t.conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := &res[i][c]
				r.lat = make([]time.Duration, 0, 1024)
				qs := make([][]byte, group)
				for {
					t0 := time.Now()
					if t0.After(end) {
						return
					}
					for j := range qs {
						qs[j] = k.item()
					}
					cctx, cancel := ctx, context.CancelFunc(func() {})
					if l.deadline > 0 {
						cctx, cancel = context.WithTimeout(ctx, l.deadline)
					}
					outs, err := conn.CallBatch(cctx, k.entry, qs)
					cancel()
					if err == nil && len(outs) != group {
						err = fmt.Errorf("%d results for %d items", len(outs), group)
					}
					for j := 0; err == nil && j < len(outs); j++ {
						if len(outs[j]) != 4 {
							err = fmt.Errorf("a result of %d bytes", len(outs[j]))
						}
					}
					if !t0.After(warmEnd) {
						continue
					}
					switch {
					case err == nil:
						r.lat = append(r.lat, time.Since(t0))
					case errors.Is(err, context.DeadlineExceeded):
						r.expired++
					default:
						if r.failed == 0 {
							r.firstErr = err
						}
						r.failed++
					}
				}
			}()
		}
	}
	wg.Wait()
	out := make([]tenantSample, len(loads))
	for i := range loads {
		var all []time.Duration
		s := &out[i]
		for _, r := range res[i] {
			all = append(all, r.lat...)
			s.expired += r.expired
			s.failed += r.failed
			if r.firstErr != nil && s.firstErr == "" {
				s.firstErr = r.firstErr.Error()
			}
		}
		sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
		s.ok = int64(len(all))
		s.secs = d.Seconds()
		s.qps = float64(len(all)*group) / d.Seconds()
		if len(all) > 0 {
			s.p50 = all[len(all)/2]
			s.p99 = all[min(len(all)-1, len(all)*99/100)]
		}
	}
	return out
}

// leaseCounters are a lease's per-lease gateway series from the agent.
type leaseCounters struct {
	served, service, executions, cancelled, weight float64
}

func readLease(m metrics, id string) leaseCounters {
	return leaseCounters{
		served:     m.sum("rialto_gateway_lease_served_items_total", "lease", id),
		service:    m.sum("rialto_gateway_lease_service_items_total", "lease", id),
		executions: m.sum("rialto_gateway_lease_executions_total", "lease", id),
		cancelled:  m.sum("rialto_gateway_lease_cancelled_total", "lease", id),
		weight:     m.sum("rialto_gateway_lease_weight", "lease", id),
	}
}

func (a leaseCounters) minus(b leaseCounters) leaseCounters {
	return leaseCounters{a.served - b.served, a.service - b.service, a.executions - b.executions, a.cancelled - b.cancelled, a.weight}
}

// leaseCreateHas reports whether bin's `rialto lease create` has --flag.
func leaseCreateHas(bin, flag string) bool {
	out, _ := exec.Command(bin, "lease", "create", "--help").CombinedOutput()
	return strings.Contains(string(out), "--"+flag+" ")
}

// sharesSections runs the two-tenant figures on an agent of their own
// (slots lent by a second `rialto agent` of the same cluster) and writes
// their sections to w.
func sharesSections(ctx context.Context, e *env, cl *cluster, bin, rulesFile string, w func(string, ...any)) error {
	const node = "share"
	ag, err := cl.lab.StartAgent(ctx, lab.Agent{Name: node, Accel: *shareSlots, Args: []string{"--slot-memory", "1MiB"}})
	if err != nil {
		return err
	}
	var k kernel
	var roleArgs, shownRole []string
	switch *shareRole {
	case "mct":
		k = kernel{entry: "match", item: e.query, desc: fmt.Sprintf("the MCT role (the %d rules of the sections above; an item is one 64-byte query)", *nRules)}
		roleArgs = []string{"--role", "mct", "--role-config", rulesFile}
		shownRole = []string{"--role", "mct", "--role-config", filepath.Base(rulesFile)}
	case "wasm":
		mod := filepath.Join(cl.dir, "work.wasm")
		if err := os.WriteFile(mod, workModule(), 0o600); err != nil {
			return err
		}
		in := workInput(uint32(*workRounds))
		k = kernel{entry: "work", item: func() []byte { return in }, desc: fmt.Sprintf("a CPU-bound WebAssembly role "+
			"(work.wasm, %d bytes, hand-assembled in wasmtest.WorkModule: an item is a 4-byte count, here %d rounds of an "+
			"integer loop, and its 4-byte result), so that the slots, not the network or the clients, are the bottleneck",
			len(workModule()), *workRounds)}
		roleArgs = []string{"--role", "wasm", "--role-module", mod}
		shownRole = []string{"--role", "wasm", "--role-module", "work.wasm"}
	default:
		return fmt.Errorf("-share-role is wasm or mct, not %q", *shareRole)
	}
	murl, hc, err := cl.lab.AgentMetrics(ctx, node)
	if err != nil {
		return err
	}
	sc := scraper{url: murl, hc: hc}
	withShare := leaseCreateHas(bin, "share")
	mk := func(name string, share float64, extra ...string) (*tenant, error) {
		args := []string{"--kind", "accel", "--affinity", node, "--mode", "shared"}
		if withShare {
			args = append(args, "--share", fmt.Sprint(share))
		}
		l, err := cl.lab.CreateLease(ctx, append(args, extra...)...)
		if err != nil {
			return nil, err
		}
		return &tenant{name: name, share: share, lease: l}, nil
	}
	ta, err := mk("A", *shareA, roleArgs...)
	if err != nil {
		return err
	}
	tb, err := mk("B", *shareB, roleArgs...)
	if err != nil {
		return err
	}
	for _, t := range []*tenant{ta, tb} {
		u, err := parseAccelURI(t.lease.URI)
		if err != nil {
			return err
		}
		for range *shareClients {
			c, err := accel.Dial(ctx, u.addrs[0], u.cred)
			if err != nil {
				return err
			}
			t.conns = append(t.conns, c)
		}
		defer t.close()
	}
	m0, err := sc.scrape(ctx)
	if err != nil {
		return err
	}
	wA, wB := readLease(m0, ta.lease.ID).weight, readLease(m0, tb.lease.ID).weight
	idealA := wA / (wA + wB)
	log.Printf("shares: leases %s (share %v, weight %v) and %s (share %v, weight %v) at %s", ta.lease.ID, ta.share, wA, tb.lease.ID, tb.share, wB, murl)

	type run struct {
		together, cancel [2]tenantSample
		aloneA, aloneB   tenantSample
		agT, agC         [2]leaseCounters // agent's counters over the together and cancel measurements
		cpuT, cpuC, cpuB float64          // the agent's CPU (cores) together, with A's cancellations, B alone
		steal, load      float64
	}
	var rs []run
	G := *shareGroup
	// measureAgent runs the loads and returns, besides the clients'
	// samples, the agent's per-lease counters over the run and its CPU
	// time per second of it.
	measureAgent := func(loads []tenantLoad) ([]tenantSample, [2]leaseCounters, float64) {
		b0, err := sc.scrape(ctx)
		if err != nil {
			log.Fatal(err)
		}
		c0, t0 := stats.ProcCPU(ag.PID()), time.Now()
		s := runTenants(ctx, k, *dur, G, loads)
		cores := (stats.ProcCPU(ag.PID()) - c0) / time.Since(t0).Seconds()
		b1, err := sc.scrape(ctx)
		if err != nil {
			log.Fatal(err)
		}
		return s, [2]leaseCounters{readLease(b1, ta.lease.ID).minus(readLease(b0, ta.lease.ID)),
			readLease(b1, tb.lease.ID).minus(readLease(b0, tb.lease.ID))}, cores
	}
	for r := 0; r < *runs; r++ {
		log.Printf("shares run %d/%d", r+1, *runs)
		s0 := stats.SampleCPU()
		var x run
		// A B C D in turn, the order rotated per run.
		steps := []func(){
			func() {
				s, ag, cpu := measureAgent([]tenantLoad{{t: ta}, {t: tb}})
				x.together, x.agT, x.cpuT = [2]tenantSample{s[0], s[1]}, ag, cpu
			},
			func() { x.aloneA = runTenants(ctx, k, *dur, G, []tenantLoad{{t: ta}})[0] },
			func() {
				s, _, cpu := measureAgent([]tenantLoad{{t: tb}})
				x.aloneB, x.cpuB = s[0], cpu
			},
			func() {
				s, ag, cpu := measureAgent([]tenantLoad{{t: ta, deadline: *cancelDeadline}, {t: tb}})
				x.cancel, x.agC, x.cpuC = [2]tenantSample{s[0], s[1]}, ag, cpu
			},
		}
		for i := range steps {
			steps[(i+r)%len(steps)]()
		}
		x.steal = s0.StealSince()
		x.load = stats.Load()
		rs = append(rs, x)
		for _, t := range []struct {
			what string
			s    tenantSample
		}{{"A together", x.together[0]}, {"B together", x.together[1]}, {"A alone", x.aloneA}, {"B alone", x.aloneB},
			{"A cancelled", x.cancel[0]}, {"B beside A cancelled", x.cancel[1]}} {
			if t.s.failed > 0 {
				log.Printf("  %s: %d requests failed, the first with: %s", t.what, t.s.failed, t.s.firstErr)
			}
		}
		log.Printf("  together A %.0f B %.0f q/s; alone A %.0f B %.0f; A cancelled: B %.0f q/s, A %d ok %d expired; steal %.1f%%",
			x.together[0].qps, x.together[1].qps, x.aloneA.qps, x.aloneB.qps, x.cancel[1].qps, x.cancel[0].ok, x.cancel[0].expired, x.steal)
	}

	col := func(f func(run) float64) []float64 {
		var v []float64
		for _, x := range rs {
			v = append(v, f(x))
		}
		return v
	}
	med := func(f func(run) float64) float64 { return median(col(f)) }
	msd := func(f func(run) time.Duration) string {
		return fmt.Sprintf("%.1f", med(func(x run) float64 { return float64(f(x)) })/1e6)
	}
	steals, loads := col(func(x run) float64 { return x.steal }), col(func(x run) float64 { return x.load })
	shareOf := func(a, b float64) float64 {
		if a+b == 0 {
			return 0
		}
		return a / (a + b)
	}
	cliShareA := col(func(x run) float64 { return shareOf(x.together[0].qps, x.together[1].qps) })
	agShareA := col(func(x run) float64 { return shareOf(x.agT[0].served, x.agT[1].served) })

	w("### Two tenants on one shared gateway: weighted shares under saturation\n\n")
	how := "with `--share %v` and `--share %v`"
	if !withShare {
		how = "without `--share` (this binary's `rialto lease create` has no such flag: tenant A's %v and B's %v were not requested)"
	}
	w("A second `rialto agent` of the same cluster (node `%s`, `--accel %d`) lends the shared gateway: two shared leases of %s, "+
		"made with `rialto lease create --kind accel --mode shared %s` "+how+", "+
		"so one gateway (the agent's defaults: max batch 64, max delay 200µs, a worker per slot of the device) serves both. "+
		"The agent gave them the weights %g (A) and %g (B) (`rialto_gateway_lease_weight`): ideal shares %.0f%% and %.0f%%. "+
		"Each tenant is %d clients in the benchmark's process, each with its own connection to its lease's URI (the accel protocol "+
		"over loopback TCP, plaintext: the agent runs with `--insecure-dataplane`), each request %d items (`Conn.CallBatch`, one "+
		"group the gateway never splits), so that each tenant keeps %d items outstanding — several batches — and the gateway is saturated. "+
		"Each run measures, in an order rotated per run, both tenants together, A alone, B alone, and both together with A's calls "+
		"given a %v deadline (below); %v each after %v of warm-up; medians of %d runs. Steal time per run: %s%%; load average: %s. "+
		"The agent's figures are the deltas of its per-lease series (`rialto_gateway_lease_*` on its /metrics) over the same measurement.\n\n",
		node, *shareSlots, k.desc, strings.Join(shownRole, " "), ta.share, tb.share, wA, wB, 100*idealA, 100*(1-idealA), *shareClients, G, *shareClients*G,
		*cancelDeadline, *dur, *dur/10, *runs, fmtList(steals), fmtList(loads))
	w("| tenant | items/s alone | items/s together | ideal items/s together | p50 ms | p99 ms | share of served (clients) | share (agent's served items) | ideal share | average batch (agent) | errors |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, t := range []*tenant{ta, tb} {
		ideal := idealA
		alone := med(func(x run) float64 { return x.aloneA.qps })
		if i == 1 {
			ideal = 1 - idealA
			alone = med(func(x run) float64 { return x.aloneB.qps })
		}
		total := med(func(x run) float64 { return x.together[0].qps + x.together[1].qps })
		cs, as := median(cliShareA), median(agShareA)
		if i == 1 {
			cs, as = 1-cs, 1-as
		}
		var errs int64
		for _, x := range rs {
			errs += x.together[i].expired + x.together[i].failed
		}
		w("| %s (share %v, weight %g) | %.0f | %.0f | %.0f | %s | %s | %.1f%% | %.1f%% | %.0f%% | %.1f | %d |\n",
			t.name, t.share, []float64{wA, wB}[i], alone, med(func(x run) float64 { return x.together[i].qps }), ideal*total,
			msd(func(x run) time.Duration { return x.together[i].p50 }), msd(func(x run) time.Duration { return x.together[i].p99 }),
			100*cs, 100*as, 100*ideal,
			med(func(x run) float64 { return x.agT[i].service / max(1, x.agT[i].executions) }), errs)
	}
	dev := 100 * (median(cliShareA) - idealA)
	w("\nTenant A's share per run (clients): %s%%; (agent): %s%%. Total together: %.0f items/s (A alone: %.0f, B alone: %.0f). ",
		fmtList(scale(cliShareA, 100)), fmtList(scale(agShareA, 100)),
		med(func(x run) float64 { return x.together[0].qps + x.together[1].qps }),
		med(func(x run) float64 { return x.aloneA.qps }), med(func(x run) float64 { return x.aloneB.qps }))
	w("Measured share against the ideal: %+.1f points (A).\n\n", dev)
	w("| goal | measured | met |\n|---|---|---|\n")
	w("| each tenant's share of the served items within 5 points of its ideal share (weights %g:%g) | A %.1f%% vs %.0f%% | %s |\n\n",
		wA, wB, 100*median(cliShareA), 100*idealA, yes(dev <= 5 && dev >= -5))

	// The cost of cancellation.
	w("### The cost of cancellation\n\n")
	w("The same two tenants; in the third setup each of tenant A's requests has a %v deadline, so most of them end before they "+
		"are answered: the client abandons the call and sends the protocol's CANCEL, the gateway drops the request if it is still queued "+
		"or cancels its execution on the slot once every caller of the batch has gone, and the client sends its next request at once. "+
		"The figure is what this costs tenant B, against A's calls completing and against B alone (the runs of the section above). "+
		"\"Executed for A\" is the agent's `rialto_gateway_lease_service_items_total` (items run on a slot for A, cancelled "+
		"executions included); \"cancelled\" its `rialto_gateway_lease_cancelled_total` (requests); the agent's CPU is its "+
		"user+system time per second of the run (gateway, slots and all), and per item answered (to A and B) a figure that "+
		"depends less than throughput on what the machine's other tenants leave to the agent.\n\n", *cancelDeadline)
	w("| setup | B items/s | B p50 ms | B p99 ms | A items answered/s | A requests expired/s | executed for A (agent) items/s | A requests cancelled (agent)/s | agent CPU (cores) | agent CPU µs per item answered |\n|---|---|---|---|---|---|---|---|---|---|\n")
	secs := dur.Seconds()
	cpuPerItemT := func(x run) float64 { return 1e6 * x.cpuT / max(1, x.together[0].qps+x.together[1].qps) }
	cpuPerItemC := func(x run) float64 { return 1e6 * x.cpuC / max(1, x.cancel[0].qps+x.cancel[1].qps) }
	w("| A's calls complete | %.0f | %s | %s | %.0f | %.0f | %.0f | %.0f | %.2f | %.1f |\n",
		med(func(x run) float64 { return x.together[1].qps }),
		msd(func(x run) time.Duration { return x.together[1].p50 }), msd(func(x run) time.Duration { return x.together[1].p99 }),
		med(func(x run) float64 { return x.together[0].qps }), med(func(x run) float64 { return float64(x.together[0].expired) / secs }),
		med(func(x run) float64 { return x.agT[0].service / secs }), med(func(x run) float64 { return x.agT[0].cancelled / secs }),
		med(func(x run) float64 { return x.cpuT }), med(cpuPerItemT))
	w("| A's calls have a %v deadline | %.0f | %s | %s | %.0f | %.0f | %.0f | %.0f | %.2f | %.1f |\n", *cancelDeadline,
		med(func(x run) float64 { return x.cancel[1].qps }),
		msd(func(x run) time.Duration { return x.cancel[1].p50 }), msd(func(x run) time.Duration { return x.cancel[1].p99 }),
		med(func(x run) float64 { return x.cancel[0].qps }), med(func(x run) float64 { return float64(x.cancel[0].expired) / secs }),
		med(func(x run) float64 { return x.agC[0].service / secs }), med(func(x run) float64 { return x.agC[0].cancelled / secs }),
		med(func(x run) float64 { return x.cpuC }), med(cpuPerItemC))
	w("| B alone | %.0f | %s | %s | — | — | — | — | %.2f | %.1f |\n\n",
		med(func(x run) float64 { return x.aloneB.qps }),
		msd(func(x run) time.Duration { return x.aloneB.p50 }), msd(func(x run) time.Duration { return x.aloneB.p99 }),
		med(func(x run) float64 { return x.cpuB }), med(func(x run) float64 { return 1e6 * x.cpuB / max(1, x.aloneB.qps) }))
	ratio := col(func(x run) float64 { return x.cancel[1].qps / max(1, x.together[1].qps) })
	ratioAlone := col(func(x run) float64 { return x.cancel[1].qps / max(1, x.aloneB.qps) })
	cpuRatio := col(func(x run) float64 { return cpuPerItemC(x) / max(1e-9, cpuPerItemT(x)) })
	w("The agent's CPU time per item answered while A's calls are cancelled, against A's calls completing: %.2f× (per run %s). ",
		median(cpuRatio), fmtList2(cpuRatio))
	var cancelFailed int64
	firstErr := ""
	for _, x := range rs {
		cancelFailed += x.cancel[0].failed + x.cancel[1].failed + x.cancel[1].expired
		for _, e := range []string{x.cancel[0].firstErr, x.cancel[1].firstErr} {
			if firstErr == "" && e != "" {
				firstErr = fmt.Sprintf(" (the first: %q)", e)
			}
		}
	}
	w("B's throughput while A's calls are cancelled, against A's calls completing: %.2f× (per run %s); against B alone: %.2f× (per run %s). "+
		"Errors other than A's expired deadlines in these runs: %d%s.",
		median(ratio), fmtList2(ratio), median(ratioAlone), fmtList2(ratioAlone), cancelFailed, firstErr)
	if strings.Contains(firstErr, "queue is full") {
		w(" A's clients never have more than %d items outstanding, so the gateway still counted items of requests they had "+
			"abandoned against A's part of the queue (until those executions returned), and refused some of A's next requests (Busy).",
			*shareClients*G)
	}
	w("\n\n")

	// Stopping a runaway.
	return runawaySection(ctx, cl, sc, node, w)
}

// runawaySection measures, *runaways times, a shared Wasm lease whose call
// never returns (the module's `spin` entry loops forever) being released:
// the time from `rialto lease release` to the slot having stopped the
// call (its task counted as ended with an error on the agent's
// rialto_accel_slot_tasks_total), to the borrower's call ending, and for
// the release command to return.
func runawaySection(ctx context.Context, cl *cluster, sc scraper, node string, w func(string, ...any)) error {
	mod := filepath.Join(cl.dir, "echo.wasm")
	if err := os.WriteFile(mod, wasmtest.EchoModule(), 0o600); err != nil {
		return err
	}
	type stop struct {
		cli, borrower, slot time.Duration
		scrape              time.Duration // median time of one scrape while polling: the resolution
	}
	var ss []stop
	const settle = 200 * time.Millisecond
	slotErrors := func(m metrics) float64 { return m.sum("rialto_accel_slot_tasks_total", "outcome", "error") }
	for i := 0; i < *runaways; i++ {
		l, err := cl.lab.CreateLease(ctx, "--kind", "accel", "--affinity", node, "--mode", "shared", "--role", "wasm", "--role-module", mod)
		if err != nil {
			return err
		}
		u, err := parseAccelURI(l.URI)
		if err != nil {
			return err
		}
		c, err := accel.Dial(ctx, u.addrs[0], u.cred)
		if err != nil {
			return err
		}
		if out, err := c.Call(ctx, "upper", []byte("ok")); err != nil || string(out) != "OK" {
			return fmt.Errorf("wasm lease: upper: %q %v", out, err)
		}
		m0, err := sc.scrape(ctx)
		if err != nil {
			return err
		}
		e0 := slotErrors(m0)
		callDone := make(chan time.Time, 1)
		go func() {
			_, _ = c.Call(ctx, "spin", []byte("x"))
			callDone <- time.Now()
		}()
		// Let the call reach its slot (it never returns on its own).
		select {
		case <-callDone:
			return errors.New("the spinning call returned before its lease was released")
		case <-time.After(settle):
		}
		t0 := time.Now()
		relDone := make(chan error, 1)
		var relAt time.Time
		go func() {
			err := cl.lab.ReleaseLease(ctx, l.ID)
			relAt = time.Now()
			relDone <- err
		}()
		var freeAt time.Time
		var scrapes []float64
		deadline := t0.Add(30 * time.Second)
		for freeAt.IsZero() {
			s := time.Now()
			m, err := sc.scrape(ctx)
			if err != nil {
				return err
			}
			scrapes = append(scrapes, float64(time.Since(s)))
			if slotErrors(m) > e0 {
				freeAt = time.Now()
			} else if time.Now().After(deadline) {
				return fmt.Errorf("runaway %d: the slot did not stop the call within 30 s of the release", i+1)
			}
		}
		if err := <-relDone; err != nil {
			return err
		}
		var borrowerAt time.Time
		select {
		case borrowerAt = <-callDone:
		case <-time.After(30 * time.Second):
			return fmt.Errorf("runaway %d: the borrower's call did not end", i+1)
		}
		_ = c.Close()
		x := stop{cli: relAt.Sub(t0), borrower: borrowerAt.Sub(t0), slot: freeAt.Sub(t0), scrape: time.Duration(median(scrapes))}
		ss = append(ss, x)
		log.Printf("runaway %d: release returned %v, borrower's call ended %v, slot stopped it by %v (scrape %v)", i+1, x.cli, x.borrower, x.slot, x.scrape)
	}
	col := func(f func(stop) time.Duration) ([]float64, string) {
		var v []float64
		for _, s := range ss {
			v = append(v, float64(f(s))/1e6)
		}
		return v, fmt.Sprintf("%.1f", median(v))
	}
	cli, cliM := col(func(s stop) time.Duration { return s.cli })
	bor, borM := col(func(s stop) time.Duration { return s.borrower })
	slot, slotM := col(func(s stop) time.Duration { return s.slot })
	_, scM := col(func(s stop) time.Duration { return s.scrape })
	w("### Stopping a runaway: lease release to slot free\n\n")
	w("On the same agent (node `%s`), %d times: a shared lease of the `wasm` role (`rialto lease create --kind accel --mode shared "+
		"--role wasm --role-module echo.wasm`, the 219-byte module of wasmtest.EchoModule) whose borrower calls the entry `spin`, "+
		"which loops forever; %v after the call, `rialto lease release` ends the lease (the control plane tears it down on the agent: "+
		"the gateway revokes the lease's credential and cancels its execution, the slot interrupts the Wasm call). Times from the "+
		"start of `rialto lease release`: until the agent's `rialto_accel_slot_tasks_total{outcome=\"error\"}` counts the interrupted "+
		"task (the slot is free; polled by scraping the agent's /metrics, one scrape took %s ms, the resolution), until the borrower's "+
		"call ended, and until the release command returned. Medians of %d.\n\n", node, *runaways, settle, scM, len(ss))
	w("| | median ms | per run ms |\n|---|---|---|\n")
	w("| release → runaway stopped on its slot | %s | %s |\n", slotM, fmtList(slot))
	w("| release → the borrower's call ended | %s | %s |\n", borM, fmtList(bor))
	w("| `rialto lease release` returned | %s | %s |\n\n", cliM, fmtList(cli))
	return nil
}

func scale(xs []float64, k float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x * k
	}
	return out
}

func fmtList2(xs []float64) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(s, ", ")
}
