package redfish_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/controlplane/redfish"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
)

// lender is a control plane Lender that confirms every export at once (the
// facade is tested here; real agents in cmd/rialto's test).
type lender struct{}

func (lender) Prepare(ctx context.Context, n api.Node, key string, req api.PrepareRequest) (api.PrepareResponse, error) {
	return api.PrepareResponse{URI: "nbd://" + n.Address + ":10809/" + req.Export}, nil
}

func (lender) Teardown(ctx context.Context, n api.Node, key string, req api.TeardownRequest) error {
	return nil
}

const (
	boot  = "boot-token"
	alice = "alice-token"
	bob   = "bob-token"
	admin = "admin-token"
)

type env struct {
	t   *testing.T
	url string
	v1  map[string]*api.Client // by token
	dev map[string]api.Device  // by node/name
}

// newEnv runs a control plane with two nodes of two disks (256 MiB), a
// memory device and an accelerator each.
func newEnv(t *testing.T) *env {
	t.Helper()
	srv := newServer(t)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	t.Cleanup(srv.CloseStreams)
	e := &env{t: t, url: ts.URL, v1: map[string]*api.Client{}, dev: map[string]api.Device{}}
	for _, tok := range []string{boot, alice, bob, admin} {
		e.v1[tok] = api.NewClient(ts.URL, tok, nil)
	}
	for _, n := range []string{"n1", "n2"} {
		_, err := e.v1[boot].Join(e.ctx(), api.JoinRequest{Name: n, Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1",
			Fingerprint: api.Fingerprint{MachineID: "m-" + n, Hostname: n, Cores: 4, MemoryBytes: 8 << 30},
			Devices: []api.DeviceSpec{
				{Name: "disk0", Kind: api.KindBlock, Capacity: 256 << 20, Sharing: "partitionable"},
				{Name: "disk1", Kind: api.KindBlock, Capacity: 256 << 20, Sharing: "partitionable"},
				{Name: "mem0", Kind: api.KindMemory, Capacity: 64 << 20, Sharing: "partitionable"},
				{Name: "accel0", Kind: api.KindAccel, Capacity: 2},
			}})
		if err != nil {
			t.Fatal(err)
		}
	}
	devs, err := e.v1[admin].Devices(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	nodes, _ := e.v1[admin].Nodes(e.ctx())
	names := map[string]string{}
	for _, n := range nodes {
		names[n.ID] = n.Name
	}
	for _, d := range devs {
		e.dev[names[d.NodeID]+"/"+d.Name] = d
	}
	return e
}

// newServer runs a control plane on SQLite with the tokens of boot,
// alice, bob and admin, and no nodes.
func newServer(t *testing.T) *controlplane.Server {
	t.Helper()
	dir, err := os.MkdirTemp("", "redfish-test-") // t.TempDir has '#' in fuzz seeds
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv, err := controlplane.New(context.Background(), controlplane.Config{Store: st, Lender: lender{}, BootstrapToken: boot,
		Tokens: []controlplane.Token{{Token: alice, Tenant: "alice"}, {Token: bob, Tenant: "bob"}, {Token: admin, Tenant: "ops", Admin: true}}})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// do sends a Redfish request with Basic auth (password: token) unless
// hdr sets other credentials; it returns the status, headers and body.
// ctx is the test's context, cancelled when the test ends.
func (e *env) ctx() context.Context { return e.t.Context() }

func (e *env) do(method, path, token string, body any, hdr ...string) (int, http.Header, map[string]any) {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.SetBasicAuth("user", token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(b) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(b, &out); err != nil {
			e.t.Fatalf("%s %s: %v\n%s", method, path, err, b)
		}
	}
	return resp.StatusCode, resp.Header, out
}

// postRaw posts body, as it is (a fuzzer's: JSON or not), to path with
// token (none: "") as basic auth, and returns the answer's status and
// body, which must be JSON whatever the status.
func (e *env) postRaw(path, token, body string) (int, map[string]any) {
	e.t.Helper()
	req, _ := http.NewRequest("POST", e.url+path, strings.NewReader(body))
	if token != "" {
		req.SetBasicAuth("a", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		e.t.Fatalf("%d answer is not JSON: %v", resp.StatusCode, err)
	}
	return resp.StatusCode, out
}

func (e *env) block(name string) map[string]any {
	return map[string]any{"@odata.id": "/redfish/v1/CompositionService/ResourceBlocks/" + e.dev[name].ID}
}

// redfishError checks a Redfish error body and returns its MessageId.
func redfishError(t *testing.T, body map[string]any) string {
	t.Helper()
	er, _ := body["error"].(map[string]any)
	info, _ := er["@Message.ExtendedInfo"].([]any)
	if er == nil || len(info) == 0 || er["message"] == "" {
		t.Fatalf("not a Redfish error: %v", body)
	}
	return info[0].(map[string]any)["MessageId"].(string)
}

func members(o map[string]any) []string {
	var out []string
	ms, _ := o["Members"].([]any)
	for _, m := range ms {
		out = append(out, m.(map[string]any)["@odata.id"].(string))
	}
	return out
}

// Who may read what: the service root, $metadata and odata without
// credentials; everything else with a tenant token (Basic, session or
// bearer) or node credential; wrong credentials get Redfish errors.
func TestAuth(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"/redfish", "/redfish/v1", "/redfish/v1/", "/redfish/v1/odata", "/redfish/v1/$metadata"} {
		if st, _, _ := e.do("GET", p, "", nil); st != 200 {
			t.Errorf("GET %s without credentials: %d", p, st)
		}
	}
	for _, tc := range []struct {
		name, token string
		hdr         []string
		status      int
		id          string
	}{
		{"none", "", nil, 401, "Base.1.18.NoValidSession"},
		{"unknown token", "nope", nil, 401, "Base.1.18.NoValidSession"},
		{"bootstrap token", boot, nil, 403, "Base.1.18.InsufficientPrivilege"},
		{"stale session", "", []string{"X-Auth-Token", "rfs_123"}, 401, "Base.1.18.NoValidSession"},
		{"bearer", "", []string{"Authorization", "Bearer " + alice}, 200, ""},
		{"basic", alice, nil, 200, ""},
	} {
		st, h, body := e.do("GET", "/redfish/v1/Systems", tc.token, nil, tc.hdr...)
		if st != tc.status {
			t.Errorf("%s: status %d, want %d", tc.name, st, tc.status)
			continue
		}
		if tc.id != "" {
			if id := redfishError(t, body); id != tc.id {
				t.Errorf("%s: MessageId %s, want %s", tc.name, id, tc.id)
			}
		} else if h.Get("OData-Version") != "4.0" || h.Get("ETag") == "" {
			t.Errorf("%s: headers %v", tc.name, h)
		}
	}
	// Sessions: log in with the token as the password, use the session,
	// log out; the session then stops working.
	st, h, body := e.do("POST", "/redfish/v1/SessionService/Sessions", "", map[string]string{"UserName": "alice", "Password": alice})
	tok, loc := h.Get("X-Auth-Token"), h.Get("Location")
	if st != 201 || tok == "" || loc == "" || body["Password"] != nil || strings.Contains(fmt.Sprint(body), alice) {
		t.Fatalf("login: %d %v %v", st, h, body)
	}
	if st, _, _ := e.do("POST", "/redfish/v1/SessionService/Sessions", "", map[string]string{"UserName": "x", "Password": "bad"}); st != 401 {
		t.Errorf("login with a bad token: %d", st)
	}
	if st, _, body := e.do("GET", "/redfish/v1/SessionService/Sessions", "", nil, "X-Auth-Token", tok); st != 200 || len(members(body)) != 1 {
		t.Fatalf("sessions with the session: %d %v", st, body)
	}
	if st, _, body := e.do("GET", "/redfish/v1/SessionService/Sessions", bob, nil); st != 200 || len(members(body)) != 0 {
		t.Errorf("bob sees alice's session: %v", body)
	}
	if st, _, _ := e.do("DELETE", loc, "", nil, "X-Auth-Token", tok); st != 204 {
		t.Fatalf("logout: %d", st)
	}
	if st, _, _ := e.do("GET", "/redfish/v1/Systems", "", nil, "X-Auth-Token", tok); st != 401 {
		t.Errorf("session after logout: %d", st)
	}
}

// Specific composition pins the lease to the named blocks; constrained
// composition lets placement choose; DELETE releases; tenants see only
// their own systems.
func TestComposeDecompose(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name  string
		body  map[string]any
		kind  api.Kind
		mode  api.Mode
		parts int
		pins  []string
		size  int64
	}{
		{"specific one block", map[string]any{"Name": "one", "Links": map[string]any{"ResourceBlocks": []any{e.block("n1/disk0")}}},
			api.KindBlock, api.ModeDedicated, 1, []string{"n1/disk0"}, 256 << 20},
		{"specific three blocks", map[string]any{"Name": "three", "Links": map[string]any{"ResourceBlocks": []any{e.block("n1/disk1"), e.block("n2/disk0"), e.block("n2/disk1")}}},
			api.KindBlock, api.ModeComposed, 3, []string{"n1/disk1", "n2/disk0", "n2/disk1"}, 3 * (256 << 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, h, sys := e.do("POST", "/redfish/v1/Systems", alice, tc.body)
			if st != 201 || sys["SystemType"] != "Composed" || h.Get("Location") != sys["@odata.id"] {
				t.Fatalf("compose: %d %v %v", st, h, sys)
			}
			id := sys["Id"].(string)
			l, err := e.v1[alice].Lease(e.ctx(), id)
			if err != nil {
				t.Fatal(err)
			}
			if l.Kind != tc.kind || l.Mode != tc.mode || len(l.Parts) != tc.parts || l.Borrower != tc.body["Name"] {
				t.Fatalf("lease %+v", l)
			}
			var size int64
			var on []string
			for _, p := range l.Parts {
				size += p.Length
				on = append(on, p.DeviceID)
			}
			for _, pin := range tc.pins {
				if !contains(on, e.dev[pin].ID) {
					t.Errorf("no part on %s (%s): parts on %v", pin, e.dev[pin].ID, on)
				}
			}
			if size != tc.size {
				t.Errorf("parts hold %d bytes, want %d", size, tc.size)
			}
			_, _, vol := e.do("GET", "/redfish/v1/Systems/"+id+"/Storage/1/Volumes/1", alice, nil)
			if vol["CapacityBytes"] != float64(tc.size) {
				t.Errorf("volume %v", vol)
			}
			oem := vol["Oem"].(map[string]any)["Rialto"].(map[string]any)
			if uris := oem["PartURIs"].([]any); len(uris) != tc.parts || !strings.HasPrefix(uris[0].(string), "nbd://") {
				t.Errorf("volume's URIs %v", oem)
			}
			// bob sees neither the system nor its URIs, and cannot delete it.
			if st, _, _ := e.do("GET", "/redfish/v1/Systems/"+id, bob, nil); st != 404 {
				t.Errorf("bob reads alice's system: %d", st)
			}
			if st, _, _ := e.do("DELETE", "/redfish/v1/Systems/"+id, bob, nil); st != 404 {
				t.Errorf("bob deletes alice's system: %d", st)
			}
			_, _, list := e.do("GET", "/redfish/v1/Systems", alice, nil)
			if !contains(members(list), sys["@odata.id"].(string)) {
				t.Errorf("system not listed: %v", members(list))
			}
			// A block composed whole is Composed; its system links back.
			_, _, rb := e.do("GET", tc.body["Links"].(map[string]any)["ResourceBlocks"].([]any)[0].(map[string]any)["@odata.id"].(string), alice, nil)
			if cs := rb["CompositionStatus"].(map[string]any)["CompositionState"]; cs != "Composed" {
				t.Errorf("block's state %v", cs)
			}
			// A stale If-Match is refused; DELETE releases.
			if st, _, _ := e.do("DELETE", "/redfish/v1/Systems/"+id, alice, nil, "If-Match", `W/"0000"`); st != 412 {
				t.Errorf("DELETE with a stale If-Match: %d", st)
			}
			_, h, _ = e.do("GET", "/redfish/v1/Systems/"+id, alice, nil)
			if st, _, _ := e.do("DELETE", "/redfish/v1/Systems/"+id, alice, nil, "If-Match", h.Get("ETag")); st != 204 {
				t.Fatalf("decompose: %d", st)
			}
			if l, _ := e.v1[alice].Lease(e.ctx(), id); l.State != api.LeaseReleased {
				t.Errorf("lease after DELETE is %s", l.State)
			}
			if st, _, _ := e.do("GET", "/redfish/v1/Systems/"+id, alice, nil); st != 404 {
				t.Errorf("decomposed system still served: %d", st)
			}
		})
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// Constrained composition maps capacities to a lease request; bad
// requests get Redfish errors naming the problem, placement's reason
// included.
func TestConstrained(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name   string
		body   string
		status int
		check  func(api.Lease) bool
		msg    string
	}{
		{"three drives", `{"Storage":[{"Drives":[{"CapacityBytes":33554432}],"@Redfish.RequestedCount":3}]}`, 201,
			func(l api.Lease) bool {
				return l.Kind == api.KindBlock && l.Mode == api.ModeComposed && l.Size == 3*32<<20 && len(l.Parts) == 3
			}, ""},
		{"simple storage", `{"SimpleStorage":{"Members":[{"Devices":[{"CapacityBytes":16777216}]}]}}`, 201,
			func(l api.Lease) bool { return l.Kind == api.KindBlock && l.Size == 16<<20 && len(l.Parts) == 1 }, ""},
		{"memory", `{"Memory":[{"CapacityMiB":8,"@Redfish.RequestedCount":2}]}`, 201,
			func(l api.Lease) bool { return l.Kind == api.KindMemory && l.Size == 16<<20 }, ""},
		{"accelerator", `{"Processors":{"Members":[{"ProcessorType":"Accelerator","Model":"echo"}]}}`, 201,
			func(l api.Lease) bool { return l.Kind == api.KindAccel && len(l.Parts) == 1 }, ""},
		{"oem ttl", `{"Memory":[{"CapacityMiB":4}],"Oem":{"Rialto":{"ttl_seconds":120}}}`, 201,
			func(l api.Lease) bool { return l.TTLSeconds == 120 }, ""},
		{"too big", `{"Storage":[{"Drives":[{"CapacityBytes":107374182400}]}]}`, 422, nil, "needs"},
		{"two kinds", `{"Memory":[{"CapacityMiB":8}],"Storage":[{"Drives":[{"CapacityBytes":1048576}]}]}`, 400, nil, "one kind"},
		{"nothing asked", `{"Name":"x"}`, 400, nil, "capacities"},
		{"apply time", `{"Memory":[{"CapacityMiB":8}],"@Redfish.OperationApplyTime":"OnReset"}`, 400, nil, "Immediate"},
		{"unknown block", `{"Links":{"ResourceBlocks":[{"@odata.id":"/redfish/v1/CompositionService/ResourceBlocks/nope"}]}}`, 400, nil, "no resource block"},
		{"bad oem", `{"Memory":[{"CapacityMiB":8}],"Oem":{"Rialto":{"colour":"red"}}}`, 400, nil, "Oem.Rialto"},
		{"not json", `{"Memory":`, 400, nil, "JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body any
			json.Unmarshal([]byte(tc.body), &body)
			req, _ := http.NewRequest("POST", e.url+"/redfish/v1/Systems", strings.NewReader(tc.body))
			req.SetBasicAuth("alice", alice)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var out map[string]any
			json.NewDecoder(resp.Body).Decode(&out)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %v", resp.StatusCode, tc.status, out)
			}
			if tc.check != nil {
				l, err := e.v1[alice].Lease(e.ctx(), out["Id"].(string))
				if err != nil || !tc.check(l) {
					t.Fatalf("lease %+v (%v)", l, err)
				}
				return
			}
			redfishError(t, out)
			if msg := out["error"].(map[string]any)["message"].(string); !strings.Contains(msg, tc.msg) {
				t.Errorf("message %q lacks %q", msg, tc.msg)
			}
		})
	}
}

