package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
)

// fakeLender is an in-package test double of the agents' lease-execution
// API: it records exports and can refuse or hang per node.
type fakeLender struct {
	mu       sync.Mutex
	exports  map[string]api.PrepareRequest // lease.part → request
	prepared int
	torn     []string
	tornReqs []api.TeardownRequest
	refuse   map[string]bool // node ID → refuse
	hang     map[string]bool // node ID → never answer (until ctx ends)
	keys     map[string]string
	// onTeardown, if set, is called with each teardown's lease before it
	// is recorded.
	onTeardown func(leaseID string)
}

func newFakeLender() *fakeLender {
	return &fakeLender{exports: map[string]api.PrepareRequest{}, refuse: map[string]bool{}, hang: map[string]bool{}, keys: map[string]string{}}
}

var errRefused = errors.New("fake lender: refused")

func (f *fakeLender) Prepare(ctx context.Context, node api.Node, agentKey string, req api.PrepareRequest) (api.PrepareResponse, error) {
	f.mu.Lock()
	refuse, hang := f.refuse[node.ID], f.hang[node.ID]
	f.keys[node.ID] = agentKey
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return api.PrepareResponse{}, ctx.Err()
	}
	if refuse {
		return api.PrepareResponse{}, errRefused
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.prepared++
	f.exports[req.LeaseID+"/"+req.DeviceID+"/"+strconv.FormatInt(req.Offset, 10)] = req
	return api.PrepareResponse{URI: "nbd://" + node.Address + "/" + req.Export}, nil
}

func (f *fakeLender) Teardown(ctx context.Context, node api.Node, agentKey string, req api.TeardownRequest) error {
	leaseID := req.LeaseID
	f.mu.Lock()
	hook := f.onTeardown
	f.mu.Unlock()
	if hook != nil {
		hook(leaseID)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.torn = append(f.torn, node.ID+"/"+leaseID)
	f.tornReqs = append(f.tornReqs, req)
	return nil
}

func (f *fakeLender) set(m map[string]bool, id string, v bool) {
	f.mu.Lock()
	m[id] = v
	f.mu.Unlock()
}

func (f *fakeLender) tornDown() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.torn...)
}

const (
	bootTok  = "boot-secret-token"
	aliceTok = "alice-secret-token"
	bobTok   = "bob-secret-token"
	adminTok = "admin-secret-token"
)

type env struct {
	t      *testing.T
	srv    *Server
	clock  *clock.FakeNow // what the server judges by; its stream polls in real time
	lender *fakeLender
	ts     *httptest.Server
	schema *schemaChecker
	dbPath string
	alice  *api.Client
	bob    *api.Client
	admin  *api.Client
	boot   *api.Client
}

func newEnv(t *testing.T, mod ...func(*Config)) *env {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "rialto.db")
	st, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, clock: clock.NewFakeNow(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), lender: newFakeLender(), dbPath: path}
	cfg := Config{
		Store: st, Clock: e.clock, Lender: e.lender, BootstrapToken: bootTok, PrepareTimeout: 200 * time.Millisecond,
		Tokens: []Token{{Token: aliceTok, Tenant: "alice"}, {Token: bobTok, Tenant: "bob"}, {Token: adminTok, Tenant: "ops", Admin: true}},
	}
	for _, m := range mod {
		m(&cfg)
	}
	e.srv, err = New(e.ctx(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.ts = httptest.NewServer(e.srv.Handler())
	t.Cleanup(e.ts.Close)
	// Every answer the clients get is checked against the OpenAPI document.
	e.schema = newSchemaChecker(t, e.srv, e.ts.Client().Transport)
	c := api.NewClient(e.ts.URL, "", &http.Client{Transport: e.schema})
	e.alice, e.bob, e.admin, e.boot = c.WithToken(aliceTok), c.WithToken(bobTok), c.WithToken(adminTok), c.WithToken(bootTok)
	return e
}

// ctx is the test's context, cancelled when the test ends.
func (e *env) ctx() context.Context { return e.t.Context() }

// join registers a node named name with block devices of the given sizes.
func (e *env) join(name string, sizes ...int64) (api.JoinResponse, *api.Client) {
	e.t.Helper()
	return e.rejoin(name, "", sizes...)
}

// rejoin is join presenting the node credential cred (that of the node's
// last join: its agent restarted with its state).
func (e *env) rejoin(name, cred string, sizes ...int64) (api.JoinResponse, *api.Client) {
	e.t.Helper()
	jr, err := e.boot.Join(e.ctx(), joinRequest(name, cred, sizes...))
	if err != nil {
		e.t.Fatal(err)
	}
	return jr, e.boot.WithToken(jr.Credential)
}

// joinRequest is the join of node name (machine ID "mid-"+name) with
// block devices of the given sizes, presenting the credential cred.
func joinRequest(name, cred string, sizes ...int64) api.JoinRequest {
	req := api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1", Credential: cred,
		Fingerprint: api.Fingerprint{MachineID: "mid-" + name, Hostname: name, Cores: 2, MemoryBytes: 1 << 30}}
	for i, sz := range sizes {
		req.Devices = append(req.Devices, api.DeviceSpec{Name: fmt.Sprintf("disk%d", i), Kind: api.KindBlock, Capacity: sz, Sharing: "partitionable"})
	}
	return req
}

var storeAll = store.LeaseFilter{}
