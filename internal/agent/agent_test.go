package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/httpx"
	"github.com/rialto-project/rialto/internal/metrics"
)

// fakeCP is a minimal control plane: it accepts joins with the bootstrap
// token, records heartbeats and answers with a teardown list.
type fakeCP struct {
	mu        sync.Mutex
	joins     []api.JoinRequest
	nodes     map[string]string // machine ID -> node ID
	beats     []api.Heartbeat
	teardown  []string
	expires   map[string]time.Time // leases' expiries; a reported lease not torn down is confirmed
	down      bool                 // answer heartbeats with 503
	now       time.Time            // the control plane's clock, sent in answers if set
	agentKey  string
	cred      string
	forgetful bool // answer heartbeats with 401 once
	// parts, if set for a lease, are the ranges of it the answer wants
	// served here (api.LeaseExpiry.Parts).
	parts    map[string][]api.PartRef
	joinDown int  // answer this many joins with 503
	hangup   bool // close the next heartbeat's connection without an answer
	ackLost  bool // acknowledge the lost exports heartbeats report
	// beatIn, if set, is sent the next heartbeat once it has arrived;
	// its answer is computed after beatGo is closed.
	beatIn chan<- struct{}
	beatGo <-chan struct{}
	// joinIn and joinGo do the same for the next join.
	joinIn chan<- struct{}
	joinGo <-chan struct{}
}

func newFakeCP(t *testing.T) (*fakeCP, *httptest.Server) {
	f := &fakeCP{nodes: map[string]string{}, agentKey: "key-1", cred: "cred-1"}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/join", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer boot" {
			httpx.WriteError(w, 401, api.CodeUnauthorized, "bad bootstrap token")
			return
		}
		var req api.JoinRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		in, next := f.joinIn, f.joinGo
		f.joinIn, f.joinGo = nil, nil
		f.mu.Unlock()
		if in != nil {
			in <- struct{}{}
			<-next
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.joins = append(f.joins, req)
		if f.joinDown > 0 {
			f.joinDown--
			httpx.WriteError(w, 503, api.CodeUnavailable, "control plane starting")
			return
		}
		id, ok := f.nodes[req.Fingerprint.MachineID]
		if !ok {
			id = "node-" + req.Name
			f.nodes[req.Fingerprint.MachineID] = id
		}
		httpx.WriteJSON(w, http.StatusOK, api.JoinResponse{NodeID: id, Credential: f.cred, AgentKey: f.agentKey, HeartbeatSeconds: 3600})
	})
	mux.HandleFunc("POST /v1/nodes/{id}/heartbeat", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		in, next := f.beatIn, f.beatGo
		f.beatIn, f.beatGo = nil, nil
		f.mu.Unlock()
		if in != nil {
			in <- struct{}{}
			<-next
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.hangup {
			f.hangup = false
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
			return
		}
		if f.forgetful || r.Header.Get("Authorization") != "Bearer "+f.cred {
			f.forgetful = false
			httpx.WriteError(w, 401, api.CodeUnauthorized, "unknown node credential")
			return
		}
		if f.down {
			httpx.WriteError(w, 503, api.CodeUnavailable, "control plane down")
			return
		}
		var hb api.Heartbeat
		json.NewDecoder(r.Body).Decode(&hb)
		f.beats = append(f.beats, hb)
		resp := api.HeartbeatResponse{Teardown: f.teardown, Now: f.now}
		for _, x := range hb.Lost {
			if f.ackLost && !slices.Contains(resp.Lost, x.LeaseID) {
				resp.Lost = append(resp.Lost, x.LeaseID)
			}
		}
		for _, id := range hb.Leases {
			if !slices.Contains(f.teardown, id) {
				resp.Leases = append(resp.Leases, api.LeaseExpiry{ID: id, ExpiresAt: f.expires[id], Parts: f.parts[id]})
			}
		}
		httpx.WriteJSON(w, http.StatusOK, resp)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeCP) lastBeat() api.Heartbeat {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.beats) == 0 {
		return api.Heartbeat{}
	}
	return f.beats[len(f.beats)-1]
}

type running struct {
	a    *Agent
	stop context.CancelFunc
	done chan error
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{a: a, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() { r.halt(t) })
	select {
	case <-a.Ready():
	case err := <-r.done:
		r.done <- err
		t.Fatalf("agent stopped before ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("agent not ready")
	}
	return r
}

func (r *running) halt(t *testing.T) {
	r.stop()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		r.done <- nil
	case <-time.After(10 * time.Second):
		t.Error("agent did not stop")
	}
}