// A composed system's volume and memory say what the lease holds (the
// API's held), not the size asked for: three drives of 10000000 bytes are
// three parts rounded up to the 1MiB stripe unit; 8MiB of memory
// dedicated is the 64MiB device.
func TestCapacityIsHeld(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		body, path, field string
		want              float64
	}{
		{`{"Storage":[{"Drives":[{"CapacityBytes":10000000}],"@Redfish.RequestedCount":3}]}`, "/Storage/1/Volumes/1", "CapacityBytes", 3 * 10 << 20},
		{`{"Memory":[{"CapacityMiB":8}],"Oem":{"Rialto":{"mode":"dedicated"}}}`, "/Memory/1", "CapacityMiB", 64},
	} {
		var body map[string]any
		if err := json.Unmarshal([]byte(tc.body), &body); err != nil {
			t.Fatal(err)
		}
		st, _, sys := e.do("POST", "/redfish/v1/Systems", alice, body)
		if st != 201 {
			t.Fatalf("%s: %d %v", tc.body, st, sys)
		}
		_, _, res := e.do("GET", sys["@odata.id"].(string)+tc.path, alice, nil)
		if res[tc.field] != tc.want {
			t.Errorf("%s: %s %v, want %v", tc.body, tc.field, res[tc.field], tc.want)
		}
	}
}

