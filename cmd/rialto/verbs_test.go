package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// fakeAPI answers the few calls the verbs make.
func fakeAPI(t *testing.T) *httptest.Server {
	now := time.Now()
	lease := api.Lease{ID: "lease-1", State: api.LeaseActive, Kind: api.KindBlock, Mode: api.ModeDedicated, Size: 256 << 20, Count: 1,
		NodeID: "node-1", DeviceID: "dev-1", URI: "nbd://127.0.0.1:1/x", ExpiresAt: now.Add(time.Hour), CreatedAt: now,
		Parts: []api.Part{{NodeID: "node-1", DeviceID: "dev-1", Length: 256 << 20}}}
	mux := http.NewServeMux()
	reply := func(v any) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer tok" {
				w.WriteHeader(401)
				json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorInfo{Code: api.CodeUnauthorized, Message: "missing or unknown API token"}})
				return
			}
			json.NewEncoder(w).Encode(v)
		}
	}
	mux.HandleFunc("GET /v1/nodes", reply([]api.Node{{ID: "node-1", Name: "n1", State: api.NodeReady, LastHeartbeat: now}}))
	mux.HandleFunc("GET /v1/devices", reply([]api.Device{{ID: "dev-1", NodeID: "node-1", Name: "disk0", Kind: api.KindBlock, State: "available", Capacity: 1 << 30}}))
	mux.HandleFunc("GET /v1/topology", reply(api.Topology{Nodes: []api.Node{{ID: "node-1", Name: "n1", State: api.NodeReady}},
		Links: []api.Link{{ID: "l1", From: "node-1", To: "controlplane", RTTMicros: 42, BandwidthBps: 1_250_000_000, Status: "up", State: "up"}}}))
	mux.HandleFunc("GET /v1/leases", reply([]api.Lease{lease}))
	shown := lease // lease show gets the plan's explanation
	shown.Plan = &api.Plan{State: "feasible", Mode: lease.Mode, Parts: lease.Parts, Explanation: []string{"least loaded lender"}}
	mux.HandleFunc("GET /v1/leases/lease-1", reply(shown))
	mux.HandleFunc("POST /v1/leases", func(w http.ResponseWriter, r *http.Request) {
		var req api.LeaseRequest
		json.NewDecoder(r.Body).Decode(&req)
		if req.Size != 256<<20 || req.TTLSeconds != 600 || req.Kind != api.KindBlock || r.Header.Get("Idempotency-Key") != "k1" {
			w.WriteHeader(400)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorInfo{Code: api.CodeInvalid, Message: "unexpected request"}})
			return
		}
		json.NewEncoder(w).Encode(lease)
	})
	mux.HandleFunc("POST /v1/leases/lease-1/release", reply(api.Lease{ID: "lease-1", State: api.LeaseReleased}))
	// A nic request is predicted its rate; a slowed nic lease's rates are
	// bytes/s in the API, as every rate.
	mux.HandleFunc("POST /v1/explain", func(w http.ResponseWriter, r *http.Request) {
		var req api.LeaseRequest
		json.NewDecoder(r.Body).Decode(&req)
		p := api.Plan{State: "feasible", Mode: api.ModeDedicated, Parts: lease.Parts, PredictedBandwidth: 477e6,
			Impacts:     []api.Impact{{LeaseID: "lease-0", BandwidthBefore: 2e9, BandwidthAfter: 1e9}},
			Explanation: []string{"fewest hops", "chose dedicated node-1/dev-1: predicted 477MB/s"}}
		if req.Kind == api.KindNIC {
			p.PredictedBandwidth = req.Bandwidth
			p.Impacts = append(p.Impacts, api.Impact{LeaseID: "lease-9", Kind: api.KindNIC, BandwidthBefore: 62.5e6, BandwidthAfter: 50e6})
		}
		json.NewEncoder(w).Encode(p)
	})
	mux.HandleFunc("GET /v1/events", reply([]api.Event{{ID: 1, Type: "node.joined", Subject: "node-1", State: "ready"}}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func runCLI(t *testing.T, addr string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string {
		switch k {
		case "RIALTO_ADDR":
			return addr
		case "RIALTO_TOKEN":
			return "tok"
		}
		return ""
	}}
	code := run(context.Background(), args, e)
	return out.String(), errb.String(), code
}

func TestVerbsJSONCarryIDAndState(t *testing.T) {
	srv := fakeAPI(t)
	for _, args := range [][]string{
		{"nodes", "-o", "json"},
		{"devices", "-o", "json"},
		{"topology", "-o", "json"},
		{"leases", "-o", "json"},
		{"lease", "show", "lease-1", "-o", "json"},
		{"lease", "show", "-o", "json", "lease-1"},
		{"lease", "create", "--kind", "block", "--size", "256MiB", "--ttl", "10m", "--idempotency-key", "k1", "-o", "json"},
		{"lease", "release", "lease-1", "-o", "json"},
		{"explain", "--size", "256MiB", "-o", "json"},
		{"lease", "create", "--dry-run", "--size", "1GiB", "-o", "json"},
		{"events", "-o", "json"},
		{"version", "-o", "json"},
	} {
		out, errs, code := runCLI(t, srv.URL, args...)
		if code != 0 {
			t.Errorf("%v: exit %d: %s", args, code, errs)
			continue
		}
		var v any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Errorf("%v: not JSON: %v\n%s", args, err, out)
			continue
		}
		objs, ok := v.([]any)
		if !ok {
			objs = []any{v}
		}
		for _, o := range objs {
			m, _ := o.(map[string]any)
			if m["id"] == nil || m["id"] == "" || m["state"] == nil || m["state"] == "" {
				t.Errorf("%v: object without id/state: %v", args, o)
			}
		}
	}
}

