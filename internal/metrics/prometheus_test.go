package metrics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/uptest"
)

func TestMain(m *testing.M) { uptest.Main(m) }

// dashboardQuery is one query of a panel of the Grafana dashboard.
type dashboardQuery struct{ panel, expr string }

// loadDashboard reads docs/grafana/rialto.json, checks what Grafana needs
// of it (unique panel IDs, positions, the datasource variable, a refId per
// query) and that every query is plain PromQL (no Grafana variable), and
// returns its queries.
func loadDashboard(t *testing.T) []dashboardQuery {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(uptest.ModuleRoot(t), "docs", "grafana", "rialto.json"))
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr, RefID string
		Datasource  struct{ Type, UID string }
	}
	type panel struct {
		ID         int
		Type       string
		Title      string
		GridPos    *struct{ H, W, X, Y int }
		Datasource *struct{ Type, UID string }
		Targets    []target
		Panels     []json.RawMessage
	}
	var d struct {
		UID, Title string
		Templating struct {
			List []struct{ Name, Type, Query string }
		}
		Panels []panel
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard without uid or title")
	}
	if len(d.Templating.List) != 1 || d.Templating.List[0].Type != "datasource" || d.Templating.List[0].Query != "prometheus" {
		t.Errorf("dashboard variables %+v, want one Prometheus datasource variable", d.Templating.List)
	}
	ds := "${" + d.Templating.List[0].Name + "}"
	ids := map[int]bool{}
	var out []dashboardQuery
	for _, p := range d.Panels {
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("panel %q: id %d missing or repeated", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: bad gridPos %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			if len(p.Panels) != 0 {
				t.Errorf("row %q: collapsed rows hide their panels from this test", p.Title)
			}
			continue
		}
		if p.Title == "" || p.Datasource == nil || p.Datasource.UID != ds || len(p.Targets) == 0 {
			t.Errorf("panel %d %q: needs a title, the datasource %s and queries", p.ID, p.Title, ds)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] || tg.Datasource.UID != ds {
				t.Errorf("panel %q: query %+v needs an expr, a unique refId and the datasource %s", p.Title, tg, ds)
			}
			refs[tg.RefID] = true
			if strings.Contains(tg.Expr, "$") {
				t.Errorf("panel %q: %s is not plain PromQL (a Grafana variable)", p.Title, tg.Expr)
			}
			out = append(out, dashboardQuery{p.Title, tg.Expr})
		}
	}
	if len(out) == 0 {
		t.Fatal("dashboard has no queries")
	}
	return out
}