// The Compose action: Preview holds nothing, PreviewReserve holds the
// devices as a reservation (not a system) for ReservationDuration, Apply
// makes it a system; deleting a reservation frees its devices.
func TestComposeAction(t *testing.T) {
	e := newEnv(t)
	manifest := func(typ string) map[string]any {
		return map[string]any{"RequestFormat": "Manifest", "RequestType": typ, "Manifest": map[string]any{"Stanzas": []any{
			map[string]any{"StanzaType": "ComposeSystem", "StanzaId": "s1", "Request": map[string]any{"Name": "genomics",
				"Links": map[string]any{"ResourceBlocks": []any{e.block("n1/disk0"), e.block("n2/disk0")}}}}}}}
	}
	const action = "/redfish/v1/CompositionService/Actions/CompositionService.Compose"
	st, _, out := e.do("POST", action, alice, manifest("Preview"))
	if st != 200 {
		t.Fatalf("preview: %d %v", st, out)
	}
	if ls, _ := e.v1[alice].Leases(e.ctx()); len(ls) != 0 {
		t.Fatalf("preview made leases: %+v", ls)
	}
	resp := out["Manifest"].(map[string]any)["Stanzas"].([]any)[0].(map[string]any)["Response"].(map[string]any)
	if rbs := resp["Links"].(map[string]any)["ResourceBlocks"].([]any); len(rbs) != 2 {
		t.Fatalf("preview response %v", resp)
	}

	st, _, out = e.do("POST", action, alice, manifest("PreviewReserve"))
	rid, _ := out["ReservationId"].(string)
	if st != 200 || rid == "" {
		t.Fatalf("reserve: %d %v", st, out)
	}
	l, err := e.v1[alice].Lease(e.ctx(), rid)
	if err != nil || l.State != api.LeaseActive || l.TTLSeconds != 300 {
		t.Fatalf("reserved lease %+v %v", l, err)
	}
	_, _, systems := e.do("GET", "/redfish/v1/Systems", alice, nil)
	if contains(members(systems), "/redfish/v1/Systems/"+rid) {
		t.Error("a reservation is listed as a system")
	}
	_, _, rs := e.do("GET", "/redfish/v1/CompositionService/CompositionReservations", alice, nil)
	if !contains(members(rs), "/redfish/v1/CompositionService/CompositionReservations/"+rid) {
		t.Fatalf("reservations %v", rs)
	}
	if _, _, rs := e.do("GET", "/redfish/v1/CompositionService/CompositionReservations", bob, nil); len(members(rs)) != 0 {
		t.Errorf("bob sees alice's reservation: %v", rs)
	}
	// The reserved blocks are taken: a second reservation of them fails
	// with placement's reason.
	if st, _, out := e.do("POST", action, alice, manifest("PreviewReserve")); st != 409 || !strings.Contains(fmt.Sprint(out), "in use") {
		t.Errorf("second reservation: %d %v", st, out)
	}
	st, _, out = e.do("POST", action, alice, map[string]any{"RequestFormat": "Manifest", "RequestType": "Apply", "ReservationId": rid})
	if st != 200 {
		t.Fatalf("apply: %d %v", st, out)
	}
	if l, _ := e.v1[alice].Lease(e.ctx(), rid); l.TTLSeconds != 3600 {
		t.Errorf("applied lease's TTL %d, want the system TTL", l.TTLSeconds)
	}
	_, _, systems = e.do("GET", "/redfish/v1/Systems", alice, nil)
	if !contains(members(systems), "/redfish/v1/Systems/"+rid) {
		t.Error("applied reservation is not a system")
	}
	if st, _, _ := e.do("POST", action, alice, map[string]any{"RequestFormat": "Manifest", "RequestType": "Apply", "ReservationId": rid}); st != 404 {
		t.Errorf("applying twice: %d", st)
	}
	// Reserve again on the other disks and give the reservation back.
	m := manifest("PreviewReserve")
	m["Manifest"].(map[string]any)["Stanzas"].([]any)[0].(map[string]any)["Request"] = map[string]any{"Memory": []any{map[string]any{"CapacityMiB": 8}}}
	_, _, out = e.do("POST", action, alice, m)
	rid2 := out["ReservationId"].(string)
	if st, _, _ := e.do("DELETE", "/redfish/v1/CompositionService/CompositionReservations/"+rid2, alice, nil); st != 204 {
		t.Fatalf("delete reservation: %d", st)
	}
	if l, _ := e.v1[alice].Lease(e.ctx(), rid2); l.State != api.LeaseReleased {
		t.Errorf("deleted reservation's lease is %s", l.State)
	}
	for _, bad := range []map[string]any{
		{"RequestFormat": "Manifest", "RequestType": "Destroy"},
		{"RequestFormat": "Stanza", "RequestType": "Apply"},
		{"RequestFormat": "Manifest", "RequestType": "Apply"},
		{"RequestFormat": "Manifest", "RequestType": "Preview", "Extra": 1},
	} {
		if st, _, out := e.do("POST", action, alice, bad); st != 400 {
			t.Errorf("%v: %d %v", bad, st, out)
		}
	}
}

