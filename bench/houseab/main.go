// Command houseab drives lease cycles against a running Rialto cluster
// through its HTTP API only, so that the same driver measures any two
// builds of `rialto server` and `rialto agent` unchanged (issue 16: the
// restructuring must leave the control plane's figures as they were).
//
// Each of -workers goroutines creates a block lease of -size
// (POST /v1/leases), checks that it is active, and releases it
// (POST /v1/leases/{id}/release), for -duration. It prints one line of
// JSON: cycles, cycles/s, create and release p50/p99 (ms), errors, and the
// server process's CPU seconds during the run when -server-pid is given.
//
//	(cd bench && RIALTO_ADMIN_TOKEN=... go run ./houseab -url http://127.0.0.1:7070 -workers 16 -duration 10s)
//
// With -free-port it only prints a free loopback TCP port, which
// compare.sh and pathsteps.sh give `rialto server --listen`. The tables of
// docs/bench/house.md come from the raw runs through ./summarize.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type lease struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

type node struct {
	Name  string `json:"name"`
	State string `json:"state"`
}

type client struct {
	base, token string
	hc          *http.Client
}

func (c *client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

func main() {
	var (
		url      = flag.String("url", "http://127.0.0.1:7070", "control plane URL")
		workers  = flag.Int("workers", 16, "concurrent borrowers")
		dur      = flag.Duration("duration", 10*time.Second, "length of the run")
		size     = flag.Int64("size", 4<<20, "block lease size in bytes")
		nodes    = flag.Int("nodes", 3, "wait until this many nodes are ready")
		wait     = flag.Duration("wait", 60*time.Second, "how long to wait for the nodes")
		serverPd = flag.Int("server-pid", 0, "report this process's CPU seconds during the run")
		freePort = flag.Bool("free-port", false, "print a free TCP port on 127.0.0.1 and exit (for the scripts' `rialto server --listen`)")
	)
	flag.Parse()
	if *freePort {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		return
	}
	tok := os.Getenv("RIALTO_ADMIN_TOKEN")
	if tok == "" {
		log.Fatal("RIALTO_ADMIN_TOKEN is not set")
	}
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	c := &client{base: strings.TrimRight(*url, "/"), token: tok, hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	ctx := context.Background()

	deadline := time.Now().Add(*wait)
	for {
		var ns []node
		err := c.do(ctx, http.MethodGet, "/v1/nodes", nil, &ns)
		ready := 0
		for _, n := range ns {
			if n.State == "ready" {
				ready++
			}
		}
		if err == nil && ready >= *nodes {
			break
		}
		if time.Now().After(deadline) {
			log.Fatalf("%d of %d nodes ready after %v (last error: %v)", ready, *nodes, *wait, err)
		}
		time.Sleep(100 * time.Millisecond) // polling a separate process with a deadline
	}

	var (
		mu            sync.Mutex
		creates, rels []float64
		errs          atomic.Int64
		cycles        atomic.Int64
		firstErr      atomic.Value
		wg            sync.WaitGroup
		req           = map[string]any{"kind": "block", "size": *size}
		cpu0          = procCPU(*serverPd)
		start         = time.Now()
		stop          = start.Add(*dur)
	)
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var cs, rs []float64
			for time.Now().Before(stop) {
				t0 := time.Now()
				var l lease
				if err := c.do(ctx, http.MethodPost, "/v1/leases", req, &l); err != nil || l.State != "active" {
					if err == nil {
						err = fmt.Errorf("lease %s is %q, not active", l.ID, l.State)
					}
					firstErr.CompareAndSwap(nil, err.Error())
					errs.Add(1)
					if l.ID == "" {
						continue
					}
				}
				t1 := time.Now()
				var r lease
				if err := c.do(ctx, http.MethodPost, "/v1/leases/"+l.ID+"/release", nil, &r); err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					errs.Add(1)
					continue
				}
				t2 := time.Now()
				cs = append(cs, t1.Sub(t0).Seconds())
				rs = append(rs, t2.Sub(t1).Seconds())
				cycles.Add(1)
			}
			mu.Lock()
			creates = append(creates, cs...)
			rels = append(rels, rs...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	wall := time.Since(start).Seconds()
	out := map[string]any{
		"workers":        *workers,
		"wall_s":         round(wall),
		"cycles":         cycles.Load(),
		"cycles_per_s":   round(float64(cycles.Load()) / wall),
		"create_p50_ms":  round(pct(creates, 0.50) * 1e3),
		"create_p99_ms":  round(pct(creates, 0.99) * 1e3),
		"release_p50_ms": round(pct(rels, 0.50) * 1e3),
		"release_p99_ms": round(pct(rels, 0.99) * 1e3),
		"errors":         errs.Load(),
	}
	if e, ok := firstErr.Load().(string); ok {
		out["first_error"] = e
	}
	if *serverPd > 0 {
		out["server_cpu_s"] = round(procCPU(*serverPd) - cpu0)
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}

func round(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	i := int(p * float64(len(v)))
	if i >= len(v) {
		i = len(v) - 1
	}
	return v[i]
}

// procCPU is utime+stime of process pid in seconds (/proc/PID/stat), 0 if
// pid is 0 or unreadable.
func procCPU(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// Fields after the command: state is f[0]; utime f[11], stime f[12].
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100 // USER_HZ
}
