package controlplane

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files under testdata/")

// goldenStep is one request of the API golden scenario. Path and body may
// name values of earlier answers as {node}, {lease}, {cred} (the node
// credential).
type goldenStep struct {
	what   string // what the step shows
	who    string // alice, bob, admin, boot, node or "" (no token)
	method string
	path   string
	body   string
	hdr    []string
	wait   time.Duration // advance the clock by this first
}

// TestAPIGolden runs a scenario through every /v1 route, success and
// error answers alike, pins the answers in testdata/api.golden (random IDs
// and secrets replaced by stable names) and checks each against the
// OpenAPI document (the schemaChecker of newEnv). Every route must answer
// at least one success that matches its schema.
func TestAPIGolden(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hc := &http.Client{Transport: e.schema}
	vals := map[string]string{}
	steps := []goldenStep{
		{"an empty cluster: lists are [], never null", "alice", "GET", "/v1/nodes", "", nil, 0},
		{"", "alice", "GET", "/v1/devices", "", nil, 0},
		{"", "alice", "GET", "/v1/leases", "", nil, 0},
		{"", "alice", "GET", "/v1/topology", "", nil, 0},
		{"", "alice", "GET", "/v1/profiles", "", nil, 0},
		{"", "alice", "GET", "/v1/events", "", nil, 0},
		{"no token", "", "GET", "/v1/nodes", "", nil, 0},
		{"a tenant token cannot join", "alice", "POST", "/v1/join", `{"name":"n1"}`, nil, 0},
		{"an agent joins", "boot", "POST", "/v1/join", `{"name":"n1","address":"127.0.0.1","agent_url":"http://127.0.0.1:1",` +
			`"fingerprint":{"machine_id":"mid-n1","hostname":"n1","cores":2,"memory_bytes":1073741824},` +
			`"devices":[{"name":"disk0","kind":"block","capacity":1073741824,"model":"m1","sharing":"partitionable"}]}`, nil, 0},
		{"its heartbeat", "node", "POST", "/v1/nodes/{node}/heartbeat", `{"health":"ok","leases":[],"links":[{"to":"controlplane","rtt_us":12.5,"up":true}]}`, nil, 0},
		{"another node's heartbeat", "node", "POST", "/v1/nodes/node-x/heartbeat", `{"health":"ok","leases":[]}`, nil, 0},
		{"", "alice", "GET", "/v1/nodes", "", nil, 0},
		{"", "node", "GET", "/v1/nodes/{node}", "", nil, 0},
		{"", "alice", "GET", "/v1/nodes/node-unknown", "", nil, 0},
		{"", "alice", "GET", "/v1/devices", "", nil, 0},
		{"", "alice", "GET", "/v1/topology", "", nil, 0},
		{"a feasible dry run", "alice", "POST", "/v1/explain", `{"kind":"block","size":268435456}`, nil, 0},
		{"an infeasible dry run: parts is []", "alice", "POST", "/v1/explain", `{"kind":"block","size":1099511627776}`, nil, 0},
		{"a body that is not a request", "alice", "POST", "/v1/explain", `{"kind":"block","size":"big"}`, nil, 0},
		{"a lease", "alice", "POST", "/v1/leases", `{"kind":"block","size":268435456,"ttl_seconds":600}`, []string{"Idempotency-Key", "k1"}, 0},
		{"the same request again: 200, the same lease", "alice", "POST", "/v1/leases", `{"kind":"block","size":268435456,"ttl_seconds":600}`, []string{"Idempotency-Key", "k1"}, 0},
		{"an infeasible lease", "alice", "POST", "/v1/leases", `{"kind":"block","size":1099511627776}`, nil, 0},
		{"a null body", "alice", "POST", "/v1/leases", `null`, nil, 0},
		{"", "alice", "GET", "/v1/leases/{lease}", "", nil, 0},
		{"another tenant's lease is not found", "bob", "GET", "/v1/leases/{lease}", "", nil, 0},
		{"the admin sees it without its secrets", "admin", "GET", "/v1/leases?state=active", "", nil, 0},
		{"", "alice", "GET", "/v1/leases?live=maybe", "", nil, 0},
		{"", "alice", "POST", "/v1/leases/{lease}/renew", `{"ttl_seconds":900}`, nil, 0},
		{"", "alice", "POST", "/v1/leases/{lease}/release?explain=1", "", nil, 0},
		{"", "alice", "POST", "/v1/leases/{lease}/renew", "", nil, 0},
		{"", "alice", "GET", "/v1/leases?live=1", "", nil, 0},
		{"", "alice", "GET", "/v1/events?since=1&limit=3", "", nil, 0},
		{"", "alice", "GET", "/v1/events?limit=0", "", nil, 0},
		{"a heartbeat with the devices' traffic counters", "node", "POST", "/v1/nodes/{node}/heartbeat", `{"health":"ok","leases":[],"links":[{"to":"controlplane","rtt_us":20,"up":true}],` +
			`"usage":[{"name":"disk0","read_bytes":0,"written_bytes":0,"used_bytes":4096}]}`, nil, 0},
		{"two seconds later", "node", "POST", "/v1/nodes/{node}/heartbeat", `{"health":"ok","leases":[],"links":[{"to":"controlplane","rtt_us":20,"up":true}],` +
			`"usage":[{"name":"disk0","read_bytes":1000000,"written_bytes":4000000,"used_bytes":4198400}]}`, nil, 2 * time.Second},
		{"negative counters are refused", "node", "POST", "/v1/nodes/{node}/heartbeat", `{"health":"ok","leases":[],"usage":[{"name":"disk0","read_bytes":-1,"written_bytes":0}]}`, nil, 0},
		{"bandwidth over time", "alice", "GET", "/v1/usage", "", nil, 0},
		{"the uplink's load", "alice", "GET", "/v1/topology", "", nil, 0},
		{"Prometheus scrape targets: the control plane as reached, and each agent", "alice", "GET", "/v1/metrics-targets", "", nil, 0},
		{"", "", "GET", "/v1/metrics-targets", "", nil, 0},
		{"", "alice", "GET", "/v1/whoami", "", nil, 0},
		{"", "node", "GET", "/v1/whoami", "", nil, 0},
		{"a dashboard login link", "alice", "POST", "/v1/login-links", "", nil, 0},
		{"only for tenant tokens", "node", "POST", "/v1/login-links", "", nil, 0},
		{"a profile", "admin", "PUT", "/v1/profiles/m1", `{"model":"m1","write_bps":[1e9,1.8e9],"latency_4k_us":80,"source":"declared"}`, nil, 0},
		{"a null profile is refused", "admin", "PUT", "/v1/profiles/m1", `null`, nil, 0},
		{"an empty profile is refused", "admin", "PUT", "/v1/profiles/m1", ``, nil, 0},
		{"a profile with no curve is refused", "admin", "PUT", "/v1/profiles/m1", `{}`, nil, 0},
		{"only the admin stores profiles", "alice", "PUT", "/v1/profiles/m1", `{"write_bps":[1e9]}`, nil, 0},
		{"the stored profile, read_bps [] not null", "alice", "GET", "/v1/profiles", "", nil, 0},
		{"removing a node takes an admin token", "alice", "DELETE", "/v1/nodes/{node}", "", nil, 0},
		{"a node that heartbeats needs force", "admin", "DELETE", "/v1/nodes/{node}", "", nil, 0},
		{"", "admin", "DELETE", "/v1/nodes/{node}?force=maybe", "", nil, 0},
		{"", "admin", "DELETE", "/v1/nodes/node-unknown?force=true", "", nil, 0},
		{"forced: its leases lost, its credential forgotten", "admin", "DELETE", "/v1/nodes/{node}?force=true", "", nil, 0},
		{"", "alice", "GET", "/v1/nodes/{node}", "", nil, 0},
	}
	tokens := map[string]string{"alice": aliceTok, "bob": bobTok, "admin": adminTok, "boot": bootTok}
	subst := func(s string) string {
		for k, v := range vals {
			s = strings.ReplaceAll(s, "{"+k+"}", v)
		}
		return s
	}
	var out bytes.Buffer
	for _, st := range steps {
		tok := tokens[st.who]
		if st.who == "node" {
			tok = vals["cred"]
		}
		e.clock.Advance(st.wait)
		path := subst(st.path)
		var body io.Reader
		if st.body != "" || st.method != "GET" {
			body = strings.NewReader(st.body)
		}
		req, err := http.NewRequest(st.method, e.ts.URL+path, body)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		for i := 0; i+1 < len(st.hdr); i += 2 {
			req.Header.Set(st.hdr[i], st.hdr[i+1])
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var v map[string]any
		if json.Unmarshal(data, &v) == nil {
			if id, ok := v["node_id"].(string); ok && vals["node"] == "" {
				vals["node"], vals["cred"] = id, v["credential"].(string)
			}
			if id, ok := v["id"].(string); ok && strings.HasPrefix(id, "lease-") && vals["lease"] == "" {
				vals["lease"] = id
			}
		}
		if st.what != "" {
			fmt.Fprintf(&out, "# %s\n", st.what)
		}
		fmt.Fprintf(&out, "%s %s (%s)\n%d %s\n", st.method, st.path, cmp(st.who != "", st.who, "no token"), resp.StatusCode, resp.Header.Get("Content-Type"))
		var pretty bytes.Buffer
		if json.Indent(&pretty, data, "", "  ") == nil {
			out.Write(pretty.Bytes())
			out.WriteString("\n")
		} else {
			out.Write(data)
		}
		out.WriteString("\n")
	}
	// The control plane's address (GET /v1/metrics-targets names it).
	got := normalizeGolden(strings.ReplaceAll(out.String(), e.ts.Listener.Addr().String(), "127.0.0.1:7070"))

	// Every route answered a success that matches its schema.
	checked := strings.Join(e.schema.summary(), "\n")
	for _, rt := range e.srv.routeTable() {
		status := rt.Status
		if status == 0 {
			status = http.StatusOK
		}
		if !strings.Contains(checked, rt.Method+" "+rt.Path+" "+strconv.Itoa(status)) {
			t.Errorf("no %d answer of %s %s was checked against the document; checked:\n%s", status, rt.Method, rt.Path, checked)
		}
	}

	path := filepath.Join("testdata", "api.golden")
	if *rewrite {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run APIGolden -rewrite writes it)", err)
	}
	if got != string(want) {
		t.Errorf("API answers changed (go test -run APIGolden -rewrite to accept):\n%s", got)
	}
}

func cmp(c bool, a, b string) string {
	if c {
		return a
	}
	return b
}

var (
	goldenIDs     = regexp.MustCompile(`\b(node|dev|lease)-[0-9a-z]{12}\b`)
	goldenSecrets = regexp.MustCompile(`\b(r[a-z]{2})_[0-9A-Za-z_-]{40,}`)
	goldenCodes   = regexp.MustCompile(`code=[0-9A-Za-z_-]{20,}`)
)

// normalizeGolden names random IDs by their order of appearance
// (lease-1, …) and replaces secrets by their kind.
func normalizeGolden(s string) string {
	seen := map[string]string{}
	n := map[string]int{}
	s = goldenIDs.ReplaceAllStringFunc(s, func(id string) string {
		if r, ok := seen[id]; ok {
			return r
		}
		kind := id[:strings.IndexByte(id, '-')]
		n[kind]++
		seen[id] = kind + "-" + strconv.Itoa(n[kind])
		return seen[id]
	})
	s = goldenCodes.ReplaceAllString(s, "code=<login code>")
	return goldenSecrets.ReplaceAllString(s, "<$1 secret>")
}