// Resources carry ETags; If-None-Match answers 304; a physical system
// cannot be deleted; unknown paths and methods get Redfish errors.
func TestProtocol(t *testing.T) {
	e := newEnv(t)
	_, h, _ := e.do("GET", "/redfish/v1/CompositionService", alice, nil)
	if st, _, _ := e.do("GET", "/redfish/v1/CompositionService", alice, nil, "If-None-Match", h.Get("ETag")); st != 304 {
		t.Errorf("If-None-Match: %d", st)
	}
	nodes, _ := e.v1[admin].Nodes(e.ctx())
	st, h, body := e.do("DELETE", "/redfish/v1/Systems/"+nodes[0].ID, alice, nil)
	if st != 405 || h.Get("Allow") == "" || redfishError(t, body) != "Base.1.18.ResourceCannotBeDeleted" {
		t.Errorf("DELETE a node's system: %d %v", st, body)
	}
	if st, _, body := e.do("GET", "/redfish/v1/Nope", alice, nil); st != 404 || redfishError(t, body) != "Base.1.18.ResourceNotFound" {
		t.Errorf("unknown path: %d", st)
	}
	if st, h, _ := e.do("PATCH", "/redfish/v1/CompositionService", alice, map[string]any{}); st != 405 || h.Get("Allow") == "" {
		t.Errorf("PATCH: %d", st)
	}
	if st, _, _ := e.do("GET", "/redfish/v1/Systems", alice, nil, "OData-Version", "5.0"); st != 412 {
		t.Errorf("OData-Version 5.0: %d", st)
	}
}