func testConfig(url, dir string) Config {
	return Config{
		ControlPlane:   url,
		BootstrapToken: "boot",
		Name:           "n1",
		StateDir:       dir,
		Devices: []DeviceConfig{
			{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 1 << 20},
			{Name: "gpu", Kind: api.KindAccel, Size: 2, Attributes: map[string]string{"slot_memory": "1MiB"}},
		},
	}
}

func call(t *testing.T, a *Agent, key, path string, body any) (*http.Response, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, a.AgentURL()+path, bytes.NewReader(b))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return resp, buf.Bytes()
}

func TestJoinPersistsIdentity(t *testing.T) {
	cp, srv := newFakeCP(t)
	dir := t.TempDir()
	r := start(t, testConfig(srv.URL, dir))
	if r.a.NodeID() != "node-n1" {
		t.Fatalf("node ID %q", r.a.NodeID())
	}
	st, err := os.Stat(filepath.Join(dir, identityFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("identity file: %v %v", st, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "disk0.img")); err != nil || st.Size() != 1<<20 {
		t.Fatalf("backing file: %v %v", st, err)
	}
	j := cp.joins[0]
	if j.AgentURL == "" || j.Endpoints[api.KindBlock] == "" || len(j.Devices) != 2 || j.Fingerprint.Cores == 0 || j.Fingerprint.MemoryBytes == 0 {
		t.Fatalf("join request %+v", j)
	}
	url := r.a.AgentURL()
	r.halt(t)

	// Restart: same machine ID, same node, same ports.
	r2 := start(t, testConfig(srv.URL, dir))
	if r2.a.NodeID() != "node-n1" || r2.a.AgentURL() != url {
		t.Fatalf("after restart: node %q url %q (was %q)", r2.a.NodeID(), r2.a.AgentURL(), url)
	}
	if cp.joins[1].Fingerprint.MachineID != j.Fingerprint.MachineID {
		t.Fatal("machine ID changed across restarts")
	}
}

// A join the control plane cannot take yet is retried after a backoff
// timed by the agent's clock: nothing is sent again until it moves.
func TestJoinRetriesOnItsClock(t *testing.T) {
	cp, srv := newFakeCP(t)
	cp.set(func(f *fakeCP) { f.joinDown = 2 })
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Clock = clk
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxFor(t))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	joins := func() int {
		cp.mu.Lock()
		defer cp.mu.Unlock()
		return len(cp.joins)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		// The agent waits for its retry: one timer on the clock, the
		// join attempts so far made.
		if err := clk.BlockUntil(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if n := joins(); n != attempt {
			t.Fatalf("%d joins sent while waiting for retry %d", n, attempt)
		}
		next, _ := clk.Next()
		if wait := next.Sub(clk.Now()); wait < 100*time.Millisecond || wait > time.Duration(attempt)*200*time.Millisecond {
			t.Fatalf("retry %d after %v, want within [100ms, %v]", attempt, wait, time.Duration(attempt)*200*time.Millisecond)
		}
		clk.Advance(next.Sub(clk.Now()))
	}
	select {
	case <-a.Ready():
	case <-ctx.Done():
		t.Fatal("not ready")
	}
	if n := joins(); n != 3 || a.NodeID() != "node-n1" {
		t.Fatalf("%d joins, node %q", n, a.NodeID())
	}
}

func TestJoinRejected(t *testing.T) {
	_, srv := newFakeCP(t)
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.BootstrapToken = "wrong"
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "join rejected") {
		t.Fatalf("Run = %v", err)
	}
}

