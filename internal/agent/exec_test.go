package agent

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// nullDriver accepts every export without serving anything.
type nullDriver struct{}

func (nullDriver) Prepare(_ context.Context, e Export) (api.PrepareResponse, error) {
	return api.PrepareResponse{URI: "null://" + e.Request.Export}, nil
}
func (nullDriver) Teardown(context.Context, Export) error { return nil }

// offlineAgent is an agent that never ran: devices set, agent key known.
func offlineAgent(t testing.TB) *Agent {
	a, err := New(Config{ControlPlane: "http://127.0.0.1:1", BootstrapToken: "b", Name: "n", StateDir: t.TempDir(),
		Drivers: map[api.Kind]Driver{api.KindBlock: nullDriver{}, api.KindMemory: nullDriver{}},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	a.devices["disk0"] = DeviceConfig{Name: "disk0", Kind: api.KindBlock, Size: 1 << 20}
	a.devices["mem0"] = DeviceConfig{Name: "mem0", Kind: api.KindMemory, Size: 1 << 20}
	a.id.AgentKey = "k"
	return a
}

// FuzzPrepareRequest feeds arbitrary bodies to the prepare endpoint: it
// must never panic, answer only with known statuses, and create an export
// only when it answers 200.
func FuzzPrepareRequest(f *testing.F) {
	for _, s := range []string{
		`{"lease_id":"l","kind":"block","device_name":"disk0","offset":0,"length":4096,"export":"e"}`,
		`{"lease_id":"l","kind":"memory","device_name":"mem0","length":1048576,"export":"e"}`,
		`{"lease_id":"l","kind":"block","device_name":"disk0","offset":0,"length":4096,"export":"e","move":"move-1"}`,
		`{"lease_id":"l","device_name":"disk0","offset":-1,"length":4096,"export":"e"}`,
		`{"lease_id":"l","device_name":"disk0","offset":9223372036854775807,"length":9223372036854775807,"export":"e"}`,
		`{"lease_id":"","export":""}`, `{}`, `[]`, `null`, ``, `{"lease_id":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		a := offlineAgent(t)
		h := a.Handler()
		req := httptest.NewRequest(http.MethodPost, "/agent/v1/prepare", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer k")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case 200:
			if len(a.Leases()) != 1 {
				t.Fatalf("200 without an export")
			}
		case 400, 404, 409, 503:
			if len(a.Leases()) != 0 {
				t.Fatalf("%d but an export was created", rec.Code)
			}
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	})
}

func TestOverflowingRangeRejected(t *testing.T) {
	a := offlineAgent(t)
	_, err := a.Prepare(context.Background(), api.PrepareRequest{LeaseID: "l", Export: "e", DeviceName: "disk0",
		Offset: 1 << 62, Length: 1 << 62})
	if err == nil {
		t.Fatal("overflowing range accepted")
	}
}

func TestBlockOpenExistingFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(p, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	b := NewBlockDriver(slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer b.Close()
	d, err := b.Open(context.Background(), DeviceConfig{Name: "d", Kind: api.KindBlock, Path: p})
	if err != nil || d.Size != 8192 {
		t.Fatalf("Open = %+v, %v", d, err)
	}
	d, err = b.Open(context.Background(), DeviceConfig{Name: "d", Kind: api.KindBlock, Path: p, Size: 1 << 20})
	if st, _ := os.Stat(p); err != nil || d.Size != 1<<20 || st.Size() != 1<<20 {
		t.Fatalf("extend: %+v, %v", d, err)
	}
}

func TestPrepareRefusesOverlap(t *testing.T) {
	a := offlineAgent(t)
	ctx := context.Background()
	p := func(lease, export string, off, n int64) error {
		_, err := a.Prepare(ctx, api.PrepareRequest{LeaseID: lease, Export: export, DeviceName: "disk0", Kind: api.KindBlock, Offset: off, Length: n})
		return err
	}
	if err := p("l1", "e1", 0, 8192); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		lease, export string
		off, n        int64
		ok            bool
	}{
		{"l2", "e2", 4096, 8192, false}, // overlaps l1
		{"l2", "e2", 8192, 4096, true},  // adjacent
		{"l1", "e3", 4096, 4096, false}, // nor another export of the same lease (TestPrepareOverlapSameLease)
		{"l3", "e4", 0, 0, false},       // the whole device
		{"l3", "e5", 12288, 4096, true},
	} {
		err := p(tc.lease, tc.export, tc.off, tc.n)
		if (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc, err)
		}
	}
	if err := a.Teardown(ctx, "l1"); err != nil {
		t.Fatal(err)
	}
	if err := p("l4", "e6", 0, 8192); err != nil {
		t.Fatalf("after teardown: %v", err)
	}
}
