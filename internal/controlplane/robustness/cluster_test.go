package robustness

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
	"github.com/rialto-project/rialto/internal/uptest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	bootTok = "rb-boot-token"
	quota   = 2        // leases each tenant may hold (3 clients each: refusals happen)
	devSize = 32 << 20 // two lenders of one device each: 4 leases of leaseSz in all
	leaseSz = 16 << 20
)

var tokens = map[string]string{"tenant-a": "rb-token-a", "tenant-b": "rb-token-b"}

func model() Model { return Model{Quota: map[string]int{"tenant-a": quota, "tenant-b": quota}} }

// buildRialto builds the rialto binary into a directory the test removes.
func buildRialto(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rialto")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/rialto")
	cmd.Dir = uptest.ModuleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// replica is a `rialto server` process that can be killed and restarted
// on the same address.
type replica struct {
	t    *testing.T
	bin  string
	addr string
	env  []string
	log  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (r *replica) url() string { return "http://" + r.addr }

func (r *replica) start() {
	r.t.Helper()
	f, err := os.OpenFile(r.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		r.t.Fatal(err)
	}
	args := []string{"server", "--listen", r.addr, "--insecure-http", "--heartbeat", "500ms", "--suspect-after", "60s", "--down-after", "120s",
		"--prepare-timeout", "1s", "--log-level", "info"}
	for tenant := range tokens {
		args = append(args, "--quota", fmt.Sprintf("%s:leases=%d", tenant, quota))
	}
	cmd := exec.Command(r.bin, args...)
	cmd.Env = r.env
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		r.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		f.Close()
		close(done)
	}()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()
}

// kill SIGKILLs the process and waits for it.
func (r *replica) kill() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// waitHealthy polls /healthz until it answers 200.
func waitHealthy(t *testing.T, url string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not healthy within %v: %v", url, within, err)
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startReplicas starts n `rialto server` processes on one new database.
func startReplicas(t *testing.T, n int) (dbURL string, rs []*replica) {
	bin := buildRialto(t)
	dbURL = pgtest.DB(t)
	var specs []string
	for tenant, tok := range tokens {
		specs = append(specs, tok+":"+tenant)
	}
	env := append(os.Environ(), "RIALTO_DB="+dbURL, "RIALTO_BOOTSTRAP_TOKEN="+bootTok, "RIALTO_TOKENS="+strings.Join(specs, ","))
	dir := t.TempDir()
	for i := range n {
		r := &replica{t: t, bin: bin, addr: freeAddr(t), env: env, log: filepath.Join(dir, fmt.Sprintf("replica%d.log", i+1))}
		r.start()
		t.Cleanup(r.kill)
		rs = append(rs, r)
	}
	for _, r := range rs {
		waitHealthy(t, r.url(), 30*time.Second)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, r := range rs {
				b, _ := os.ReadFile(r.log)
				t.Logf("%s:\n%s", r.log, tail(string(b), 40))
			}
		}
	})
	return dbURL, rs
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// lenders joins two nodes of one device each, served by a fake lender
// agent (it confirms every prepare), and heartbeats them until ctx ends.
func lenders(t *testing.T, ctx context.Context, addrs string) {
	t.Helper()
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/agent/v1/prepare":
			var req api.PrepareRequest
			json.NewDecoder(r.Body).Decode(&req)
			json.NewEncoder(w).Encode(api.PrepareResponse{URI: "nbd://127.0.0.1:10809/" + req.Export})
		default:
			w.Write([]byte("{}"))
		}
	}))
	t.Cleanup(agent.Close)
	boot := api.NewClient(addrs, bootTok, nil)
	var wg sync.WaitGroup
	for i := range 2 {
		name := fmt.Sprintf("lender%d", i)
		jr, err := boot.Join(ctx, api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: agent.URL,
			Fingerprint: api.Fingerprint{MachineID: "rb-" + name, Hostname: name, Cores: 2, MemoryBytes: 1 << 30},
			Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: devSize, Sharing: "partitionable"}}})
		if err != nil {
			t.Fatal(err)
		}
		c := boot.WithToken(jr.Credential)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(500 * time.Millisecond):
				}
				c.Heartbeat(ctx, jr.NodeID, api.Heartbeat{Health: "ok"})
			}
		}()
	}
	t.Cleanup(wg.Wait)
}

func addrList(rs []*replica) string {
	var out []string
	for _, r := range rs {
		out = append(out, r.url())
	}
	return strings.Join(out, ",")
}