// Every @odata.type the service uses, and every schema $metadata
// references, is in DMTF's CSDL (../shared/data/redfish-csdl).
func TestSchemasExist(t *testing.T) {
	dir := csdlDir(t)
	e := newEnv(t)
	req, _ := http.NewRequest("GET", e.url+"/redfish/v1/$metadata", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	refs := regexp.MustCompile(`schemas/v1/(\w+_v1\.xml)">\s*<edmx:Include Namespace="(\w+)"(?: Alias="\w+")?/>(?:\s*<edmx:Include Namespace="([\w.]+)"/>)?`).FindAllStringSubmatch(string(b), -1)
	if len(refs) < 20 {
		t.Fatalf("$metadata has %d references:\n%s", len(refs), b)
	}
	for _, r := range refs {
		x, err := os.ReadFile(filepath.Join(dir, r[1]))
		if err != nil {
			t.Errorf("$metadata references %s: %v", r[1], err)
			continue
		}
		for _, ns := range r[2:] {
			if ns != "" && !strings.Contains(string(x), `Namespace="`+ns+`"`) {
				t.Errorf("%s has no namespace %s", r[1], ns)
			}
		}
	}
}

// csdlDir finds DMTF's CSDL schemas: $RIALTO_REDFISH_CSDL, else
// shared/data/redfish-csdl beside the repository (or beside its parent,
// for a worktree).
func csdlDir(t *testing.T) string {
	t.Helper()
	dirs := []string{os.Getenv("RIALTO_REDFISH_CSDL")}
	if root, err := filepath.Abs("../../.."); err == nil {
		dirs = append(dirs, filepath.Join(root, "..", "shared", "data", "redfish-csdl"), filepath.Join(root, "..", "..", "shared", "data", "redfish-csdl"))
	}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "ServiceRoot_v1.xml")); err == nil {
			return d
		}
	}
	t.Skipf("no Redfish CSDL schemas in %v (set RIALTO_REDFISH_CSDL)", dirs[1:])
	return ""
}

