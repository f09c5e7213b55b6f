package testcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/metrics"
)

// restartDevices is a block device, a memory budget and an appliance
// whose slots a dedicated and a shared lease can take.
func restartDevices() []agent.DeviceConfig {
	return []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
		{Name: "mem0", Kind: api.KindMemory, Size: 4 << 20},
		{Name: "accel0", Kind: api.KindAccel, Size: 4, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}
}

// writeBlock writes data at off through the lease's URI with a real NBD
// client and flushes it.
func writeBlock(ctx context.Context, t *testing.T, uri string, data []byte, off int64) {
	t.Helper()
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatalf("dial %s: %v", redact(uri), err)
	}
	defer nc.Close()
	if _, err := nc.WriteAtContext(ctx, data, off, true); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// readBlock reads n bytes at off through the lease's URI.
func readBlock(ctx context.Context, uri string, n int, off int64) ([]byte, error) {
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	buf := make([]byte, n)
	if _, err := nc.ReadAtContext(ctx, buf, off); err != nil {
		return nil, err
	}
	return buf, nil
}

// callAccel runs sha256 over "abc" through an accel lease's URI (its
// first slot, or its gateway) and checks the answer.
func callAccel(ctx context.Context, uri string) error {
	u, err := url.Parse(uri)
	if err != nil {
		return err
	}
	conn, err := accel.Dial(ctx, u.Host, []byte(strings.TrimPrefix(u.Path, "/")))
	if err != nil {
		return err
	}
	defer conn.Close()
	sum, err := conn.Call(ctx, "sum", []byte("abc"))
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(sum, []byte{0xba, 0x78, 0x16, 0xbf}) {
		return errWrongSum
	}
	return nil
}

type testErr string

func (e testErr) Error() string { return string(e) }

const errWrongSum = testErr("wrong sha256")

// redact drops a URI's path, which holds the lease's secret export name.
func redact(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return "?"
	}
	u.Path, u.RawPath = "", ""
	return u.String()
}

// restartCounter is how many restored exports of the node's running
// agent ended up at the same or a new address.
func restartCounter(n *Node, result string) float64 {
	v, _ := metrics.Value(n.Agent().Metrics(), "rialto_agent_restored_exports_total", "result", result)
	return v
}

// TestRestartedLenderKeepsURIs: after a lender restarts on its state dir,
// the URIs the control plane handed out for its block, dedicated accel
// (two slots) and shared accel leases reach the same exports again, and
// the block lease's bytes are still there. (A memory lease is lost:
// TestRestartedLenderLosesMemoryLease.)
func TestRestartedLenderKeepsURIs(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: restartDevices()})
	ctx := ctxT(t)
	cl := c.Client()
	block := createBlock(t, cl, 1<<20, api.ModeDedicated)
	ded, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Count: 2, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	shared, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := url.Parse(ded.URI); u == nil || u.Query().Get("slots") == "" {
		t.Fatalf("a two-slot accel lease without further slots: %s", redact(ded.URI))
	}
	want := bytes.Repeat([]byte("rialto restart "), 700)
	writeBlock(ctx, t, block.URI, want, 4096)
	for _, l := range []api.Lease{ded, shared} {
		if err := callAccel(ctx, l.URI); err != nil {
			t.Fatalf("accel lease before the restart: %v", err)
		}
	}

	lender := c.Nodes[0]
	lender.Restart()
	for _, l := range []api.Lease{block, ded, shared} {
		if !lender.Serves(l.ID) {
			t.Fatalf("%s lease not restored", l.Kind)
		}
		if got := c.Lease(l.ID).URI; got != l.URI {
			t.Fatalf("the control plane's %s URI changed: %s -> %s", l.Kind, redact(l.URI), redact(got))
		}
	}
	if n := restartCounter(lender, "same_address"); n != 3 {
		t.Errorf("%v exports restored at the same address, want 3", n)
	}
	if n := restartCounter(lender, "new_address"); n != 0 {
		t.Errorf("%v exports restored at a new address", n)
	}

	got, err := readBlock(ctx, block.URI, len(want), 4096)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("block lease after the restart: %v (bytes equal: %v)", err, bytes.Equal(got, want))
	}
	for _, l := range []api.Lease{ded, shared} {
		if err := callAccel(ctx, l.URI); err != nil {
			t.Fatalf("%s accel lease after the restart: %v", l.Mode, err)
		}
	}
	// Every slot of the dedicated lease is back at its address.
	u, _ := url.Parse(ded.URI)
	for _, addr := range strings.Split(u.Query().Get("slots"), ",") {
		conn, err := accel.Dial(ctx, addr, []byte(strings.TrimPrefix(u.Path, "/")))
		if err != nil {
			t.Fatalf("further slot %s after the restart: %v", addr, err)
		}
		conn.Close()
	}
}