// A plain 409 to a join (a proxy's words, not the API's body) is not the
// control plane's "this machine's node is live": the agent retries it as
// a failed join, and does not tell the operator that the node is live.
func TestJoinPlainConflictNotNodeLive(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "409 Conflict", http.StatusConflict)
	}))
	t.Cleanup(srv.Close)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	logs := &msgRecorder{}
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Clock = clk
	cfg.Logger = slog.New(logs)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxFor(t))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	// The agent waits for its retry: the first join's answer is logged.
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if n := logs.count("this machine's node is live"); n != 0 {
		t.Errorf("a proxy's plain 409 was logged %d times as this machine's node being live", n)
	}
	if logs.count("join failed; retrying") != 1 {
		t.Errorf("the plain 409 was not logged as a failed join: %q", logs.msgs)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"no control plane", func(c *Config) { c.ControlPlane = "" }},
		{"no token", func(c *Config) { c.BootstrapToken = "" }},
		{"no name", func(c *Config) { c.Name = "" }},
		{"no state dir", func(c *Config) { c.StateDir = "" }},
		{"dup device", func(c *Config) { c.Devices = append(c.Devices, c.Devices[0]) }},
		{"no path", func(c *Config) { c.Devices[0].Path = "" }},
		{"bad kind", func(c *Config) { c.Devices[0].Kind = "floppy" }},
		{"wildcard listen without advertise", func(c *Config) { c.Listen = "0.0.0.0" }},
		{"memory without size", func(c *Config) { c.Devices[1] = DeviceConfig{Name: "m", Kind: api.KindMemory} }},
		{"machine id too long", func(c *Config) { c.MachineID = strings.Repeat("m", api.MaxMachineIDLen+1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("http://x", "d")
			tc.mod(&cfg)
			if _, err := New(cfg); !errors.Is(err, ErrConfig) {
				t.Fatalf("New = %v", err)
			}
		})
	}
}

func TestPrepareServeTeardown(t *testing.T) {
	cp, srv := newFakeCP(t)
	dir := t.TempDir()
	r := start(t, testConfig(srv.URL, dir))
	a := r.a

	// Put known bytes in the second half of the device.
	f, _ := os.OpenFile(filepath.Join(dir, "disk0.img"), os.O_RDWR, 0)
	f.WriteAt([]byte("hello, borrower"), 512<<10)
	f.Close()

	req := api.PrepareRequest{LeaseID: "lease-1", Kind: api.KindBlock, Mode: api.ModeShared, DeviceName: "disk0",
		Offset: 512 << 10, Length: 512 << 10, Export: "rlc_secret.0"}
	for _, tc := range []struct {
		name, key string
		body      any
		status    int
	}{
		{"no key", "", req, 401},
		{"wrong key", "key-2", req, 401},
		{"bad json", "key-1", "nope", 400},
		{"unknown device", "key-1", api.PrepareRequest{LeaseID: "l", Export: "e", DeviceName: "disk9"}, 404},
		{"wrong kind", "key-1", api.PrepareRequest{LeaseID: "l", Export: "e", DeviceName: "disk0", Kind: api.KindMemory}, 404},
		{"out of range", "key-1", api.PrepareRequest{LeaseID: "l", Export: "e", DeviceName: "disk0", Offset: 1 << 20, Length: 1}, 400},
		{"no export", "key-1", api.PrepareRequest{LeaseID: "l", DeviceName: "disk0"}, 400},
	} {
		resp, body := call(t, a, tc.key, "/agent/v1/prepare", tc.body)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d (%s), want %d", tc.name, resp.StatusCode, body, tc.status)
		}
	}
	if len(a.Leases()) != 0 {
		t.Fatalf("failed prepares left exports: %v", a.Leases())
	}

	var pr api.PrepareResponse
	for range 2 { // idempotent
		resp, body := call(t, a, "key-1", "/agent/v1/prepare", req)
		if resp.StatusCode != 200 {
			t.Fatalf("prepare: %d %s", resp.StatusCode, body)
		}
		json.Unmarshal(body, &pr)
	}
	if want := "nbd://" + a.Endpoint(api.KindBlock) + "/rlc_secret.0"; pr.URI != want {
		t.Fatalf("URI %q, want %q", pr.URI, want)
	}
	other := req
	other.LeaseID = "lease-2"
	if resp, _ := call(t, a, "key-1", "/agent/v1/prepare", other); resp.StatusCode != 409 {
		t.Errorf("export reused by another lease: %d", resp.StatusCode)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := nbd.DialURI(ctx, pr.URI)
	if err != nil {
		t.Fatal(err)
	}
	if c.Size() != 512<<10 {
		t.Errorf("export size %d", c.Size())
	}
	buf := make([]byte, 15)
	if _, err := c.ReadAt(buf, 0); err != nil || string(buf) != "hello, borrower" {
		t.Errorf("read %q %v", buf, err)
	}
	c.Close()
	if _, err := nbd.Dial(ctx, "tcp", a.Endpoint(api.KindBlock), "rlc_guess.0"); err == nil {
		t.Error("a wrong export name was served")
	}

	// The heartbeat reports the lease; the exports survive in the state file.
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if got := cp.lastBeat().Leases; len(got) != 1 || got[0] != "lease-1" {
		t.Fatalf("heartbeat leases %v", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, exportsFile)); !strings.Contains(string(b), "lease-1") {
		t.Fatalf("exports file: %s", b)
	}

	resp, body := call(t, a, "key-1", "/agent/v1/teardown", api.TeardownRequest{LeaseID: "lease-1"})
	if resp.StatusCode != 200 {
		t.Fatalf("teardown: %d %s", resp.StatusCode, body)
	}
	if _, err := nbd.DialURI(ctx, pr.URI); err == nil {
		t.Error("export still served after teardown")
	}
	if resp, _ := call(t, a, "key-1", "/agent/v1/teardown", api.TeardownRequest{LeaseID: "lease-1"}); resp.StatusCode != 200 {
		t.Error("second teardown failed")
	}
}

