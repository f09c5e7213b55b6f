package controlplane

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

func TestLivenessAndRejoin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j1, n1 := e.join("n1", 1<<30)
	j2, n2 := e.join("n2", 1<<30)
	on1, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Affinity: []string{j1.NodeID}})
	if err != nil || on1.NodeID != j1.NodeID {
		t.Fatalf("%v %+v", err, on1)
	}
	comp, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 2 << 20, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	on2, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Affinity: []string{j2.NodeID}})
	if err != nil || on2.NodeID != j2.NodeID {
		t.Fatalf("%v %+v", err, on2)
	}
	state := func(id string) api.NodeState {
		n, err := e.alice.Node(e.ctx(), id)
		if err != nil {
			t.Fatal(err)
		}
		return n.State
	}
	beat := func(c *api.Client, id string, leases ...string) api.HeartbeatResponse {
		r, err := c.Heartbeat(e.ctx(), id, api.Heartbeat{Health: "ok", Leases: leases, Links: []api.LinkReport{{To: "controlplane", RTTMicros: 50, Up: true}}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Silence shorter than SuspectAfter changes nothing.
	e.clock.Advance(2 * time.Second)
	beat(n2, j2.NodeID)
	e.srv.Sweep(e.ctx())
	if state(j1.NodeID) != api.NodeReady {
		t.Fatal("suspect too early")
	}
	e.clock.Advance(2 * time.Second) // n1 silent 4s, n2 2s
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if state(j1.NodeID) != api.NodeSuspect || state(j2.NodeID) != api.NodeReady {
		t.Fatalf("states %s %s", state(j1.NodeID), state(j2.NodeID))
	}
	got, _ := e.alice.Lease(e.ctx(), on1.ID)
	if got.State != api.LeaseActive {
		t.Fatal("suspect node's lease changed")
	}
	e.clock.Advance(7 * time.Second) // n1 silent 11s > DownAfter
	beat(n2, j2.NodeID)
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if state(j1.NodeID) != api.NodeDown || state(j2.NodeID) != api.NodeReady {
		t.Fatalf("states %s %s", state(j1.NodeID), state(j2.NodeID))
	}
	for _, id := range []string{on1.ID, comp.ID} {
		got, _ := e.alice.Lease(e.ctx(), id)
		if got.State != api.LeaseLost || !strings.Contains(got.Reason, "down") {
			t.Fatalf("lease %s: %+v", id, got)
		}
	}
	if got, _ := e.alice.Lease(e.ctx(), on2.ID); got.State != api.LeaseActive {
		t.Fatalf("healthy node's lease: %+v", got)
	}
	// The composed lease's surviving lender was told to tear down.
	if !slices.Contains(e.lender.tornDown(), j2.NodeID+"/"+comp.ID) {
		t.Fatalf("surviving part not torn down: %v", e.lender.tornDown())
	}
	// Lost leases freed their capacity.
	devs, _ := e.admin.Devices(e.ctx())
	for _, d := range devs {
		if d.NodeID == j1.NodeID && d.Allocated != 0 {
			t.Fatalf("down node still allocated: %+v", d)
		}
	}
	// New leases avoid the down node; affinity to it alone is infeasible.
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil || l.NodeID != j2.NodeID {
		t.Fatalf("%v %+v", err, l)
	}
	if _, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Affinity: []string{j1.NodeID}}); !api.IsCode(err, api.CodeInfeasible) {
		t.Fatalf("affinity to a down node: %v", err)
	}
	// Rejoin: same machine ID keeps its node ID and devices; the old
	// credential stops working; the heartbeat says what to tear down.
	req := api.JoinRequest{Name: "n1-renamed", Address: "127.0.0.1", AgentURL: "http://127.0.0.1:2",
		Fingerprint: api.Fingerprint{MachineID: "mid-n1", Hostname: "n1"},
		Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 2 << 30}, {Name: "disk9", Kind: api.KindBlock, Capacity: 1 << 30}}}
	oldDevs := map[string]string{}
	for _, d := range devs {
		if d.NodeID == j1.NodeID {
			oldDevs[d.Name] = d.ID
		}
	}
	rj, err := e.boot.Join(e.ctx(), req)
	if err != nil || rj.NodeID != j1.NodeID || rj.Credential == j1.Credential {
		t.Fatalf("rejoin: %v %+v", err, rj)
	}
	if _, err := n1.Heartbeat(e.ctx(), j1.NodeID, api.Heartbeat{}); !api.IsCode(err, api.CodeUnauthorized) {
		t.Fatalf("old credential: %v", err)
	}
	n1 = e.boot.WithToken(rj.Credential)
	r := beat(n1, j1.NodeID, on1.ID, comp.ID, "lease-unknown")
	slices.Sort(r.Teardown)
	want := []string{comp.ID, on1.ID, "lease-unknown"}
	slices.Sort(want)
	if !slices.Equal(r.Teardown, want) {
		t.Fatalf("teardown %v, want %v", r.Teardown, want)
	}
	if r2 := beat(n2, j2.NodeID, on2.ID); len(r2.Teardown) != 0 || len(r2.Peers) != 1 || r2.Peers[0].ID != j1.NodeID {
		t.Fatalf("healthy node told %+v", r2)
	}
	devs, _ = e.admin.Devices(e.ctx())
	states := map[string]string{}
	for _, d := range devs {
		if d.NodeID == j1.NodeID {
			states[d.Name] = d.State
			if id, ok := oldDevs[d.Name]; ok && id != d.ID {
				t.Fatalf("device %s changed ID", d.Name)
			}
			if d.Name == "disk0" && d.Capacity != 2<<30 {
				t.Fatalf("capacity not updated: %+v", d)
			}
		}
	}
	if states["disk0"] != "available" || states["disk9"] != "available" || len(states) != 2 {
		t.Fatalf("devices after rejoin: %v", states)
	}
	if state(j1.NodeID) != api.NodeReady {
		t.Fatal("rejoined node not ready")
	}
	topo, err := e.alice.Topology(e.ctx())
	if err != nil || len(topo.Links) != 2 || topo.Links[0].To != "controlplane" || topo.Links[0].State != "up" {
		t.Fatalf("topology %v %+v", err, topo.Links)
	}
	evs, err := e.admin.Events(e.ctx(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	for _, want := range []string{"node.joined", "lease.reserved", "lease.active", "node.suspect", "node.down", "lease.lost"} {
		if !slices.Contains(types, want) {
			t.Errorf("no %s event in %v", want, types)
		}
	}
}

// TestAuth checks every refusal and that a refused request changes nothing.
func TestAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j1, n1 := e.join("n1", 1<<30)
	j2, _ := e.join("n2", 1<<30)
	mine, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	anon := e.alice.WithToken("")
	wrong := e.alice.WithToken("not-a-token")
	nodeTok := n1
	leaseReq := api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20}
	join := api.JoinRequest{Name: "x", Fingerprint: api.Fingerprint{MachineID: "x"}}
	before := stateDump(t, e)
	for _, c := range []struct {
		name   string
		client *api.Client
		method string
		path   string
		body   any
		code   string
	}{
		{"join without token", anon, "POST", "/v1/join", join, api.CodeUnauthorized},
		{"join with wrong token", wrong, "POST", "/v1/join", join, api.CodeUnauthorized},
		{"join with tenant token", e.alice, "POST", "/v1/join", join, api.CodeForbidden},
		{"join with node credential", nodeTok, "POST", "/v1/join", join, api.CodeForbidden},
		{"heartbeat without token", anon, "POST", "/v1/nodes/" + j1.NodeID + "/heartbeat", api.Heartbeat{}, api.CodeUnauthorized},
		{"heartbeat for another node", nodeTok, "POST", "/v1/nodes/" + j2.NodeID + "/heartbeat", api.Heartbeat{}, api.CodeForbidden},
		{"heartbeat with tenant token", e.alice, "POST", "/v1/nodes/" + j1.NodeID + "/heartbeat", api.Heartbeat{}, api.CodeForbidden},
		{"heartbeat with bootstrap token", e.boot, "POST", "/v1/nodes/" + j1.NodeID + "/heartbeat", api.Heartbeat{}, api.CodeForbidden},
		{"lease without token", anon, "POST", "/v1/leases", leaseReq, api.CodeUnauthorized},
		{"lease with wrong token", wrong, "POST", "/v1/leases", leaseReq, api.CodeUnauthorized},
		{"lease with bootstrap token", e.boot, "POST", "/v1/leases", leaseReq, api.CodeForbidden},
		{"lease with node credential", nodeTok, "POST", "/v1/leases", leaseReq, api.CodeForbidden},
		{"release another tenant's lease", e.bob, "POST", "/v1/leases/" + mine.ID + "/release", nil, api.CodeNotFound},
		{"renew another tenant's lease", e.bob, "POST", "/v1/leases/" + mine.ID + "/renew", api.RenewRequest{TTLSeconds: 5}, api.CodeNotFound},
		{"read another tenant's lease", e.bob, "GET", "/v1/leases/" + mine.ID, nil, api.CodeNotFound},
		{"list nodes without token", anon, "GET", "/v1/nodes", nil, api.CodeUnauthorized},
		{"list nodes with bootstrap token", e.boot, "GET", "/v1/nodes", nil, api.CodeForbidden},
		{"profile by a plain tenant", e.alice, "PUT", "/v1/profiles/m1", api.Profile{Model: "m1"}, api.CodeForbidden},
		{"bad scheme", e.alice.WithToken(""), "GET", "/v1/nodes", nil, api.CodeUnauthorized},
		{"unknown field", e.alice, "POST", "/v1/leases", map[string]any{"kind": "block", "size": 1, "colour": "red"}, api.CodeInvalid},
		{"wrong type", e.alice, "POST", "/v1/leases", map[string]any{"kind": "block", "size": "big"}, api.CodeInvalid},
		{"bad kind", e.alice, "POST", "/v1/leases", map[string]any{"kind": "gpu"}, api.CodeInvalid},
		{"negative size", e.alice, "POST", "/v1/leases", map[string]any{"kind": "block", "size": -1}, api.CodeInvalid},
		{"join without machine id", e.boot, "POST", "/v1/join", api.JoinRequest{Name: "x"}, api.CodeInvalid},
		{"join with bad device", e.boot, "POST", "/v1/join", api.JoinRequest{Name: "x", Fingerprint: api.Fingerprint{MachineID: "y"},
			Devices: []api.DeviceSpec{{Name: "d", Kind: "block", Capacity: -5}}}, api.CodeInvalid},
		{"unknown lease", e.alice, "GET", "/v1/leases/lease-nope", nil, api.CodeNotFound},
		{"unknown route", e.alice, "GET", "/v1/nope", nil, api.CodeNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.client.Do(e.ctx(), c.method, c.path, c.body, nil)
			if !api.IsCode(err, c.code) {
				t.Fatalf("got %v, want %s", err, c.code)
			}
			if strings.Contains(err.Error(), "secret-token") {
				t.Fatalf("error echoes a secret: %v", err)
			}
		})
	}
	if after := stateDump(t, e); after != before {
		t.Fatalf("refused requests changed state:\n%s\n%s", before, after)
	}
	// Tenants see only their own leases; admin sees all, without secrets.
	if _, err := e.bob.CreateLease(e.ctx(), leaseReq); err != nil {
		t.Fatal(err)
	}
	bl, _ := e.bob.Leases(e.ctx())
	al, _ := e.admin.Leases(e.ctx())
	if len(bl) != 1 || bl[0].Tenant != "bob" || len(al) != 2 {
		t.Fatalf("bob sees %d, admin %d", len(bl), len(al))
	}
	for _, l := range al {
		if l.Credential != "" || l.URI != "" || l.Parts[0].URI != "" {
			t.Fatalf("admin sees another tenant's secrets: %+v", l)
		}
	}
	// The admin can release anyone's lease.
	if _, err := e.admin.ReleaseLease(e.ctx(), mine.ID); err != nil {
		t.Fatal(err)
	}
}

