package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pgserver"
)

type failoverResult struct {
	takeover float64 // s from SIGKILL of the elected replica to another one leading
	stall    float64 // s from the SIGKILL to the next lease cycle completed by the clients
	maxGap   float64 // s, the longest time without a completed cycle during the run
	acked    int     // leases acknowledged active during the run
	lost     int     // of those, not found afterwards
	errors   int64
	cycles   int
}

// proc is a `rialto server` process.
type proc struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

// runFailover starts three `rialto server` replicas (bin) on a new
// database, runs lease cycles through clients that know all three, kills
// the elected replica with SIGKILL after before, and measures how long
// until another one leads and until the clients complete cycles again;
// then it checks that every lease acknowledged as active is still known.
func runFailover(ctx context.Context, bin, logDir string, pg *pgserver.Server, seq *int, workers int, before, after time.Duration) (failoverResult, error) {
	*seq++
	db := fmt.Sprintf("bench_failover_%d", *seq)
	if err := pg.CreateDatabase(ctx, db); err != nil {
		return failoverResult{}, err
	}
	agentURL, stopAgent, err := fakeAgent()
	if err != nil {
		return failoverResult{}, err
	}
	defer stopAgent()
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}()
	for i := range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return failoverResult{}, err
		}
		addr := ln.Addr().String()
		ln.Close()
		logf, err := os.Create(filepath.Join(logDir, fmt.Sprintf("failover-%d-replica%d.log", *seq, i+1)))
		if err != nil {
			return failoverResult{}, err
		}
		cmd := exec.Command(bin, "server", "--listen", addr, "--insecure-http", "--heartbeat", "500ms", "--suspect-after", "30s", "--down-after", "60s", "--log-level", "info")
		cmd.Env = append(os.Environ(), "RIALTO_DB="+pg.URL(db), "RIALTO_BOOTSTRAP_TOKEN="+bootTok, "RIALTO_TOKENS="+tenantTok+":bench")
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			return failoverResult{}, err
		}
		p := &proc{cmd: cmd, url: "http://" + addr, done: make(chan struct{})}
		go func() {
			cmd.Wait()
			logf.Close()
			close(p.done)
		}()
		procs = append(procs, p)
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	leaders := func(ps []*proc) []int {
		var out []int
		for i, p := range ps {
			resp, err := hc.Get(p.url + "/metrics")
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), "\nrialto_controlplane_leader 1") {
				out = append(out, i)
			}
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	var leader int
	for {
		if ls := leaders(procs); len(ls) == 1 {
			leader = ls[0]
			break
		}
		if time.Now().After(deadline) {
			return failoverResult{}, fmt.Errorf("no single leader among the replicas within 30s (see %s)", logDir)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var urls []string
	for _, p := range procs {
		urls = append(urls, p.url)
	}
	list := func(w int) string {
		out := make([]string, len(urls))
		for i := range urls {
			out[i] = urls[(w+i)%len(urls)]
		}
		return strings.Join(out, ",")
	}
	boot := api.NewClient(list(0), bootTok, hc)
	for i := 0; i < 8; i++ {
		if _, err := join(ctx, boot, fmt.Sprintf("lender%02d", i), agentURL, 4); err != nil {
			return failoverResult{}, err
		}
	}
	var mu sync.Mutex
	var done []time.Time // completions of cycles
	var acked []string
	var errs int64
	var wg sync.WaitGroup
	t0 := time.Now()
	end := t0.Add(before + after)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := api.NewClient(list(w), tenantTok, hc)
			for time.Now().Before(end) {
				l, err := c.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 30})
				if err != nil || l.State != api.LeaseActive {
					mu.Lock()
					errs++
					mu.Unlock()
					continue
				}
				mu.Lock()
				acked = append(acked, l.ID)
				mu.Unlock()
				if _, err := c.ReleaseLease(ctx, l.ID); err != nil {
					mu.Lock()
					errs++
					mu.Unlock()
					continue
				}
				mu.Lock()
				done = append(done, time.Now())
				mu.Unlock()
			}
		}()
	}
	time.Sleep(before)
	killed := time.Now()
	procs[leader].cmd.Process.Signal(syscall.SIGKILL)
	<-procs[leader].done
	rest := append(append([]*proc(nil), procs[:leader]...), procs[leader+1:]...)
	var takeover float64 = -1
	for time.Since(killed) < 30*time.Second {
		if ls := leaders(rest); len(ls) == 1 {
			takeover = time.Since(killed).Seconds()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	res := failoverResult{takeover: takeover, errors: errs, acked: len(acked), cycles: len(done)}
	sort.Slice(done, func(i, j int) bool { return done[i].Before(done[j]) })
	res.stall = -1
	prev := t0
	for _, d := range done {
		if g := d.Sub(prev).Seconds(); g > res.maxGap {
			res.maxGap = g
		}
		prev = d
		if res.stall < 0 && d.After(killed) {
			res.stall = d.Sub(killed).Seconds()
		}
	}
	// Every acknowledged lease is still known to the surviving replicas.
	c := api.NewClient(list(leader+1), tenantTok, hc)
	for _, id := range acked {
		if _, err := c.Lease(ctx, id); api.IsCode(err, api.CodeNotFound) {
			res.lost++
		} else if err != nil {
			return res, fmt.Errorf("read lease %s after the failover: %w", id, err)
		}
	}
	return res, nil
}
