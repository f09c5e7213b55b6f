package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/resource"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// charCluster is one node lending two 32 MiB devices of model "test-disk"
// and one without a model.
func charCluster(t *testing.T) *testcluster.Cluster {
	t.Helper()
	return testcluster.Start(t, testcluster.Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 32 << 20, Model: "test-disk"},
		{Name: "disk1", Kind: api.KindBlock, Path: "disk1.img", Size: 32 << 20, Model: "test-disk"},
		{Name: "anon", Kind: api.KindBlock, Path: "anon.img", Size: 8 << 20},
	}})
}

// lockedBuffer is a stderr that a test may watch while the verb runs.
type lockedBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	watch string
	fire  func()
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.b.Write(p)
	if w.fire != nil && strings.Contains(w.b.String(), w.watch) {
		w.fire()
		w.fire = nil
	}
	return n, err
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// runVerb runs the CLI in process against the cluster with the admin token.
func runVerb(ctx context.Context, c *testcluster.Cluster, stderr *lockedBuffer, args ...string) (string, string, int) {
	var out bytes.Buffer
	if stderr == nil {
		stderr = &lockedBuffer{}
	}
	e := &env{stdout: &out, stderr: stderr, getenv: func(k string) string {
		switch k {
		case "RIALTO_ADDR":
			return c.URL
		case "RIALTO_TOKEN":
			return testcluster.AdminToken
		}
		return ""
	}}
	code := run(ctx, args, e)
	return out.String(), stderr.String(), code
}

// small keeps a measurement to a few MiB per step.
var small = []string{"--max-streams", "3", "--bytes", "3MiB", "--request-size", "256KiB", "--latency-ops", "50"}

func deviceID(t *testing.T, c *testcluster.Cluster, name string) string {
	t.Helper()
	devs, err := c.Client().Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.Name == name {
			return d.ID
		}
	}
	t.Fatalf("no device %s in %+v", name, devs)
	return ""
}

// assertNoLiveLeases checks that characterize left no lease holding a device.
func assertNoLiveLeases(t *testing.T, c *testcluster.Cluster) {
	t.Helper()
	ctx := context.Background()
	ls, err := c.Client().Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.Borrower == characterizeBorrower && l.State != api.LeaseReleased {
			t.Errorf("lease %s is %s, want released", l.ID, l.State)
		}
	}
	devs, err := c.Client().Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.Allocated != 0 {
			t.Errorf("device %s still has %d bytes allocated", d.Name, d.Allocated)
		}
	}
}