// recorder is a slog handler that keeps warnings.
type recorder struct {
	mu    sync.Mutex
	warns []map[string]string
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler           { return r }
func (r *recorder) WithGroup(string) slog.Handler                { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	m := map[string]string{"msg": rec.Message}
	rec.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	r.mu.Lock()
	r.warns = append(r.warns, m)
	r.mu.Unlock()
	return nil
}

// movedWarnings returns, by lease, the warnings that a restored export
// moved.
func (r *recorder) movedWarnings() map[string]map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]map[string]string{}
	for _, w := range r.warns {
		if strings.Contains(w["msg"], "served at a new address") {
			out[w["lease"]] = w
		}
	}
	return out
}

// TestRestartedLenderAddressTaken: when the addresses of restored exports
// are taken by another process, the agent serves them at new ones and
// warns, naming each lease with its old and new address (never the export
// name); its next heartbeat gives the control plane the new URIs, which
// the leases then carry, and the state file records them, so that the
// next restart binds them again. A report that would change a part's
// export name is refused.
func TestRestartedLenderAddressTaken(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	c := Start(t, Options{Nodes: 1, Devices: restartDevices(), Logger: slog.New(rec)})
	ctx := ctxT(t)
	cl := c.Client()
	block := createBlock(t, cl, 1<<20, api.ModeDedicated)
	ded, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	shared, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	leases := []api.Lease{block, ded, shared}
	want := bytes.Repeat([]byte{0x5a}, 8192)
	writeBlock(ctx, t, block.URI, want, 0)

	lender := c.Nodes[0]
	lender.Kill()
	// Another process takes the three addresses while the agent is down.
	var squatters []net.Listener
	for _, l := range leases {
		ln, err := net.Listen("tcp", mustURL(t, l.URI).Host)
		if err != nil {
			t.Fatalf("taking %s: %v", mustURL(t, l.URI).Host, err)
		}
		defer ln.Close()
		squatters = append(squatters, ln)
	}
	lender.Restart()
	if n := restartCounter(lender, "new_address"); n != 3 {
		t.Errorf("%v exports restored at a new address, want 3", n)
	}
	warned := rec.movedWarnings()
	c.Heartbeat()
	moved := map[string]string{} // lease -> URI it is served at now
	for _, l := range leases {
		if !lender.Serves(l.ID) {
			t.Fatalf("%s lease not restored", l.Kind)
		}
		w := warned[l.ID]
		if w == nil || w["old"] != redact(l.URI) || w["new"] == "" || w["new"] == w["old"] {
			t.Fatalf("%s lease: warning %v, want old %s and a new address", l.Kind, w, redact(l.URI))
		}
		secret := strings.TrimPrefix(mustURL(t, l.URI).Path, "/")
		for k, v := range w {
			if strings.Contains(v, secret) {
				t.Errorf("warning attribute %s holds the export name", k)
			}
		}
		// The heartbeat told the control plane: the lease (and its part)
		// carries the new address of the same export.
		got := c.Lease(l.ID)
		if redact(got.URI) != w["new"] || mustURL(t, got.URI).Path != mustURL(t, l.URI).Path {
			t.Fatalf("%s lease URI after the heartbeat: %s, want %s", l.Kind, redact(got.URI), w["new"])
		}
		if len(got.Parts) != 1 || got.Parts[0].URI != got.URI {
			t.Fatalf("%s lease part URI not updated", l.Kind)
		}
		moved[l.ID] = got.URI
	}
	if got := savedURIs(t, lender); !maps.Equal(got, moved) {
		t.Errorf("state file URIs: %d of %d are the new ones", countEqual(got, moved), len(moved))
	}
	// The exports answer at the URIs the control plane now hands out.
	got, err := readBlock(ctx, moved[block.ID], len(want), 0)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("block lease at its new address: %v", err)
	}
	for _, l := range []api.Lease{ded, shared} {
		if err := callAccel(ctx, moved[l.ID]); err != nil {
			t.Fatalf("%s accel lease at its new address: %v", l.Mode, err)
		}
	}

	// The old addresses are free again, and nothing is taken: the next
	// restart serves every lease at the URI the control plane has now.
	for _, ln := range squatters {
		ln.Close()
	}
	lender.Restart()
	if n := restartCounter(lender, "same_address"); n != 3 {
		t.Errorf("%v exports back at their address, want 3", n)
	}
	if n := restartCounter(lender, "new_address"); n != 0 {
		t.Errorf("%v exports at a new address, want 0", n)
	}
	for _, l := range []api.Lease{ded, shared} {
		if err := callAccel(ctx, c.Lease(l.ID).URI); err != nil {
			t.Fatalf("%s accel lease at its recorded URI: %v", l.Mode, err)
		}
	}
	if got, err := readBlock(ctx, c.Lease(block.ID).URI, len(want), 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("block lease at its recorded URI: %v", err)
	}
}