// EventService's SSE stream is the control plane's event stream in
// Redfish's Event format; it starts with the next event and resumes after
// Last-Event-ID. A tenant's stream lacks other tenants' leases.
func TestEventServiceSSE(t *testing.T) {
	e := newEnv(t)
	open := func(token string, hdr ...string) (*bufio.Reader, func()) {
		ctx, cancel := context.WithCancel(e.ctx())
		req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/redfish/v1/EventService/SSE", nil)
		req.SetBasicAuth("u", token)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("SSE: %d %v", resp.StatusCode, resp.Header)
		}
		return bufio.NewReader(resp.Body), func() { cancel(); resp.Body.Close() }
	}
	type got struct {
		id  string
		ev  map[string]any
		err error
	}
	next := func(br *bufio.Reader) got {
		ch := make(chan got, 1)
		go func() {
			var g got
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					g.err = err
					ch <- g
					return
				}
				line = strings.TrimSpace(line)
				if v, ok := strings.CutPrefix(line, "id: "); ok {
					g.id = v
				}
				if v, ok := strings.CutPrefix(line, "data: "); ok {
					g.err = json.Unmarshal([]byte(v), &g.ev)
					ch <- g
					return
				}
			}
		}()
		select {
		case g := <-ch:
			if g.err != nil {
				t.Fatal(g.err)
			}
			return g
		case <-time.After(10 * time.Second):
			t.Fatal("no SSE event within 10s")
		}
		return got{}
	}
	aliceSSE, closeAlice := open(alice)
	defer closeAlice()
	// Wait until the stream is live: an event appended now is delivered.
	lb, err := e.v1[bob].CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindMemory, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	la, err := e.v1[alice].CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindMemory, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var first got
	for first.ev == nil || !strings.Contains(fmt.Sprint(first.ev), la.ID) {
		first = next(aliceSSE)
		if strings.Contains(fmt.Sprint(first.ev), lb.ID) {
			t.Fatalf("alice's stream carries bob's lease: %v", first.ev)
		}
	}
	rec := first.ev["Events"].([]any)[0].(map[string]any)
	if first.ev["@odata.type"] != "#Event.v1_13_0.Event" || rec["EventId"] != first.id ||
		rec["OriginOfCondition"].(map[string]any)["@odata.id"] != "/redfish/v1/Systems/"+la.ID {
		t.Fatalf("event %v", first.ev)
	}
	// Resume: a new connection with Last-Event-ID gets what came after.
	closeAlice()
	if _, err := e.v1[alice].ReleaseLease(e.ctx(), la.ID); err != nil {
		t.Fatal(err)
	}
	again, closeAgain := open(alice, "Last-Event-ID", first.id)
	defer closeAgain()
	g := next(again)
	var prev int
	fmt.Sscan(first.id, &prev)
	var cur int
	fmt.Sscan(g.id, &cur)
	if cur <= prev || !strings.Contains(fmt.Sprint(g.ev), la.ID) {
		t.Fatalf("after Last-Event-ID %s: %s %v", first.id, g.id, g.ev)
	}
}

