// Command controlplane benchmarks the Rialto control plane over real
// loopback HTTP, side by side in one run: complete lease cycles (create →
// active → release) per second against SQLite, PostgreSQL with one
// replica and PostgreSQL with three replicas (interleaved runs); the
// failover time when the elected replica (a `rialto server` process) is
// SIGKILLed under load; and API latency while 10,000 simulated agents
// heartbeat at the interval the control plane spreads them to. It writes
// a Markdown fragment (docs/bench/controlplane.md).
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/api"
)

const (
	bootTok   = "bench-bootstrap"
	tenantTok = "bench-tenant"
)

// fakeAgent answers the agents' lease-execution API.
func fakeAgent() (string, func(), error) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /agent/v1/prepare", func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer rak_") {
			http.Error(w, "no agent key", http.StatusUnauthorized)
			return
		}
		var req api.PrepareRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		json.NewEncoder(w).Encode(api.PrepareResponse{URI: "nbd://127.0.0.1:10809/" + req.Export})
	})
	mux.HandleFunc("POST /agent/v1/teardown", func(w http.ResponseWriter, r *http.Request) {
		var req api.TeardownRequest
		json.NewDecoder(r.Body).Decode(&req)
		w.Write([]byte("{}"))
	})
	return serve(mux)
}

func serve(h http.Handler) (string, func(), error) { return serveTLS(h, nil) }

// serveTLS serves h on loopback, over HTTPS when cfg is set.
func serveTLS(h http.Handler, cfg *tls.Config) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	scheme := "http"
	if cfg != nil {
		scheme = "https"
	}
	return scheme + "://" + ln.Addr().String(), serveOn(ln, h, cfg), nil
}

// serveOn serves h on ln (over HTTPS when cfg is set) until the returned
// stop is called.
func serveOn(ln net.Listener, h http.Handler, cfg *tls.Config) func() {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, TLSConfig: cfg}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if cfg != nil {
			srv.ServeTLS(ln, "", "")
			return
		}
		srv.Serve(ln)
	}()
	return func() {
		srv.Close()
		<-done
	}
}

func join(ctx context.Context, c *api.Client, name, agentURL string, devices int) (api.JoinResponse, error) {
	req := api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: agentURL,
		Fingerprint: api.Fingerprint{MachineID: "bench-" + name, Hostname: name, Cores: 8, MemoryBytes: 64 << 30}}
	for i := 0; i < devices; i++ {
		req.Devices = append(req.Devices, api.DeviceSpec{Name: fmt.Sprintf("disk%d", i), Kind: api.KindBlock, Capacity: 1 << 40, Sharing: "partitionable"})
	}
	return c.Join(ctx, req)
}

// pgCPU is the CPU time (user + system, seconds) of the PostgreSQL
// server whose data directory is dataDir: its postmaster and every
// process it started, living now (a backend that exited is not counted).
func pgCPU(dataDir string) float64 {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	pm := strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
	ents, _ := os.ReadDir("/proc")
	tick := 100.0 // USER_HZ
	var total float64
	for _, e := range ents {
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15)
		s := string(st)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 13 || (e.Name() != pm && f[1] != pm) {
			continue
		}
		var ut, stt float64
		fmt.Sscan(f[11], &ut)
		fmt.Sscan(f[12], &stt)
		total += (ut + stt) / tick
	}
	return total
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// cpuPressure is the kernel's "some" CPU pressure over the last 60 s: the
// share of time runnable tasks waited for a CPU.
func cpuPressure() string {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return "?"
	}
	for _, f := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(f, "avg60="); ok {
			return v + "%"
		}
	}
	return "?"
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

type cycleResult struct {
	cpu        float64 // process CPU seconds during the run
	wall       float64
	cycles     int
	perSec     float64
	createP50  float64
	createP99  float64
	releaseP99 float64
	cycleP99   float64 // create + release
	errors     int64
	batch      float64 // mean lease writes per store transaction
	retries    float64 // placement retries (lost races for a device), all replicas
	pgCPU      float64 // CPU seconds of the PostgreSQL server during the run
}

// scrape reads every replica's metrics: the sum and count of the
// writes group-committed per store transaction (of a kind), and the
// placement retries (reservations that lost a race for a device).
func scrape(ctx context.Context, c *cluster, kind string) (sum, count, retries float64) {
	for _, u := range c.urls {
		req, err := http.NewRequestWithContext(ctx, "GET", u+"/metrics", nil)
		if err != nil {
			continue
		}
		resp, err := c.client.Do(req)
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			name, val, ok := strings.Cut(line, " ")
			if !ok {
				continue
			}
			var v float64
			fmt.Sscan(val, &v)
			switch {
			case strings.HasPrefix(name, "rialto_placement_retries_total"):
				retries += v
			case !strings.Contains(name, `kind="`+kind+`"`):
			case strings.HasPrefix(name, "rialto_store_batch_size_sum"):
				sum += v
			case strings.HasPrefix(name, "rialto_store_batch_size_count"):
				count += v
			}
		}
	}
	return sum, count, retries
}

func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

func median(xs []float64) float64 { return pct(xs, 50) }