// TestPrometheusScrapesUp runs Debian's Prometheus against a real `rialto
// up` with the configuration rialto up writes: every target found through
// GET /v1/metrics-targets (the control plane and each agent, over HTTPS
// verified against the cluster CA) is scraped healthy, every /metrics body
// passes `promtool check metrics`, and, once leases have moved the
// counters, every query of the Grafana dashboard evaluates to a non-empty
// result through Prometheus's HTTP API.
func TestPrometheusScrapesUp(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (Debian package prometheus; .ci/run installs it)")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian package prometheus; .ci/run installs it)")
	}
	queries := loadDashboard(t)
	ctx := context.Background()
	dir := t.TempDir()
	u := uptest.StartUp(t, uptest.Binary(t), filepath.Join(dir, "state"))
	c := u.Client(t)
	nodes, err := c.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Prometheus gets a token of its own, readable by its owner only,
	// that is not an admin's.
	tokFile := filepath.Join(dir, "state", "prometheus.token")
	if st, err := os.Stat(tokFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("prometheus.token: %v %v", st, err)
	}
	tok, err := os.ReadFile(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	who, err := api.NewClient(u.Addr, strings.TrimSpace(string(tok)), u.HTTPClient(t)).Whoami(ctx)
	if err != nil || who.Tenant != "prometheus" || who.Admin {
		t.Fatalf("prometheus.token is %+v (%v), want the non-admin tenant prometheus", who, err)
	}

	// The configuration rialto up wrote, scraping every second.
	cfg, err := os.ReadFile(filepath.Join(dir, "state", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	fast := strings.NewReplacer("scrape_interval: 15s", "scrape_interval: 1s", "refresh_interval: 30s", "refresh_interval: 1s").Replace(string(cfg))
	if strings.Count(fast, ": 1s") != 2 {
		t.Fatalf("rialto up's prometheus.yml has no scrape and refresh intervals to shorten:\n%s", cfg)
	}
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(fast), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", cfgFile).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	prom := startPrometheus(t, promBin, cfgFile, filepath.Join(dir, "tsdb"))

	// Every target healthy: the control plane and each node's agent.
	var targets []promTarget
	poll(t, 60*time.Second, func() error {
		var err error
		if targets, err = prom.targets(); err != nil {
			return err
		}
		if len(targets) != len(nodes)+1 {
			return fmt.Errorf("%d targets, want %d (the control plane and %d agents): %+v", len(targets), len(nodes)+1, len(nodes), targets)
		}
		for _, tg := range targets {
			if tg.Health != "up" {
				return fmt.Errorf("target %s is %s: %s", tg.ScrapeURL, tg.Health, tg.LastError)
			}
		}
		return nil
	}, prom.log)
	byNode := map[string]bool{}
	// The targets are the control plane and the agents (node
	// certificates): trust what the cluster CA issued.
	hc := u.ClusterHTTPClient(t)
	for _, tg := range targets {
		if !strings.HasPrefix(tg.ScrapeURL, "https://") {
			t.Errorf("target %s is not scraped over HTTPS", tg.ScrapeURL)
		}
		body := get(t, hc, tg.ScrapeURL)
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) != 0 {
			t.Errorf("promtool check metrics %s: %v\n%s", tg.ScrapeURL, err, out)
		}
		switch tg.Labels["component"] {
		case "controlplane":
			for _, m := range []string{"rialto_api_requests_total", "rialto_leases", "go_goroutines", "process_resident_memory_bytes"} {
				if !strings.Contains(body, "\n# TYPE "+m+" ") {
					t.Errorf("the control plane's /metrics lacks %s", m)
				}
			}
		case "agent":
			byNode[tg.Labels["node"]] = true
			for _, m := range []string{"rialto_agent_heartbeats_total", "rialto_agent_device_written_bytes_total", "rialto_accel_slot_tasks_total"} {
				if !strings.Contains(body, "\n# TYPE "+m+" ") {
					t.Errorf("agent %s's /metrics lacks %s", tg.Labels["node"], m)
				}
			}
			// The agents of rialto up share the control plane's process.
			if strings.Contains(body, "go_goroutines") {
				t.Errorf("agent %s reports the runtime that the control plane reports", tg.Labels["node"])
			}
		default:
			t.Errorf("target %s: component %q", tg.ScrapeURL, tg.Labels["component"])
		}
	}
	for _, n := range nodes {
		if !byNode[n.Name] {
			t.Errorf("node %s has no target", n.Name)
		}
	}

	// Move the counters: a block lease written and read through NBD, moved
	// to another lender, then released (and so wiped); a shared
	// accelerator lease run once.
	bl, err := c.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nbd.DialURI(ctx, bl.URI, nbd.WithTLS(u.DataTLS(t)))
	if err != nil {
		t.Fatal(err)
	}
	buf := bytes.Repeat([]byte("rialto"), 1<<20/6+1)[:1<<20]
	if _, err := nc.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	// Moved to another lender (the Moves row), then released.
	if _, err := c.MoveLease(ctx, bl.ID, api.MoveRequest{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 60*time.Second, func() error {
		ms, err := c.Moves(ctx, bl.ID)
		if err != nil {
			return err
		}
		if len(ms) != 1 || ms[0].State != api.MoveDone {
			return fmt.Errorf("moves %+v", ms)
		}
		return nil
	}, prom.log)
	if _, err := c.ReleaseLease(ctx, bl.ID); err != nil {
		t.Fatal(err)
	}
	al, err := c.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	// The gateway's series are scraped at zero before the call, so that
	// the call shows as a rate.
	poll(t, 30*time.Second, func() error { return prom.nonEmpty("rialto_gateway_inferences_total") }, prom.log)
	run := exec.Command(uptest.Binary(t), "accel", "run", al.ID, "sha256", "--data", "hello", "--hex")
	run.Env = u.Env()
	if out, err := run.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824") {
		t.Fatalf("accel run: %v\n%s", err, out)
	}

	// What moved shows in Prometheus, then every dashboard query has a
	// result.
	for _, q := range []string{
		`sum(rialto_agent_device_written_bytes_total) >= 1048576`,
		`sum(rialto_agent_device_read_bytes_total) >= 1048576`,
		`sum(rialto_lease_transitions_total{state="released"}) >= 1`,
		`sum(rialto_agent_wipes_total{result="ok"}) >= 1`,
		`sum(rialto_agent_prepares_total{result="ok"}) >= 2`,
		`sum(rialto_gateway_inferences_total) >= 1`,
		`sum(rialto_accel_slot_tasks_total{outcome="ok"}) >= 1`,
		`sum(rialto_lender_call_duration_seconds_count{op="prepare"}) >= 2`,
		`sum(rialto_moves_total{result="done"}) >= 1`,
		`sum(rialto_agent_transfers_total{role="out",event="committed"}) >= 1`,
		`sum(rialto_agent_move_hold_seconds_count) >= 1`,
	} {
		poll(t, 30*time.Second, func() error { return prom.nonEmpty(q) }, prom.log)
	}
	poll(t, 60*time.Second, func() error {
		var empty []string
		for _, q := range queries {
			if err := prom.nonEmpty(q.expr); err != nil {
				empty = append(empty, fmt.Sprintf("%q: %v", q.panel, err))
			}
		}
		if len(empty) > 0 {
			return fmt.Errorf("%d of %d dashboard queries:\n%s", len(empty), len(queries), strings.Join(empty, "\n"))
		}
		return nil
	}, prom.log)
	t.Logf("%d targets healthy, %d dashboard queries answered", len(targets), len(queries))
}

// prometheus is a running Prometheus server.
type prometheus struct {
	base string
	out  *logtest.Buffer
}

func (p *prometheus) log() string { return "prometheus:\n" + p.out.String() }

// startPrometheus starts Prometheus on a free loopback port with its
// storage in tsdb, and stops it when the test ends.
func startPrometheus(t *testing.T, bin, cfgFile, tsdb string) *prometheus {
	t.Helper()
	var last string
	for range 3 { // a port found free may be taken before Prometheus binds it
		port := freePort(t)
		out := &logtest.Buffer{}
		cmd := exec.Command(bin, "--config.file="+cfgFile, "--storage.tsdb.path="+tsdb,
			"--web.listen-address=127.0.0.1:"+strconv.Itoa(port), "--log.level=warn")
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		p := &prometheus{base: "http://127.0.0.1:" + strconv.Itoa(port), out: out}
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case err := <-done:
				last = fmt.Sprintf("prometheus exited: %v\n%s", err, out)
				deadline = time.Time{}
				continue
			case <-time.After(100 * time.Millisecond):
			}
			resp, err := http.Get(p.base + "/-/ready")
			if err != nil {
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Cleanup(func() {
					cmd.Process.Signal(syscall.SIGTERM)
					select {
					case <-done:
					case <-time.After(20 * time.Second):
						cmd.Process.Kill()
						<-done
						t.Errorf("prometheus did not stop on SIGTERM")
					}
				})
				return p
			}
		}
		if deadline.IsZero() {
			continue
		}
		cmd.Process.Kill()
		<-done
		t.Fatalf("prometheus not ready within 30s:\n%s", out)
	}
	t.Fatalf("prometheus did not start: %s", last)
	return nil
}