// TestEventServiceSSEPlainRefusal: an answer to the facade's event
// stream call whose body is not the API's (something between the facade
// and the /v1 routes: a store-unavailable page, a router's 404) is a
// Redfish error of the message its status means, not InternalError.
func TestEventServiceSSEPlainRefusal(t *testing.T) {
	srv := newServer(t)
	t.Cleanup(srv.CloseStreams)
	for _, tc := range []struct {
		status int
		body   string
		id     string
	}{
		{http.StatusServiceUnavailable, "store unavailable", "Base.1.18.ServiceTemporarilyUnavailable"},
		{http.StatusNotFound, "404 page not found", "Base.1.18.ResourceNotFound"},
		{http.StatusForbidden, "denied by the proxy", "Base.1.18.InsufficientPrivilege"},
	} {
		// The /v1 routes, but the stream answered in plain words.
		v1 := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/events" && r.URL.Query().Get("follow") == "1" {
				http.Error(w, tc.body, tc.status)
				return
			}
			srv.Handler().ServeHTTP(w, r)
		})
		rf, err := redfish.New(redfish.Config{API: v1})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(rf)
		e := &env{t: t, url: ts.URL}
		st, _, body := e.do("GET", "/redfish/v1/EventService/SSE", alice, nil)
		ts.Close()
		if st != tc.status {
			t.Errorf("plain %d: status %d", tc.status, st)
			continue
		}
		if id := redfishError(t, body); id != tc.id {
			t.Errorf("plain %d: MessageId %s, want %s", tc.status, id, tc.id)
		}
		if msg := body["error"].(map[string]any)["message"]; msg != tc.body {
			t.Errorf("plain %d: message %q, want the answer's %q", tc.status, msg, tc.body)
		}
	}
}

