package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
)

// FuzzAPIBodies sends arbitrary bodies to the control plane's routes that
// take one — lease creation and explain, renew, move, drain, cordon,
// profiles, join and heartbeat — on a server with a node lending a
// disk and a tenant holding a lease. Bad input is the caller's: no route
// may panic or answer a 5xx other than 503 (busy), and every refusal is
// an error body with a code.
func FuzzAPIBodies(f *testing.F) {
	ctx := f.Context()
	h, call := sqliteHandler(ctx, f)
	join, _ := json.Marshal(api.JoinRequest{Name: "n1", Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1",
		Fingerprint: api.Fingerprint{MachineID: "mid-n1", Hostname: "n1", Cores: 2, MemoryBytes: 1 << 30},
		Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"}}})
	rec := call(http.MethodPost, "/v1/join", bootTok, join)
	// (the fuzzed join may be of this node again: its credential then changes)
	var jr api.JoinResponse
	if rec.Code != http.StatusOK && rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &jr) != nil {
		f.Fatalf("join: %d %s", rec.Code, rec.Body)
	}
	rec = call(http.MethodPost, "/v1/leases", aliceTok, []byte(`{"kind":"block","size":1048576}`))
	var l api.Lease
	if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &l) != nil {
		f.Fatalf("lease: %d %s", rec.Code, rec.Body)
	}

	type route struct{ method, path, tok string }
	routes := []route{
		{"POST", "/v1/leases", aliceTok}, {"POST", "/v1/explain", aliceTok}, {"POST", "/v1/leases/{lease}/renew", aliceTok},
		{"POST", "/v1/leases/{lease}/move", adminTok}, {"POST", "/v1/nodes/{node}/drain", adminTok},
		{"POST", "/v1/nodes/{node}/cordon", adminTok}, {"PUT", "/v1/profiles/{model}", adminTok},
		{"POST", "/v1/join", bootTok}, {"POST", "/v1/nodes/{node}/heartbeat", jr.Credential},
	}
	for _, s := range []struct {
		route byte
		body  string
	}{
		{0, `{"kind":"block","size":4096,"ttl_seconds":60}`}, {0, `{"kind":"memory","size":-1}`}, {0, `{"kind":"block","mode":"composed","count":3,"stripe_unit":65536}`},
		{1, `{"kind":"block","size":1e18}`}, {2, `{"ttl_seconds":30}`}, {2, `{"ttl_seconds":-1}`},
		{3, `{"to_node":"n1"}`}, {3, `{"part":99,"to_node":"","to_device":"disk9"}`}, {3, `{"part":-1}`}, {4, `{"deadline_seconds":1}`},
		{4, `{"deadline_seconds":-1e308}`}, {5, ``},
		{6, `{"id":"m","model":"m","write_bps":[1e9,2e9],"read_bps":[1e9],"latency_4k_us":80,"source":"declared","measured_at":"2026-01-01T00:00:00Z"}`},
		{6, `{"id":"m","model":"other","write_bps":[-1],"read_bps":[],"source":"x"}`},
		{7, string(join)}, {7, `{"name":"n2","fingerprint":{"machine_id":"m2"},"agent_url":"::bad"}`},
		{8, `{"health":"ok","leases":["` + l.ID + `"],"links":[{"to":"controlplane","rtt_us":12.5,"up":true}]}`},
		{8, `{"health":"ok","leases":["` + l.ID + `"],"leases_complete":true,"exports_complete":true,"exports":[{"lease_id":"` + l.ID +
			`","device_id":"` + l.Parts[0].DeviceID + `","offset":4194304,"length":1048576,"move":"move-1","uri":"nbd://127.0.0.1:10809/rlp_x"}]}`},
		{8, `{"usage":[{"device":"disk0","read_bps":-1}]}`}, {0, `null`}, {3, `[]`}, {8, `{"leases":1}`},
	} {
		f.Add(s.route, "", []byte(s.body))
	}
	f.Add(byte(2), "lease-nope", []byte(`{}`))
	f.Add(byte(6), "%2F..%2F", []byte(`{"kind":"block"}`))
	f.Fuzz(func(t *testing.T, which byte, id string, body []byte) {
		rt := routes[int(which)%len(routes)]
		lease, node, model := l.ID, jr.NodeID, "m"
		if id != "" {
			lease, node, model = url.PathEscape(id), url.PathEscape(id), url.PathEscape(id)
		}
		path := rt.path
		for k, v := range map[string]string{"{lease}": lease, "{node}": node, "{model}": model} {
			path = replaceAll(path, k, v)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		req := httptest.NewRequest(rt.method, "/", bytes.NewReader(body)).WithContext(rctx)
		req.URL.Path, req.URL.RawPath = "", ""
		u, err := url.Parse(path)
		if err != nil {
			return
		}
		req.URL = u
		req.RequestURI = u.RequestURI()
		req.Header.Set("Authorization", "Bearer "+rt.tok)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		// Keep the cluster as it was for the next input: the node
		// lending, the lease created released, the node's credential the
		// one a join of it gave.
		switch {
		case rt.path == "/v1/leases" && rec.Code == http.StatusCreated:
			var nl api.Lease
			if json.Unmarshal(rec.Body.Bytes(), &nl) == nil && nl.ID != l.ID {
				call(http.MethodPost, "/v1/leases/"+url.PathEscape(nl.ID)+"/release", aliceTok, nil)
			}
		case rt.path == "/v1/join" && rec.Code == http.StatusOK:
			var again api.JoinResponse
			if json.Unmarshal(rec.Body.Bytes(), &again) == nil && again.NodeID == jr.NodeID {
				jr.Credential = again.Credential
				routes[len(routes)-1].tok = again.Credential
			}
		case rt.path == "/v1/nodes/{node}/drain" || rt.path == "/v1/nodes/{node}/cordon":
			call(http.MethodPost, "/v1/nodes/"+url.PathEscape(jr.NodeID)+"/uncordon", adminTok, nil)
		}
		if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %s answered %d: %s", rt.method, path, rec.Code, rec.Body)
		}
		if rec.Code >= 400 {
			var eb api.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error.Code == "" || eb.Error.Message == "" {
				t.Fatalf("%s %s answered %d without an error body: %s", rt.method, path, rec.Code, rec.Body)
			}
		}
	})
}

func replaceAll(s, old, new string) string {
	return string(bytes.ReplaceAll([]byte(s), []byte(old), []byte(new)))
}

// sqliteHandler is a control plane on a fresh SQLite store (a fake
// lender, the bootstrap token, alice's and the admin's tokens) served
// in process as h: call sends it one request as tok.
func sqliteHandler(ctx context.Context, tb testing.TB) (h http.Handler, call func(method, path, tok string, body []byte) *httptest.ResponseRecorder) {
	tb.Helper()
	st, err := sqlite.Open(ctx, filepath.Join(tb.TempDir(), "rialto.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	srv, err := New(ctx, Config{Store: st, Clock: clock.NewFakeNow(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), Lender: newFakeLender(),
		BootstrapToken: bootTok, PrepareTimeout: 200 * time.Millisecond,
		Tokens: []Token{{Token: aliceTok, Tenant: "alice"}, {Token: adminTok, Tenant: "ops", Admin: true}}})
	if err != nil {
		tb.Fatal(err)
	}
	h = srv.Handler()
	return h, func(method, path, tok string, body []byte) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, bytes.NewReader(body)).WithContext(ctx)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
}