func TestCharacterizeMeasuresStoresAndReleases(t *testing.T) {
	c := charCluster(t)
	ctx := context.Background()
	dev := deviceID(t, c, "disk0")

	out, errs, code := runVerb(ctx, c, nil, append([]string{"characterize", "node1/disk0", "-o", "json"}, small...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var p api.Profile
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("not a profile: %v\n%s", err, out)
	}
	if p.ID != "test-disk" || p.Model != "test-disk" || p.State == "" || p.Source != "measured" || p.MeasuredAt.IsZero() {
		t.Errorf("profile header %+v", p)
	}
	if len(p.WriteBps) != 3 || len(p.ReadBps) != 3 || p.Latency4KUs <= 0 {
		t.Fatalf("want 3 points and a latency, got %+v", p)
	}
	for i := range p.WriteBps {
		if p.WriteBps[i] <= 0 || p.ReadBps[i] <= 0 {
			t.Errorf("non-positive figure at %d streams: %+v", i+1, p)
		}
	}
	stored, err := c.Client().Profiles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 1 || stored[0].Model != "test-disk" || len(stored[0].WriteBps) != 3 {
		t.Errorf("stored profiles %+v", stored)
	}
	assertNoLiveLeases(t, c)
	ls, err := c.Client().AllLeases(ctx)
	if err != nil || len(ls) != 1 || ls[0].DeviceID != dev || ls[0].Mode != api.ModeDedicated {
		t.Errorf("want one dedicated lease on %s, got %d (%v)", dev, len(ls), err)
	}

	// The table, by device ID, under another model name.
	out, errs, code = runVerb(ctx, c, nil, append([]string{"characterize", deviceID(t, c, "disk1"), "--model", "other-disk"}, small...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, w := range []string{"STREAMS", "WRITE MB/s", "READ MB/s", "\n3 ", "4 KiB read latency", `"other-disk"`} {
		if !strings.Contains(out, w) {
			t.Errorf("table lacks %q:\n%s", w, out)
		}
	}
	if !strings.Contains(errs, "3 readers:") {
		t.Errorf("no progress on stderr: %s", errs)
	}
	// Each step's rate prints as rates do (resource.FormatRate: decimal,
	// no space), and reads back as one.
	steps := regexp.MustCompile(`(?m)^characterize: [1-3] (?:writer|reader)s?: (.*)$`).FindAllStringSubmatch(errs, -1)
	if len(steps) != 6 {
		t.Errorf("want 6 steps' rates on stderr, got %d: %s", len(steps), errs)
	}
	for _, st := range steps {
		if _, err := resource.ParseRate(st[1]); err != nil || !regexp.MustCompile(`^[0-9]+(\.[0-9]+)?(B|kB|MB|GB|TB)/s$`).MatchString(st[1]) {
			t.Errorf("progress %q: want the step's rate as resource.FormatRate prints it (%v)", st[0], err)
		}
	}
	out, _, code = runVerb(ctx, c, nil, "profiles")
	if code != 0 || !strings.Contains(out, "other-disk") || !strings.Contains(out, "test-disk") || !strings.Contains(out, "measured") {
		t.Errorf("profiles (exit %d):\n%s", code, out)
	}
	assertNoLiveLeases(t, c)
}

// TestCharacterizeOverTLS: in a cluster with a CA the measuring lease is
// served over TLS (nbds://), and characterize reaches it with the cluster
// CA of --cacert, as attach and memtest do.
func TestCharacterizeOverTLS(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{TLS: true, Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 32 << 20, Model: "test-disk"},
	}})
	ctx := context.Background()
	out, errs, code := runVerb(ctx, c, nil, append([]string{"characterize", "disk0", "--cacert", c.CA.CertFile(), "-o", "json"}, small...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var p api.Profile
	if err := json.Unmarshal([]byte(out), &p); err != nil || p.Model != "test-disk" || len(p.WriteBps) != 3 {
		t.Fatalf("profile %+v (%v)\n%s", p, err, out)
	}
	ls, err := c.Client().AllLeases(ctx)
	if err != nil || len(ls) != 1 || !strings.HasPrefix(ls[0].URI, "nbds://") {
		t.Errorf("want one measuring lease served over TLS, got %+v (%v)", ls, err)
	}
	assertNoLiveLeases(t, c)
}

func TestCharacterizeRefuses(t *testing.T) {
	c := charCluster(t)
	ctx := context.Background()
	// A device in use is refused before anything is borrowed.
	held, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, Affinity: []string{deviceID(t, c, "disk0")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"characterize", "disk0"}, 1, "is in use"},
		{[]string{"characterize", "anon"}, 1, "--model NAME"},
		{[]string{"characterize", "nope"}, 1, `no device "nope"`},
		{[]string{"characterize", "disk1", "--max-streams", "0"}, 2, "--max-streams"},
		{[]string{"characterize", "disk1", "--bytes", "lots"}, 2, `invalid argument "lots" for "--bytes"`},
		// Bounds on what a run holds in memory: a sample per latency read,
		// a request's buffer per stream.
		{[]string{"characterize", "disk1", "--latency-ops", "1000000000000"}, 2, "--latency-ops must be 1..1000000"},
		{[]string{"characterize", "disk1", "--max-streams", "1024", "--request-size", "32MiB"}, 2, "would hold 32GiB of buffers: at most 1GiB"},
	} {
		_, errs, code := runVerb(ctx, c, nil, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
	if _, err := c.Client().ReleaseLease(ctx, held.ID); err != nil {
		t.Fatal(err)
	}
	assertNoLiveLeases(t, c)
	if ps, err := c.Client().Profiles(ctx); err != nil || len(ps) != 0 {
		t.Errorf("profiles stored by refused runs: %+v (%v)", ps, err)
	}
}

func TestCharacterizeInterruptedReleasesLease(t *testing.T) {
	c := charCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Ctrl-C as soon as the first step is reported.
	stderr := &lockedBuffer{watch: "1 writer:", fire: cancel}
	_, errs, code := runVerb(ctx, c, stderr, append([]string{"characterize", "disk0"}, small...)...)
	if code != 1 || !strings.Contains(errs, "interrupted") {
		t.Fatalf("exit %d, stderr %q; want 1 and interrupted", code, errs)
	}
	if strings.Contains(errs, "not released") {
		t.Errorf("release failed: %s", errs)
	}
	assertNoLiveLeases(t, c)
	if ps, err := c.Client().Profiles(context.Background()); err != nil || len(ps) != 0 {
		t.Errorf("interrupted run stored %+v (%v)", ps, err)
	}
}

// TestCharacterizeBrokenPipeReleasesLease: the pipe characterize's
// progress goes to closes (`2>&1 | head`): SIGPIPE stops the measurement
// as Ctrl-C does, and the measuring lease is released rather than left
// until its TTL with the process killed.
func TestCharacterizeBrokenPipeReleasesLease(t *testing.T) {
	c := charCluster(t)
	stderr := &lockedBuffer{watch: "1 writer:", fire: func() {
		if err := syscall.Kill(os.Getpid(), syscall.SIGPIPE); err != nil {
			t.Error(err)
		}
	}}
	_, errs, code := runVerb(context.Background(), c, stderr, append([]string{"characterize", "disk0"}, small...)...)
	if code != 1 || !strings.Contains(errs, "interrupted") {
		t.Fatalf("exit %d, stderr %q; want 1 and interrupted", code, errs)
	}
	assertNoLiveLeases(t, c)
}

func TestCharacterizeProfileDeclare(t *testing.T) {
	c := charCluster(t)
	ctx := context.Background()
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// The NVMe of the NVMe-oF genomics paper (Call et al.): aggregate
	// bandwidth falls with more writers.
	good := write("smufin.json", `{"model": "smufin-nvme",
		"write_bps": [2.0e9, 1.7e9, 1.25e9, 0.94e9, 0.935e9, 0.93e9, 0.925e9, 0.92e9], "latency_4k_us": 90}`)
	out, errs, code := runVerb(ctx, c, nil, "profile", "declare", good, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var p api.Profile
	if err := json.Unmarshal([]byte(out), &p); err != nil || p.ID != "smufin-nvme" || p.State == "" || p.Source != "declared" || len(p.WriteBps) != 8 {
		t.Fatalf("declared profile %+v (%v)", p, err)
	}
	out, _, code = runVerb(ctx, c, nil, "profile", "show", "smufin-nvme")
	if code != 0 || !strings.Contains(out, "\n8 ") || !strings.Contains(out, "2000") || !strings.Contains(out, "declared") {
		t.Errorf("profile show (exit %d):\n%s", code, out)
	}

	for _, tc := range []struct {
		name, body string
		want       []string
	}{
		{"nomodel", `{"write_bps": [1e9]}`, []string{"model is empty"}},
		{"negative", `{"model": "m", "write_bps": [1e9, -5e8]}`, []string{"write_bps[1] (2 streams) is -5e+08", "must be positive"}},
		{"zero-read", `{"model": "m", "write_bps": [1e9], "read_bps": [0]}`, []string{"read_bps[0]", "must be positive"}},
		{"mbps", `{"model": "m", "write_bps": [2000, 1700]}`, []string{"bytes/s (2 GB/s is 2e9), not MB/s"}},
		{"nowrite", `{"model": "m", "read_bps": [1e9]}`, []string{"write_bps is empty"}},
		{"both", `{"write_bps": []}`, []string{"model is empty", "write_bps is empty"}},
		{"typo", `{"model": "m", "write_mbps": [1e9]}`, []string{`unknown field "write_mbps"`}},
		{"type", `{"model": "m", "write_bps": "fast"}`, []string{`"write_bps" must be an array of numbers`}},
		{"notjson", `model: m`, []string{"not JSON"}},
		{"empty", ``, []string{"empty file"}},
		{"measuredsrc", `{"model": "m", "write_bps": [1e9], "source": "measured"}`, []string{"rialto characterize"}},
		{"latency", `{"model": "m", "write_bps": [1e9], "latency_4k_us": -3}`, []string{"latency_4k_us"}},
		{"slash", `{"model": "a/b", "write_bps": [1e9]}`, []string{`model "a/b"`}},
		{"huge", `{"model": "m", "write_bps": [1e9]}` + strings.Repeat(" ", 1<<20), []string{"larger than 1MiB"}},
	} {
		_, errs, code := runVerb(ctx, c, nil, "profile", "declare", write(tc.name+".json", tc.body))
		if code != 1 {
			t.Errorf("%s: exit %d, want 1 (stderr %q)", tc.name, code, errs)
		}
		for _, w := range tc.want {
			if !strings.Contains(errs, w) {
				t.Errorf("%s: stderr lacks %q:\n%s", tc.name, w, errs)
			}
		}
	}
	ps, err := c.Client().Profiles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 {
		t.Errorf("refused declarations were stored: %+v", ps)
	}

	// A declaration does not silently replace a measurement.
	if _, err := c.Client().PutProfile(ctx, api.Profile{Model: "test-disk", Source: "measured", WriteBps: []float64{1e9}}); err != nil {
		t.Fatal(err)
	}
	decl := write("test-disk.json", `{"model": "test-disk", "write_bps": [5e8]}`)
	if _, errs, code := runVerb(ctx, c, nil, "profile", "declare", decl); code != 1 || !strings.Contains(errs, "--force") {
		t.Errorf("declare over measured: exit %d, %q", code, errs)
	}
	if _, errs, code := runVerb(ctx, c, nil, "profile", "declare", decl, "--force"); code != 0 {
		t.Errorf("declare --force: exit %d, %q", code, errs)
	}
	out, _, _ = runVerb(ctx, c, nil, "profiles", "-o", "json")
	var all []api.Profile
	if err := json.Unmarshal([]byte(out), &all); err != nil || len(all) != 2 {
		t.Fatalf("profiles -o json: %v\n%s", err, out)
	}
	for _, q := range all {
		if q.ID == "" || q.State == "" {
			t.Errorf("profile without id/state: %+v", q)
		}
		if q.Model == "test-disk" && (q.Source != "declared" || q.WriteBps[0] != 5e8) {
			t.Errorf("forced declaration not stored: %+v", q)
		}
	}
}
