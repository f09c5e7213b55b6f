package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/rialto-project/rialto/bench/internal/stats"
	"github.com/rialto-project/rialto/internal/pgserver"
)

func main() {
	var (
		out       = flag.String("out", "", "write the Markdown fragment here (default: stdout only)")
		runs      = flag.Int("runs", 3, "interleaved runs of the lease-cycle measurement (each: SQLite, PostgreSQL 1 replica, PostgreSQL N replicas)")
		cycleDur  = flag.Duration("cycle-duration", 5*time.Second, "length of a lease-cycle run")
		workers   = flag.Int("workers", 64, "concurrent borrowers in the lease-cycle runs (64: where each configuration reached its highest throughput in the sweep of docs/bench/controlplane.md)")
		foWorkers = flag.Int("failover-workers", 16, "concurrent borrowers in the failover runs")
		replicas  = flag.Int("replicas", 3, "replicas of the multi-replica configuration")
		agents    = flag.Int("agents", 10000, "simulated agents in the heartbeat runs")
		hbDur     = flag.Duration("hb-duration", 20*time.Second, "length of a heartbeat run")
		foRuns    = flag.Int("failover-runs", 3, "failover measurements")
		dir       = flag.String("dir", "", "directory for the databases (default: a temp dir)")
		bin       = flag.String("rialto", "", "the rialto binary for the failover runs (default: built into -dir)")
		cpuprof   = flag.String("cpuprofile", "", "write a CPU profile here")
		skipHB    = flag.Bool("skip-heartbeats", false, "skip the heartbeat runs")
		skipFO    = flag.Bool("skip-failover", false, "skip the failover runs")
		hbProf    = flag.String("hb-cpuprofile", "", "write a CPU profile of each heartbeat run's heartbeat phase (after the joins) here, suffixed with the backend")
		hbCap     = flag.Float64("hb-cap", 0, "the control plane's --max-heartbeats-per-second in the heartbeat runs (0: its default)")
		hbTLS     = flag.Bool("hb-tls", true, "serve the control plane over HTTPS in the heartbeat runs")
		hbBackend = flag.String("hb-backends", "sqlite,pg", "backends of the heartbeat runs: sqlite, pg (N replicas)")
		pgSet     = flag.String("pg-settings", "", "extra postgresql.conf settings of the throwaway server, NAME=VALUE,... (default: PostgreSQL's, durable)")
	)
	flag.Parse()
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			log.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	base := *dir
	if base == "" {
		d, err := os.MkdirTemp("", "rialto-bench-cp-")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(d)
		base = d
	}
	ctx := context.Background()
	settings := map[string]string{}
	for _, kv := range strings.Split(*pgSet, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			settings[k] = v
		}
	}
	pg, err := pgserver.Start(ctx, filepath.Join(base, "pg"), pgserver.Options{Settings: settings})
	if err != nil {
		log.Fatalf("PostgreSQL for the replicated configurations: %v", err)
	}
	defer func() {
		pg.Close()
		pg.Remove()
	}()
	seq := 0
	backends := []backend{
		{name: "SQLite", sqlite: base, seq: &seq},
		{name: "PostgreSQL, 1 replica", pg: pg, replicas: 1, seq: &seq},
		{name: fmt.Sprintf("PostgreSQL, %d replicas", *replicas), pg: pg, replicas: *replicas, seq: &seq},
	}
	steal0 := stats.SampleCPU()
	load0 := loadAvg()
	cyc := make([][]cycleResult, len(backends))
	for i := 0; i < *runs; i++ {
		for bi, b := range backends {
			c, err := runCycles(ctx, b, *workers, *cycleDur)
			if err != nil {
				log.Fatalf("%s: %v", b.name, err)
			}
			log.Printf("run %d, %s: %.0f lease cycles/s (create p99 %.2f ms, cycle p99 %.2f ms), %.1f writes per transaction, %.0f placement retries, %d errors",
				i+1, b.name, c.perSec, c.createP99*1e3, c.cycleP99*1e3, c.batch, c.retries, c.errors)
			cyc[bi] = append(cyc[bi], c)
		}
	}
	var fo []failoverResult
	if !*skipFO {
		exe := *bin
		if exe == "" {
			exe = filepath.Join(base, "rialto")
			cmd := exec.Command("go", "build", "-o", exe, "./cmd/rialto")
			if out, err := cmd.CombinedOutput(); err != nil {
				log.Fatalf("go build: %v\n%s", err, out)
			}
		}
		for i := 0; i < *foRuns; i++ {
			r, err := runFailover(ctx, exe, base, pg, &seq, *foWorkers, 3*time.Second, 5*time.Second)
			if err != nil {
				log.Fatalf("failover: %v", err)
			}
			log.Printf("failover %d: another replica leads %.2f s after the SIGKILL; clients complete a cycle %.2f s after it; longest gap %.2f s; %d of %d acknowledged leases lost; %d client errors",
				i+1, r.takeover, r.stall, r.maxGap, r.lost, r.acked, r.errors)
			fo = append(fo, r)
		}
	}
	type hbRun struct {
		name string
		r    hbResult
	}
	var hbs []hbRun
	if !*skipHB {
		for _, which := range strings.Split(*hbBackend, ",") {
			b := backends[0]
			if which == "pg" {
				b = backends[2]
			}
			var prof io.Writer
			if *hbProf != "" {
				f, err := os.Create(*hbProf + "." + which)
				if err != nil {
					log.Fatal(err)
				}
				defer f.Close()
				prof = f
			}
			h, err := runHeartbeats(ctx, b, *agents, *hbDur, *hbCap, *hbTLS, prof)
			if err != nil {
				log.Fatalf("heartbeats, %s: %v", b.name, err)
			}
			log.Printf("%s: %d agents told %.1f s, %.0f heartbeats/s, p99 heartbeat %.2f ms, p99 API %.2f ms, %d lease cycles meanwhile, %d errors, %d behind, %d not ready",
				b.name, *agents, h.interval, h.hbPerSec, h.hbP99*1e3, h.apiP99*1e3, h.cycles, h.errors, h.missed, h.downs)
			hbs = append(hbs, hbRun{b.name, h})
		}
	}
	steal := steal0.StealSince()
	var b strings.Builder
	fmt.Fprintf(&b, "## Control plane\n\n")
	fmt.Fprintf(&b, "Measured %s on %d vCPU (GOMAXPROCS %d), %s, PostgreSQL from %s. CPU steal during the runs: %.1f%%;\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), pgVersion(), steal)
	fmt.Fprintf(&b, "load average (1, 5, 15 min) before → after: %s → %s; CPU pressure (some, avg60) at the end: %s.\n\n", load0, loadAvg(), cpuPressure())
	fmt.Fprintf(&b, "Lease cycles run the control plane (`rialto server`'s code) in this process over real loopback HTTP, with a\n")
	fmt.Fprintf(&b, "fake lender agent answering `/agent/v1/prepare` and `/agent/v1/teardown`, and %d borrowers doing\n", *workers)
	fmt.Fprintf(&b, "create → active → release. SQLite is a file in a temp dir (WAL, `synchronous=NORMAL`); PostgreSQL is a\n")
	fmt.Fprintf(&b, "throwaway server on loopback (PostgreSQL's defaults: `fsync` and `synchronous_commit` on); with %d\n", *replicas)
	fmt.Fprintf(&b, "replicas each has its own connection pool and the borrowers are spread over them (each knows all of\n")
	fmt.Fprintf(&b, "them, first its own); the elected replica places every lease and the others forward creations and\n")
	fmt.Fprintf(&b, "releases to it over loopback HTTP, until the borrowers' clients, told the leader's address in its answers,\n")
	fmt.Fprintf(&b, "send those calls to it directly (docs/operations.md, \"The placement leader\"). Runs are interleaved (SQLite, 1 replica, %d replicas, SQLite, ...); medians of %d,\n", *replicas, *runs)
	fmt.Fprintf(&b, "per-run values in brackets. Everything shares the same 2 vCPUs: the server(s), PostgreSQL, the clients.\n")
	fmt.Fprintf(&b, "The default of 64 borrowers is the concurrency at which each configuration reached its highest throughput\n")
	fmt.Fprintf(&b, "in a sweep of 16 to 128 (the follow-up \"the borrowers' concurrency\" below, which has the whole table).\n\n")
	fmt.Fprintf(&b, "| lease cycles, %v runs | ", *cycleDur)
	for _, be := range backends {
		fmt.Fprintf(&b, "%s | ", be.name)
	}
	fmt.Fprintf(&b, "\n|---|---|---|---|\n")
	row := func(name string, f func(c cycleResult) float64, scale float64, prec int) {
		fmt.Fprintf(&b, "| %s | ", name)
		for bi := range backends {
			var vs []float64
			for _, c := range cyc[bi] {
				vs = append(vs, f(c))
			}
			fmt.Fprintf(&b, "%.*f [%s] | ", prec, median(vs)*scale, fmtRuns(vs, scale, prec))
		}
		fmt.Fprintln(&b)
	}
	row("cycles/s", func(c cycleResult) float64 { return c.perSec }, 1, 0)
	row("create p99 (ms)", func(c cycleResult) float64 { return c.createP99 }, 1e3, 2)
	row("release p99 (ms)", func(c cycleResult) float64 { return c.releaseP99 }, 1e3, 2)
	row("cycle p99, create + release (ms)", func(c cycleResult) float64 { return c.cycleP99 }, 1e3, 2)
	row("lease writes per transaction (mean)", func(c cycleResult) float64 { return c.batch }, 1, 1)
	row("placement retries per cycle (lost races for a device)", func(c cycleResult) float64 { return c.retries / float64(max(c.cycles, 1)) }, 1, 2)
	row("CPU cores the process got (server, clients, fake lender)", func(c cycleResult) float64 { return c.cpu / c.wall }, 1, 2)
	row("CPU cores PostgreSQL got", func(c cycleResult) float64 { return c.pgCPU / c.wall }, 1, 2)
	row("CPU milliseconds per cycle, process + PostgreSQL", func(c cycleResult) float64 { return (c.cpu + c.pgCPU) / float64(max(c.cycles, 1)) }, 1e3, 2)
	row("errors", func(c cycleResult) float64 { return float64(c.errors) }, 1, 0)
	med := func(bi int) float64 {
		var vs []float64
		for _, c := range cyc[bi] {
			vs = append(vs, c.perSec)
		}
		return median(vs)
	}
	lite, multi := med(0), med(2)
	fmt.Fprintf(&b, "\nGoal for %d replicas: ≥ 1,000 cycles/s and ≥ half of SQLite's figure of the same run (%.0f): %.0f cycles/s, %.0f%% of SQLite — %s.\n\n",
		*replicas, lite/2, multi, 100*multi/lite, verdict(multi >= 1000 && multi >= lite/2))
	if len(fo) > 0 {
		var tk, st, gap []float64
		lost, acked := 0, 0
		var errs int64
		for _, r := range fo {
			tk, st, gap = append(tk, r.takeover), append(st, r.stall), append(gap, r.maxGap)
			lost += r.lost
			acked += r.acked
			errs += r.errors
		}
		fmt.Fprintf(&b, "**Failover.** Three `rialto server` processes share a database; %d borrowers run lease cycles through\n", *foWorkers)
		fmt.Fprintf(&b, "clients that know all three; after 3 s the elected replica (the one running the background duties, read\n")
		fmt.Fprintf(&b, "from `rialto_controlplane_leader`) is killed with SIGKILL, and the run goes on for 5 s. %d runs.\n\n", len(fo))
		fmt.Fprintf(&b, "| failover | median | runs | goal | verdict |\n|---|---|---|---|---|\n")
		fmt.Fprintf(&b, "| another replica elected, after the SIGKILL (s) | %.2f | [%s] | ≤ 5 | %s |\n", median(tk), fmtRuns(tk, 1, 2), verdict(median(tk) >= 0 && median(tk) <= 5))
		fmt.Fprintf(&b, "| clients complete a lease cycle again, after the SIGKILL (s) | %.2f | [%s] | | |\n", median(st), fmtRuns(st, 1, 2))
		fmt.Fprintf(&b, "| longest time without a completed cycle (s) | %.2f | [%s] | | |\n", median(gap), fmtRuns(gap, 1, 2))
		fmt.Fprintf(&b, "| acknowledged leases lost (all runs) | %d of %d | | 0 | %s |\n", lost, acked, verdict(lost == 0))
		fmt.Fprintf(&b, "| client errors (all runs; a create cut off with its replica and not retried by the caller) | %d | | | |\n\n", errs)
	}
	for _, h := range hbs {
		r := h.r
		fmt.Fprintf(&b, "**%d agents, %s.** Lightweight simulated agents (real HTTP, one goroutine each) join, then heartbeat at\n", *agents, h.name)
		capText := "the control plane's default cap"
		if *hbCap != 0 {
			capText = fmt.Sprintf("`--max-heartbeats-per-second %g`", *hbCap)
		}
		fmt.Fprintf(&b, "the interval the control plane tells them (heartbeat spreading under %s: docs/operations.md),\n", capText)
		fmt.Fprintf(&b, "spread over it (with replicas: the interval they all tell once each counts every node), for %v; meanwhile a tenant runs lease cycles (2 loops), lists live leases and reads a\n", *hbDur)
		transport := "plain HTTP on loopback (-hb-tls=false)"
		if *hbTLS {
			transport = "HTTPS on loopback (a P-256 server certificate, TLS 1.3, no client certificates)"
		}
		fmt.Fprintf(&b, "node (20 ms apart). The agents share one keep-alive client (%d connections to each server, opened before\n", maxConns)
		fmt.Fprintf(&b, "the measurement) over %s;\n", transport)
		fmt.Fprintf(&b, "`rialto server` serves HTTPS and holds agents to mutual TLS by default: each agent then keeps its own\n")
		fmt.Fprintf(&b, "connection, whose one handshake is not measured here. The heartbeats of this window are the agents' first since\n")
		fmt.Fprintf(&b, "joining, so each answer carries the node's peer list. \"API p99\" covers every heartbeat and every tenant call.\n\n")
		fmt.Fprintf(&b, "| measurement | value | goal | verdict |\n|---|---|---|---|\n")
		fmt.Fprintf(&b, "| interval told to each agent (s) | %.1f | | |\n", r.interval)
		offered := float64(*agents) / r.interval
		fmt.Fprintf(&b, "| heartbeats served/s | %.0f | ≤ %.0f offered (%d agents / %.0f s) | %s |\n", r.hbPerSec, offered, *agents, r.interval, verdict(r.hbPerSec <= offered*1.05))
		fmt.Fprintf(&b, "| heartbeat p50 / p99 (ms) | %.2f / %.2f | | |\n", r.hbP50*1e3, r.hbP99*1e3)
		fmt.Fprintf(&b, "| tenant calls alone p50 / p99 (ms) | %.2f / %.2f | | |\n", r.tenP50*1e3, r.tenP99*1e3)
		fmt.Fprintf(&b, "| API p99, all calls (ms) | %.2f | < 50 | %s |\n", r.apiP99*1e3, verdict(r.apiP99 < 0.050))
		fmt.Fprintf(&b, "| API p99, the %d calls started %v or more after the joins (ms) | %.2f | < 50 | %s |\n", r.lateN, settle, r.lateP99*1e3, verdict(r.lateP99 < 0.050))
		fmt.Fprintf(&b, "| tenant lease cycles meanwhile | %d | | |\n", r.cycles)
		fmt.Fprintf(&b, "| CPU cores the process got | %.2f | | |\n", r.cpu/r.wall)
		fmt.Fprintf(&b, "| CPU of the process per heartbeat: server(s), agents and the tenant's calls (ms) | %.3f | | |\n", r.cpu/float64(r.beats)*1e3)
		fmt.Fprintf(&b, "| errors / beats behind their period / nodes not ready at the end | %d / %d / %d | 0 / 0 / 0 | %s |\n\n",
			r.errors, r.missed, r.downs, verdict(r.errors == 0 && r.missed == 0 && r.downs == 0))
	}
	fmt.Fprintf(&b, "**No peer.** There is no comparable open-source lease-based device-lending control plane to run side by\n")
	fmt.Fprintf(&b, "side here; SQLite (the embedded default) is the reference the replicated configurations are measured against.\n\n")
	capFlag := ""
	if *hbCap != 0 {
		capFlag = fmt.Sprintf(" -hb-cap %g", *hbCap)
	}
	fmt.Fprintf(&b, "Command: `bench/controlplane/run.sh` (= the program in bench/controlplane, built in the bench module, run from the repository's root with `-rialto RIALTO -runs %d -cycle-duration %v -workers %d -replicas %d -agents %d -hb-duration %v -failover-runs %d -failover-workers %d%s -out docs/bench/controlplane.md`, RIALTO built from ./cmd/rialto).\n",
		*runs, *cycleDur, *workers, *replicas, *agents, *hbDur, *foRuns, *foWorkers, capFlag)
	md := b.String()
	fmt.Print(md)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func fmtRuns(vs []float64, scale float64, prec int) string {
	var ss []string
	for _, v := range vs {
		ss = append(ss, fmt.Sprintf("%.*f", prec, v*scale))
	}
	return strings.Join(ss, ", ")
}

func pgVersion() string {
	bin, err := pgserver.FindBin()
	if err != nil {
		return "?"
	}
	out, err := exec.Command(filepath.Join(bin, "postgres"), "--version").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}