// savedURIs reads the URIs in a node's exports file, by lease.
func savedURIs(t *testing.T, n *Node) map[string]string {
	t.Helper()
	var saved []struct {
		LeaseID string `json:"lease_id"`
		URI     string `json:"uri"`
	}
	b, err := os.ReadFile(filepath.Join(n.StateDir, "exports.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &saved); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range saved {
		out[s.LeaseID] = s.URI
	}
	return out
}

func countEqual(a, b map[string]string) int {
	n := 0
	for k, v := range b {
		if a[k] == v {
			n++
		}
	}
	return n
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestComposedVolumeFollowsMovedPart: a composed volume attached with a
// Resolve that asks the control plane keeps working when the lender of one
// of its parts restarts with the part's port taken: the lender's heartbeat
// gives the control plane the new URI, and the attachment's redial finds
// it there (after the old address, now someone else's, does not answer).
func TestComposedVolumeFollowsMovedPart(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 3, Devices: restartDevices()})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 3, Size: 3 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, p := range l.Parts {
		uris = append(uris, p.URI)
	}
	resolved := make(chan int, 16)
	a, err := stripe.Attach(ctx, stripe.AttachConfig{URIs: uris, StripeUnit: l.StripeUnit,
		Resolve: func(ctx context.Context, part int) (string, error) {
			select {
			case resolved <- part:
			default:
			}
			cur, err := cl.Lease(ctx, l.ID)
			if err != nil {
				return "", err
			}
			return cur.Parts[part].URI, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	want := bytes.Repeat([]byte("composed and moved "), (3<<20)/19+1)[:3<<20]
	writeBlock(ctx, t, a.URI(), want, 0)

	var lender *Node
	for _, n := range c.Nodes {
		if n.ID() == l.Parts[0].NodeID {
			lender = n
		}
	}
	if lender == nil {
		t.Fatalf("no node serves part 0 (%s)", l.Parts[0].NodeID)
	}
	lender.Kill()
	squatter, err := net.Listen("tcp", mustURL(t, l.Parts[0].URI).Host)
	if err != nil {
		t.Fatalf("taking part 0's address: %v", err)
	}
	defer squatter.Close()
	lender.Restart()
	c.Heartbeat()
	moved := c.Lease(l.ID).Parts[0].URI
	if moved == l.Parts[0].URI || mustURL(t, moved).Path != mustURL(t, l.Parts[0].URI).Path {
		t.Fatalf("part 0's URI after the restart: %s (was %s)", redact(moved), redact(l.Parts[0].URI))
	}

	got, err := readBlock(ctx, a.URI(), len(want), 0)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("composed volume after part 0 moved: %v (bytes equal: %v)", err, bytes.Equal(got, want))
	}
	select {
	case p := <-resolved:
		if p != 0 {
			t.Errorf("resolved part %d, want 0", p)
		}
	default:
		t.Error("the attachment never asked for a part's URI")
	}
}