func TestRestartRestoresExportsAndHeartbeatTearsDown(t *testing.T) {
	cp, srv := newFakeCP(t)
	dir := t.TempDir()
	r := start(t, testConfig(srv.URL, dir))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, id := range []string{"lease-a", "lease-b"} {
		if _, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: id, Kind: api.KindBlock, DeviceName: "disk0", Offset: int64(i) * 4096, Length: 4096, Export: "x_" + id}); err != nil {
			t.Fatal(err)
		}
	}
	r.halt(t)

	r2 := start(t, testConfig(srv.URL, dir))
	if got := r2.a.Leases(); len(got) != 2 {
		t.Fatalf("restored leases %v", got)
	}
	c, err := nbd.Dial(ctx, "tcp", r2.a.Endpoint(api.KindBlock), "x_lease-a")
	if err != nil {
		t.Fatalf("restored export not served: %v", err)
	}
	c.Close()

	cp.mu.Lock()
	cp.teardown = []string{"lease-a"}
	cp.mu.Unlock()
	if err := r2.a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r2.a.Leases(); len(got) != 1 || got[0] != "lease-b" {
		t.Fatalf("after reconciliation %v", got)
	}
}

// TestRestoreOldFormatExports: an exports file written before URIs were
// persisted (a list of bare prepare requests) still restores, wherever
// the data planes are now; the agent then rewrites it with the URIs, and
// the next restart serves the exports at the same addresses.
func TestRestoreOldFormatExports(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	data := bytes.Repeat([]byte("old state "), 400)
	disk := make([]byte, 1<<20)
	copy(disk[8192:], data)
	if err := os.WriteFile(filepath.Join(dir, "disk0.img"), disk, 0o600); err != nil {
		t.Fatal(err)
	}
	old, err := json.MarshalIndent([]api.PrepareRequest{
		{LeaseID: "lease-b", Kind: api.KindBlock, DeviceName: "disk0", Offset: 8192, Length: 65536, Export: "x_b"},
		{LeaseID: "lease-g", Kind: api.KindAccel, DeviceName: "gpu", Offset: 0, Length: 2 * api.SlotUnits, Role: "sha256", Export: "x_g"},
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(old, []byte(`"uri"`)) {
		t.Fatal("the old format has no uri")
	}
	if err := os.WriteFile(filepath.Join(dir, exportsFile), old, 0o600); err != nil {
		t.Fatal(err)
	}

	r := start(t, testConfig(srv.URL, dir))
	if got := r.a.Leases(); len(got) != 2 {
		t.Fatalf("restored leases %v", got)
	}
	restored := func(a *Agent, result string) float64 {
		v, _ := metrics.Value(a.Metrics(), "rialto_agent_restored_exports_total", "result", result)
		return v
	}
	if n := restored(r.a, "unknown_address"); n != 2 {
		t.Errorf("%v exports restored without a known address, want 2", n)
	}
	c, err := nbd.Dial(ctx, "tcp", r.a.Endpoint(api.KindBlock), "x_b")
	if err != nil {
		t.Fatalf("restored export not served: %v", err)
	}
	buf := make([]byte, len(data))
	if _, err := c.ReadAtContext(ctx, buf, 0); err != nil || !bytes.Equal(buf, data) {
		t.Fatalf("restored export's bytes: %v", err)
	}
	c.Close()
	var saved []persistedExport
	if err := readJSON(filepath.Join(dir, exportsFile), &saved); err != nil {
		t.Fatal(err)
	}
	uris := map[string]string{}
	for _, p := range saved {
		uris[p.LeaseID] = p.URI
	}
	if !strings.HasPrefix(uris["lease-b"], "nbd://") || !strings.HasPrefix(uris["lease-g"], "rialto-accel://") {
		t.Fatalf("rewritten exports file has URIs %v", uris)
	}
	r.halt(t)

	r2 := start(t, testConfig(srv.URL, dir))
	if n := restored(r2.a, "same_address"); n != 2 {
		t.Errorf("%v exports restored at the same address, want 2", n)
	}
	var again []persistedExport
	if err := readJSON(filepath.Join(dir, exportsFile), &again); err != nil {
		t.Fatal(err)
	}
	for _, p := range again {
		if p.URI != uris[p.LeaseID] {
			t.Errorf("%s moved from %s to %s", p.LeaseID, uriAddress(uris[p.LeaseID]), uriAddress(p.URI))
		}
	}
	c, err = nbd.DialURI(ctx, uris["lease-b"])
	if err != nil {
		t.Fatalf("persisted URI after the second restart: %v", err)
	}
	c.Close()
}

func TestFaults(t *testing.T) {
	cp, srv := newFakeCP(t)
	r := start(t, testConfig(srv.URL, t.TempDir()))
	a := r.a
	req := api.PrepareRequest{LeaseID: "l", Kind: api.KindBlock, DeviceName: "disk0", Length: 4096, Export: "e"}

	a.Faults.RefusePrepare.Store(true)
	if resp, _ := call(t, a, "key-1", "/agent/v1/prepare", req); resp.StatusCode != 503 {
		t.Errorf("refuse: %d", resp.StatusCode)
	}
	a.Faults.RefusePrepare.Store(false)

	a.Faults.IgnorePrepare.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	b, _ := json.Marshal(req)
	hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.AgentURL()+"/agent/v1/prepare", bytes.NewReader(b))
	hr.Header.Set("Authorization", "Bearer key-1")
	if _, err := http.DefaultClient.Do(hr); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ignore: %v", err)
	}
	cancel()
	a.Faults.IgnorePrepare.Store(false)

	a.Faults.PauseHeartbeats.Store(true)
	cp.mu.Lock()
	n := len(cp.beats)
	cp.mu.Unlock()
	a.Heartbeat(context.Background())
	cp.mu.Lock()
	if len(cp.beats) != n {
		t.Error("heartbeat sent while paused")
	}
	cp.mu.Unlock()
	a.Faults.PauseHeartbeats.Store(false)

	// A forgotten credential makes the agent join again.
	cp.mu.Lock()
	cp.forgetful = true
	joins := len(cp.joins)
	cp.mu.Unlock()
	a.Heartbeat(context.Background())
	cp.mu.Lock()
	if len(cp.joins) != joins+1 {
		t.Error("no rejoin after 401")
	}
	cp.mu.Unlock()
}