func TestVerbsTables(t *testing.T) {
	srv := fakeAPI(t)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"nodes"}, []string{"ID", "NAME", "STATE", "node-1", "ready"}},
		{[]string{"devices"}, []string{"disk0", "n1", "1GiB"}},
		// A link's bandwidth prints as every rate (decimal: 10Gbit/s is
		// 1.25GB/s, not 1.164GiB/s).
		{[]string{"topology"}, []string{"controlplane", "42µs", "  1.25GB/s  "}},
		{[]string{"leases"}, []string{"lease-1", "active", "256MiB"}},
		{[]string{"lease", "show", "lease-1"}, []string{"URI:", "nbd://", "PART", "Why:", "least loaded lender"}},
		// The summary's rate reads as the reasons' (resource.FormatRate:
		// decimal, as --bandwidth 477MB/s reads it).
		// A slowed lease that declared no work has no completion time: "-".
		{[]string{"explain", "--size", "1GiB"}, []string{"feasible", "fewest hops", "Predicted bandwidth:  477MB/s\n",
			"lease-0      2GB/s             1GB/s  -                  -"}},
		// A nic request's rate, and a nic lease's, are link rates, as a
		// nic lease's size (resource.FormatLinkRate); other leases' rates
		// are bytes/s.
		{[]string{"explain", "--kind", "nic", "--bandwidth", "500Mbit/s"}, []string{"Predicted bandwidth:  500Mbit/s\n",
			"lease-0      2GB/s             1GB/s      -                  -", "lease-9      500Mbit/s         400Mbit/s  -                  -"}},
		{[]string{"events"}, []string{"node.joined"}},
	} {
		out, errs, code := runCLI(t, srv.URL, tc.args...)
		if code != 0 {
			t.Errorf("%v: exit %d: %s", tc.args, code, errs)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out)
			}
		}
	}
}