type promTarget struct {
	ScrapeURL string            `json:"scrapeUrl"`
	Health    string            `json:"health"`
	LastError string            `json:"lastError"`
	Labels    map[string]string `json:"labels"`
}

func (p *prometheus) api(path string, q url.Values, out any) error {
	resp, err := http.Get(p.base + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", path, env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

func (p *prometheus) targets() ([]promTarget, error) {
	var d struct {
		ActiveTargets []promTarget `json:"activeTargets"`
	}
	err := p.api("/api/v1/targets", url.Values{"state": {"active"}}, &d)
	return d.ActiveTargets, err
}

// nonEmpty evaluates query now and fails unless it has a result.
func (p *prometheus) nonEmpty(query string) error {
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.api("/api/v1/query", url.Values{"query": {query}}, &d); err != nil {
		return err
	}
	if d.ResultType == "scalar" || d.ResultType == "string" {
		return nil
	}
	var rs []json.RawMessage
	if err := json.Unmarshal(d.Result, &rs); err != nil {
		return err
	}
	if len(rs) == 0 {
		return fmt.Errorf("empty result")
	}
	return nil
}

// poll calls f until it returns nil or the deadline passes, then fails
// with f's last error and what more says.
func poll(t *testing.T, d time.Duration, f func() error, more func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v\n%s", d, err, more())
		}
		time.Sleep(200 * time.Millisecond) // polling interval, not synchronisation
	}
}

func get(t *testing.T, hc *http.Client, u string) string {
	t.Helper()
	resp, err := hc.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v\n%s", u, resp.StatusCode, err, b)
	}
	return string(b)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