func TestProbeRoundRotates(t *testing.T) {
	a := offlineAgent(t)
	var peers []api.Node
	for i := range 40 {
		peers = append(peers, api.Node{ID: fmt.Sprint(i)})
	}
	seen := map[string]int{}
	for range 5 { // 80 probes: every peer twice
		round := a.probeRound(peers)
		if len(round) != MaxProbesPerBeat {
			t.Fatalf("round of %d", len(round))
		}
		for _, p := range round {
			seen[p.ID]++
		}
	}
	for _, p := range peers {
		if seen[p.ID] != 2 {
			t.Fatalf("peer %s probed %d times: %v", p.ID, seen[p.ID], seen)
		}
	}
	if got := a.probeRound(peers[:3]); len(got) != 3 {
		t.Fatalf("small peer set: %d", len(got))
	}
}

func TestLinksReported(t *testing.T) {
	cp, srv := newFakeCP(t)
	r := start(t, testConfig(srv.URL, t.TempDir()))
	peer := start(t, Config{ControlPlane: srv.URL, BootstrapToken: "boot", Name: "n2", StateDir: t.TempDir()})
	// Only r's heartbeats reach the fake control plane from here on: the
	// peer's own would otherwise be the last one read below.
	peer.a.PauseHeartbeats(true)
	r.a.mu.Lock()
	r.a.peers = []api.Node{{ID: peer.a.NodeID(), AgentURL: peer.a.AgentURL()}, {ID: "gone", AgentURL: "http://127.0.0.1:1"}}
	r.a.mu.Unlock()
	ctx := context.Background()
	r.a.Heartbeat(ctx)
	r.a.Heartbeat(ctx)
	links := cp.lastBeat().Links
	got := map[string]api.LinkReport{}
	for _, l := range links {
		got[l.To] = l
	}
	if !got["controlplane"].Up || got["controlplane"].RTTMicros <= 0 {
		t.Errorf("controlplane link %+v", got["controlplane"])
	}
	if !got["node-n2"].Up || got["node-n2"].RTTMicros <= 0 {
		t.Errorf("peer link %+v", got["node-n2"])
	}
	if got["gone"].Up {
		t.Error("unreachable peer reported up")
	}
}