func TestVerbErrors(t *testing.T) {
	srv := fakeAPI(t)
	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(tlsSrv.Close)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"nodes", "--token-file", secretFileOf(t, "bad")}, 1, "missing or unknown API token (code unauthorized, HTTP 401); the CLI sends the token in RIALTO_TOKEN or in the file of --token-file"},
		// Nothing listens at --addr (RIALTO_ADDR not set in this shell).
		{[]string{"nodes", "--addr", closedAddr(t)}, 1, "connection refused; is a control plane listening there? Set --addr or RIALTO_ADDR"},
		// http:// for an HTTPS control plane.
		// Go's answer is not the API's: its code is its status's, not
		// internal (a server's failure).
		{[]string{"nodes", "--addr", strings.Replace(tlsSrv.URL, "https://", "http://", 1)}, 1, "Client sent an HTTP request to an HTTPS server. (code invalid_request, HTTP 400); the control plane serves HTTPS: write --addr (RIALTO_ADDR) with https://"},
		{[]string{"nodes", "--token", "bad"}, 2, "--token puts a secret on the command line"},
		{[]string{"lease", "create", "--size", "lots"}, 2, `invalid argument "lots" for "--size"`},
		{[]string{"lease", "create", "--kind", "floppy"}, 2, "unknown kind (block, memory, accel, nic)"},
		{[]string{"lease", "create", "--ttl", "soon"}, 2, `invalid argument "soon" for "--ttl"`},
		{[]string{"lease", "create", "--size", "1G", "--ttl", "10m"}, 1, "unexpected request"},
		{[]string{"lease", "show"}, 2, "wrong number of arguments"},
		{[]string{"nodes", "-o", "xml"}, 2, "want table, json, yaml or template"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"lease"}, 2, "needs a verb (create, move, release, renew, show)"},
		{[]string{"lease", "frob"}, 2, `unknown command "lease frob"`},
		{[]string{"nodes", "--nope"}, 2, "unknown flag: --nope"},
		{[]string{"server", "--tls-psk-file=keys.psk"}, 2, "`rialto agent --tls-psk FILE`"},
		{[]string{"agent", "--bootstrap-token-file", secretFileOf(t, "x"), "--cacert", "ca.pem", "--tls-psk", pskFileOf(t, 0o644)}, 1, "mode 0644 lets group or others in: chmod 600 it"},
		{[]string{"agent", "--bootstrap-token-file", secretFileOf(t, "x"), "--cacert", "ca.pem", "--tls-psk", filepath.Join(t.TempDir(), "none.psk")}, 1, "--tls-psk: tlspsk: open"},
		{[]string{"agent", "--bootstrap-token-file", secretFileOf(t, "x"), "--insecure-dataplane", "--tls-psk", pskFileOf(t, 0o600)}, 2, "--tls-psk needs TLS on the data planes"},
	} {
		_, errs, code := runCLI(t, srv.URL, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}

// closedAddr is an https:// URL where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "https://" + addr
}

// pskFileOf writes a key file in psktool's format with mode perm.
func pskFileOf(t *testing.T, perm os.FileMode) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "keys.psk")
	if err := os.WriteFile(f, []byte("alice:0123456789abcdef0123456789abcdef\n"), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, perm); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestParseBlock(t *testing.T) {
	for _, tc := range []struct {
		in         string
		name, path string
		size       int64
		bad        bool
	}{
		{"a.img:1GiB", "disk3", "a.img", 1 << 30, false},
		{"fast=/dev/nvme0n1", "fast", "/dev/nvme0n1", 0, false},
		{"x=b.img:2M", "x", "b.img", 2 << 20, false},
		{"b.img:zz", "", "", 0, true},
		{"=b.img", "", "", 0, true},
	} {
		d, err := parseBlock(tc.in, 3)
		if (err != nil) != tc.bad || (!tc.bad && (d.Name != tc.name || d.Path != tc.path || d.Size != tc.size)) {
			t.Errorf("parseBlock(%q) = %+v, %v", tc.in, d, err)
		}
	}
}