// stateDump summarises the whole state that a refused request must not change.
func stateDump(t *testing.T, e *env) string {
	t.Helper()
	ls, _ := e.srv.st.Leases(e.ctx(), storeAll)
	nodes, _ := e.srv.st.Nodes(e.ctx())
	devs, _ := e.srv.st.Devices(e.ctx())
	evs, _ := e.srv.st.Events(e.ctx(), 0, 1000, "")
	b, _ := json.Marshal([]any{ls, nodes, devs, len(evs)})
	return string(b)
}

func TestOpenAPIAndMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	if _, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(e.ts.URL + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
		Comps   struct {
			Schemas map[string]any `json:"schemas"`
		} `json:"components"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, rt := range e.srv.routeTable() {
		if _, ok := doc.Paths[rt.Path][strings.ToLower(rt.Method)]; !ok {
			t.Errorf("openapi lacks %s %s", rt.Method, rt.Path)
		}
	}
	for _, s := range []string{"Lease", "LeaseRequest", "Node", "Plan", "ErrorBody", "JoinRequest", "Heartbeat"} {
		if _, ok := doc.Comps.Schemas[s]; !ok {
			t.Errorf("openapi lacks schema %s", s)
		}
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi version %q", doc.OpenAPI)
	}
	resp, err = http.Get(e.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`rialto_leases{state="active"} 1`, `rialto_nodes{state="ready"} 1`,
		`rialto_api_requests_total{code="201",route="POST /v1/leases"} 1`, `rialto_api_request_duration_seconds_bucket{route="POST /v1/join"`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	resp, err = http.Get(e.ts.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz %v %v", err, resp.Status)
	}
	resp.Body.Close()
}

// TestHeartbeatBatching sends many concurrent heartbeats (group commit)
// and checks every node's liveness was recorded.
func TestHeartbeatBatching(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	type agent struct {
		id string
		c  *api.Client
	}
	var agents []agent
	for i := 0; i < 40; i++ {
		j, c := e.join("hb"+string(rune('a'+i%26))+string(rune('a'+i/26)), 1<<20)
		agents = append(agents, agent{j.NodeID, c})
	}
	e.clock.Advance(5 * time.Second)
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := a.c.Heartbeat(e.ctx(), a.id, api.Heartbeat{Health: "ok"}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	nodes, _ := e.alice.Nodes(e.ctx())
	for _, n := range nodes {
		if !n.LastHeartbeat.Equal(e.clock.Now()) {
			t.Fatalf("node %s last heartbeat %v, want %v", n.Name, n.LastHeartbeat, e.clock.Now())
		}
	}
	if _, err := agents[0].c.Heartbeat(e.ctx(), "node-nope", api.Heartbeat{}); !api.IsCode(err, api.CodeForbidden) {
		t.Fatalf("heartbeat for an unknown node: %v", err)
	}
}

// TestRestartGrace: after a control-plane restart, nodes get a full grace
// period before silence counts, and leases survive the restart.
func TestRestartGrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j, _ := e.join("n1", 1<<30)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour) // the control plane was down for an hour
	srv2, err := New(e.ctx(), Config{Store: e.srv.st, Clock: e.clock, Lender: e.lender, BootstrapToken: bootTok})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv2.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	n, _ := e.srv.st.Node(e.ctx(), j.NodeID)
	got, _ := e.srv.st.Lease(e.ctx(), l.ID)
	if n.State != api.NodeReady || got.State != api.LeaseActive {
		t.Fatalf("after restart: node %s, lease %s", n.State, got.State)
	}
	e.clock.Advance(11 * time.Second)
	if err := srv2.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	n, _ = e.srv.st.Node(e.ctx(), j.NodeID)
	got, _ = e.srv.st.Lease(e.ctx(), l.ID)
	if n.State != api.NodeDown || got.State != api.LeaseLost {
		t.Fatalf("silent after restart: node %s, lease %s", n.State, got.State)
	}
}

// TestHeartbeatMovedExports: a lender's report of a restored export served
// at a new address updates its part of an active lease (and the lease's
// URI), and is acknowledged; reports that would change the export name or
// the scheme, or that name a part the node does not lend, change nothing.
func TestHeartbeatMovedExports(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j1, n1 := e.join("n1", 1<<30)
	j2, n2 := e.join("n2", 1<<30)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	owner, ownerID, other, otherID := n1, j1.NodeID, n2, j2.NodeID
	if l.Parts[0].NodeID != j1.NodeID {
		owner, ownerID, other, otherID = n2, j2.NodeID, n1, j1.NodeID
	}
	u, err := url.Parse(l.URI)
	if err != nil || u.Host == "127.0.0.1:7001" {
		t.Fatalf("lease URI %v", err)
	}
	moveTo := func(host string) string { v := *u; v.Host = host; return v.String() }
	part := api.MovedExport{LeaseID: l.ID, DeviceID: l.Parts[0].DeviceID, Offset: l.Parts[0].Offset}
	with := func(mod func(*api.MovedExport)) api.MovedExport { m := part; mod(&m); return m }
	for _, tc := range []struct {
		name   string
		cl     *api.Client
		node   string
		m      api.MovedExport
		wantOK bool
	}{
		{"other export name", owner, ownerID, with(func(m *api.MovedExport) { m.URI = "nbd://127.0.0.1:7000/guessed" }), false},
		{"other scheme", owner, ownerID, with(func(m *api.MovedExport) { v := *u; v.Scheme = "rialto-mem"; m.URI = v.String() }), false},
		{"no host", owner, ownerID, with(func(m *api.MovedExport) { m.URI = moveTo("") }), false},
		{"added query", owner, ownerID, with(func(m *api.MovedExport) { m.URI = moveTo("127.0.0.1:7000") + "?gateway=x" }), false},
		{"other device", owner, ownerID, with(func(m *api.MovedExport) { m.URI, m.DeviceID = moveTo("127.0.0.1:7000"), "nope" }), false},
		{"not this node's part", other, otherID, with(func(m *api.MovedExport) { m.URI = moveTo("127.0.0.1:7000") }), false},
		{"new address", owner, ownerID, with(func(m *api.MovedExport) { m.URI = moveTo("127.0.0.1:7001") }), true},
		{"same again", owner, ownerID, with(func(m *api.MovedExport) { m.URI = moveTo("127.0.0.1:7001") }), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := e.alice.Lease(e.ctx(), l.ID)
			resp, err := tc.cl.Heartbeat(e.ctx(), tc.node, api.Heartbeat{Health: "ok", Leases: []string{l.ID}, Moved: []api.MovedExport{tc.m}})
			if err != nil {
				t.Fatal(err)
			}
			got, _ := e.alice.Lease(e.ctx(), l.ID)
			if !tc.wantOK {
				if len(resp.Moved) != 0 || got.URI != before.URI || got.Parts[0].URI != before.Parts[0].URI {
					t.Fatalf("refused report acknowledged %v or applied (URI changed: %v)", resp.Moved, got.URI != before.URI)
				}
				return
			}
			if !slices.Equal(resp.Moved, []string{l.ID}) || got.URI != tc.m.URI || got.Parts[0].URI != tc.m.URI || got.State != api.LeaseActive {
				t.Fatalf("ack %v, lease %s URI updated: %v, part: %v", resp.Moved, got.State, got.URI == tc.m.URI, got.Parts[0].URI == tc.m.URI)
			}
		})
	}
}

// TestRecordMovedTwoLenders: two lenders of one composed lease whose
// heartbeats were read from the same state each move their own part; both
// moves stay (the second does not write back the first part's old URI).
func TestRecordMovedTwoLenders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	e.join("n2", 1<<30)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Parts) != 2 || l.Parts[0].NodeID == l.Parts[1].NodeID {
		t.Fatalf("want two parts on two nodes: %+v", l.Parts)
	}
	stale, err := e.srv.st.Leases(e.ctx(), store.LeaseFilter{IDs: []string{l.ID}})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]string, 2)
	for i, p := range l.Parts {
		u, _ := url.Parse(p.URI)
		u.Host = fmt.Sprintf("127.0.0.1:%d", 7100+i)
		want[i] = u.String()
		m := api.MovedExport{LeaseID: l.ID, DeviceID: p.DeviceID, Offset: p.Offset, URI: want[i]}
		if acked := e.srv.recordMoved(e.ctx(), p.NodeID, stale, []api.MovedExport{m}); !slices.Equal(acked, []string{l.ID}) {
			t.Fatalf("part %d: acked %v", i, acked)
		}
	}
	got, _ := e.alice.Lease(e.ctx(), l.ID)
	for i := range want {
		if got.Parts[i].URI != want[i] {
			t.Errorf("part %d kept its old URI", i)
		}
	}
}