// TestLinkUpAfterFailedBeat: the heartbeat after a failed one (answered
// 401: the control plane forgot the node or refused a revoked certificate,
// and the agent joined again; or not answered at all) reports the link to
// the control plane up: the report arrives over it. Reported down, the
// control plane would see no fabric path to the node and place nothing on
// it until one more heartbeat.
func TestLinkUpAfterFailedBeat(t *testing.T) {
	cp, srv := newFakeCP(t)
	r := start(t, testConfig(srv.URL, t.TempDir()))
	ctx := context.Background()
	cpLink := func() (api.LinkReport, bool) {
		for _, l := range cp.lastBeat().Links {
			if l.To == "controlplane" {
				return l, true
			}
		}
		return api.LinkReport{}, false
	}
	for _, tc := range []struct {
		name    string
		fail    func(*fakeCP)
		failErr bool // the failed heartbeat returns an error
	}{
		{"answered 401, joined again", func(f *fakeCP) { f.forgetful = true }, false},
		{"no answer", func(f *fakeCP) { f.hangup = true }, true},
	} {
		cp.mu.Lock()
		tc.fail(cp)
		cp.mu.Unlock()
		if err := r.a.Heartbeat(ctx); (err != nil) != tc.failErr {
			t.Fatalf("%s: failed heartbeat: %v", tc.name, err)
		}
		if err := r.a.Heartbeat(ctx); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if l, ok := cpLink(); !ok || !l.Up || l.RTTMicros <= 0 {
			t.Fatalf("%s: the next heartbeat reports the control plane's link %+v (reported: %v)", tc.name, l, ok)
		}
	}
}