// FuzzSystemRequest: any compose body gets an answer (201 or a Redfish
// error), never a crash.
func FuzzSystemRequest(f *testing.F) {
	for _, s := range []string{
		`{"Storage":[{"Drives":[{"CapacityBytes":1048576}],"@Redfish.RequestedCount":3}]}`,
		`{"Memory":[{"CapacityMiB":1}]}`,
		`{"Links":{"ResourceBlocks":[{"@odata.id":"/redfish/v1/CompositionService/ResourceZones/block"}]},"SimpleStorage":{"Members":[{"Devices":[{"CapacityBytes":1}]}]}}`,
		`{"Processors":[{"ProcessorType":"FPGA","@Redfish.RequestedCount":-1}]}`,
		`{"Oem":{"Rialto":{"mode":"shared"}},"Memory":[{"CapacityMiB":1e30}]}`,
		`[]`, `null`, `{"Links":7}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		e := newEnv(t)
		status, out := e.postRaw("/redfish/v1/Systems", admin, body)
		switch {
		case status == 201:
			if _, err := e.v1[admin].ReleaseLease(e.ctx(), out["Id"].(string)); err != nil {
				t.Fatal(err)
			}
		case status >= 500:
			t.Fatalf("%d for %q: %v", status, body, out)
		default:
			redfishError(t, out)
		}
	})
}