// TestRestoreReportsUnacknowledgedMove: an export whose new address the
// control plane had not acknowledged when the agent stopped (the state
// file's moved) is reported again after the restart, at the address it is
// served at now — even when that is its old address again — since the
// control plane may have recorded the move without the agent learning it.
func TestRestoreReportsUnacknowledgedMove(t *testing.T) {
	f, srv := newFakeCP(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "disk0.img"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	req := api.PrepareRequest{LeaseID: "lease-b", Kind: api.KindBlock, DeviceID: "dev-1", DeviceName: "disk0", Offset: 8192, Length: 65536, Export: "x_b"}
	if err := writeJSON(filepath.Join(dir, exportsFile), []api.PrepareRequest{req}); err != nil {
		t.Fatal(err)
	}
	r := start(t, testConfig(srv.URL, dir))
	var saved []persistedExport
	if err := readJSON(filepath.Join(dir, exportsFile), &saved); err != nil || len(saved) != 1 || saved[0].URI == "" {
		t.Fatalf("exports file %+v: %v", saved, err)
	}
	served := saved[0].URI
	if err := r.a.Heartbeat(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m := f.lastBeat().Moved; len(m) != 0 {
		t.Fatalf("an export at its address reported as moved: %d entries", len(m))
	}
	r.halt(t)

	saved[0].Moved = "nbd://127.0.0.1:1/x_b" // reported, never acknowledged
	if err := writeJSON(filepath.Join(dir, exportsFile), saved); err != nil {
		t.Fatal(err)
	}
	r2 := start(t, testConfig(srv.URL, dir))
	if err := r2.a.Heartbeat(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []api.MovedExport{{LeaseID: "lease-b", DeviceID: "dev-1", Offset: 8192, URI: served}}
	if got := f.lastBeat().Moved; !slices.Equal(got, want) {
		t.Fatalf("heartbeat moved %+v, want the export's current address", got)
	}
}

// probingAccel is the accelerator driver, checking when a device opens
// (its slots taking fresh ports) which of ports it could bind.
type probingAccel struct {
	*AccelDriver
	host  string
	ports []string
	mu    sync.Mutex
	free  []string // ports that were free while a device opened
}

func (p *probingAccel) Open(ctx context.Context, dev DeviceConfig) (DeviceConfig, error) {
	for _, port := range p.ports {
		if ln, err := net.Listen("tcp", net.JoinHostPort(p.host, port)); err == nil {
			ln.Close()
			p.mu.Lock()
			p.free = append(p.free, port)
			p.mu.Unlock()
		}
	}
	return p.AccelDriver.Open(ctx, dev)
}

// TestRestartHoldsRememberedPorts: while a restarted agent opens its
// devices (accelerator slots listen on fresh ports), the ports its last
// run served at — API, data plane, each slot of a restored lease — are
// held, so no fresh slot can take one; then each owner binds its own again.
func TestRestartHoldsRememberedPorts(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	r := start(t, testConfig(srv.URL, dir))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-b", Kind: api.KindBlock, DeviceName: "disk0", Length: 4096, Export: "x_b"}); err != nil {
		t.Fatal(err)
	}
	acc, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-g", Kind: api.KindAccel, DeviceName: "gpu", Length: 2 * api.SlotUnits, Role: "sha256", Export: "x_g"})
	if err != nil {
		t.Fatal(err)
	}
	apiURL := r.a.AgentURL()
	ports := append(uriPorts(acc.URI), uriPorts("x://"+r.a.Endpoint(api.KindBlock))...)
	if u, err := url.Parse(apiURL); err == nil {
		ports = append(ports, uriPorts("x://"+u.Host)...)
	}
	if len(ports) != 4 {
		t.Fatalf("ports %v", ports)
	}
	r.halt(t)

	cfg := testConfig(srv.URL, dir)
	probe := &probingAccel{AccelDriver: NewAccelDriver(slog.New(slog.DiscardHandler), "127.0.0.1"), host: "127.0.0.1", ports: ports}
	cfg.Drivers = map[api.Kind]Driver{api.KindAccel: probe}
	r2 := start(t, cfg)
	if len(probe.free) > 0 {
		t.Errorf("ports %v of %v were free while a device opened", probe.free, ports)
	}
	if r2.a.AgentURL() != apiURL {
		t.Errorf("agent API at %s, was %s", r2.a.AgentURL(), apiURL)
	}
	var saved []persistedExport
	if err := readJSON(filepath.Join(dir, exportsFile), &saved); err != nil {
		t.Fatal(err)
	}
	for _, p := range saved {
		if p.LeaseID == "lease-g" && p.URI != acc.URI {
			t.Errorf("accel lease moved from %s to %s", uriAddress(acc.URI), uriAddress(p.URI))
		}
	}
}

// A prepare whose range overlaps another export of the same lease (one
// left from an earlier placement, whose teardown never came) is refused
// too: that export's teardown wipes its range, which would zero what the
// new one holds. Parts of one lease side by side on a device are fine.
func TestPrepareOverlapSameLease(t *testing.T) {
	_, srv := newFakeCP(t)
	r := start(t, testConfig(srv.URL, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prep := func(export string, off int64) error {
		_, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-l", Kind: api.KindBlock, DeviceName: "disk0", Offset: off, Length: 8192, Export: export})
		return err
	}
	if err := prep("x_old", 0); err != nil {
		t.Fatal(err)
	}
	if err := prep("x_side", 8192); err != nil {
		t.Fatalf("a second part beside the first: %v", err)
	}
	if err := prep("x_old", 0); err != nil {
		t.Fatalf("the same export again: %v", err)
	}
	for _, off := range []int64{0, 4096} {
		err := prep("x_new", off)
		if !errors.Is(err, ErrOverlap) {
			t.Fatalf("another export of the lease at %d over x_old: %v, want ErrOverlap", off, err)
		}
	}
}

// A prepare whose range overlaps another lease's is refused, and the reason
// (which reaches the requesting tenant) does not name the other lease.
func TestPrepareOverlapHidesOtherLease(t *testing.T) {
	_, srv := newFakeCP(t)
	r := start(t, testConfig(srv.URL, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-owner", Kind: api.KindBlock, DeviceName: "disk0", Length: 8192, Export: "x_owner"}); err != nil {
		t.Fatal(err)
	}
	_, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-other", Kind: api.KindBlock, DeviceName: "disk0", Offset: 4096, Length: 8192, Export: "x_other"})
	if !errors.Is(err, ErrOverlap) {
		t.Fatalf("overlapping prepare: %v, want ErrOverlap", err)
	}
	if strings.Contains(err.Error(), "lease-owner") {
		t.Fatalf("the refusal names the other lease: %v", err)
	}
}

// An export name is one part's range: a prepare naming an export this
// agent serves for another range (the part was placed again elsewhere on
// the device while the teardown of the earlier placement did not reach
// this agent) is refused. Taken as a retry, the driver would go on serving
// the old range under the name while the agent recorded the new one: the
// old range, free in the control plane's view, would be lent to another
// lease while still served, and never wiped.
func TestPrepareSameExportOtherRange(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	r := start(t, testConfig(srv.URL, dir))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prep := func(lease, export string, off int64) error {
		_, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: lease, Kind: api.KindBlock, DeviceName: "disk0", Offset: off, Length: 8192, Export: export})
		return err
	}
	if err := prep("lease-l", "x_part0", 0); err != nil {
		t.Fatal(err)
	}
	// The lease's bytes in its first range.
	img := filepath.Join(dir, "disk0.img")
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xab}, 8192), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := prep("lease-l", "x_part0", 0); err != nil {
		t.Fatalf("the same export again (a retry): %v", err)
	}
	if err := prep("lease-l", "x_part0", 16384); !errors.Is(err, ErrOverlap) {
		t.Errorf("the same export name at another range: %v, want ErrOverlap", err)
	}
	if err := prep("lease-m", "x_other", 0); !errors.Is(err, ErrOverlap) {
		t.Errorf("another lease over the range x_part0 still serves: %v, want ErrOverlap", err)
	}
	if err := r.a.Teardown(ctx, "lease-l"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:8192], make([]byte, 8192)) {
		t.Fatal("the lease's first range still holds its bytes after its teardown")
	}
}

// A teardown of an earlier placement of a lease, arriving once the lease
// has been placed here again (the control plane's call timed out and it
// placed the lease again: part 0 landed on the same range under the same
// export name), tears down only what that placement left — not the
// export prepared again, whose bytes stay. A teardown of every placement
// then wipes it.
func TestLateTeardownLeavesLaterPlacement(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	r := start(t, testConfig(srv.URL, dir))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prep := func(export string, off int64, placement int) {
		t.Helper()
		if _, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-l", Kind: api.KindBlock, DeviceName: "disk0",
			Offset: off, Length: 8192, Export: export, Placement: placement}); err != nil {
			t.Fatal(err)
		}
	}
	prep("x_part0", 0, 1)
	prep("x_part1", 8192, 1) // placed elsewhere the second time
	img := filepath.Join(dir, "disk0.img")
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xab}, 16384), 0); err != nil {
		t.Fatal(err)
	}
	prep("x_part0", 0, 2)
	prep("x_part0", 0, 1) // a late prepare of the first placement changes nothing
	if err := r.a.TeardownPlacement(ctx, "lease-l", 1); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 16384)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:8192], bytes.Repeat([]byte{0xab}, 8192)) {
		t.Fatal("a late teardown of the first placement wiped the range the second placement serves")
	}
	if !bytes.Equal(got[8192:], make([]byte, 8192)) {
		t.Fatal("the first placement's other range was not wiped")
	}
	r.a.mu.Lock()
	_, kept := r.a.exports["x_part0"]
	_, left := r.a.exports["x_part1"]
	r.a.mu.Unlock()
	if !kept || left {
		t.Fatalf("after the late teardown: x_part0 kept %v (want true), x_part1 kept %v (want false)", kept, left)
	}
	if err := r.a.TeardownPlacement(ctx, "lease-l", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:8192], make([]byte, 8192)) {
		t.Fatal("the lease's teardown left its bytes")
	}
}
