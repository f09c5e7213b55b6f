package appliance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

func start(t *testing.T, cfg Config) *Appliance {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return a
}

func leaseSlot(t *testing.T, a *Appliance, id int, role string) *accel.Conn {
	t.Helper()
	ctx := context.Background()
	if role != "" {
		if err := a.Load(ctx, id, roles.Spec{Name: role}); err != nil {
			t.Fatal(err)
		}
	}
	cred := []byte(fmt.Sprintf("cred-%d", id))
	if err := a.SetCredential(id, cred); err != nil {
		t.Fatal(err)
	}
	addr, _ := a.Addr(id)
	c, err := accel.Dial(ctx, addr, cred)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestMemoryIsolation(t *testing.T) {
	a := start(t, Config{Slots: 3, SlotMemory: 4096})
	ctx := context.Background()
	c0, c1 := leaseSlot(t, a, 0, "echo"), leaseSlot(t, a, 1, "echo")
	if info := a.Info(); info.Slots[1].Base != 4096 || info.Slots[2].Base != 8192 || info.Slots[1].MemSize != 4096 {
		t.Fatalf("offset table %+v", info.Slots)
	}
	if err := c0.WriteMem(ctx, 0, bytes.Repeat([]byte{0xaa}, 4096)); err != nil {
		t.Fatal(err)
	}
	got, err := c1.ReadMem(ctx, 0, 4096)
	if err != nil || !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatalf("slot 1 sees slot 0's bytes (%v)", err)
	}
	for _, tc := range []struct {
		name string
		do   func() error
	}{
		{"write across the end", func() error { return c0.WriteMem(ctx, 4090, make([]byte, 10)) }},
		{"write just past the end", func() error { return c0.WriteMem(ctx, 4096, []byte{1}) }},
		{"write bigger than the slot", func() error { return c1.WriteMem(ctx, 0, make([]byte, 4097)) }},
		{"read past the end", func() error { _, err := c1.ReadMem(ctx, 4096, 1); return err }},
		{"wrapping address", func() error { _, err := c1.ReadMem(ctx, math.MaxUint64-1, 4); return err }},
		{"task input outside", func() error {
			task, err := c1.Start(ctx, accel.TaskSpec{Entry: "echo", In: 4000, InLen: 200, Out: 0, OutCap: 200})
			if err != nil {
				return err
			}
			_, err = task.Wait(ctx)
			return err
		}},
		{"task output outside", func() error {
			task, err := c1.Start(ctx, accel.TaskSpec{Entry: "echo", In: 0, InLen: 100, Out: 4050, OutCap: 100})
			if err != nil {
				return err
			}
			_, err = task.Wait(ctx)
			return err
		}},
	} {
		if err := tc.do(); !errors.Is(err, accel.ErrOutOfRange) {
			t.Errorf("%s: %v, want ErrOutOfRange", tc.name, err)
		}
	}
	// Slot 1's failed accesses changed nothing in slot 0 or slot 2.
	got, _ = c0.ReadMem(ctx, 0, 4096)
	if !bytes.Equal(got, bytes.Repeat([]byte{0xaa}, 4096)) {
		t.Fatal("slot 0 memory changed")
	}
	if !bytes.Equal(a.mem[8192:], make([]byte, 4096)) {
		t.Fatal("slot 2 memory changed")
	}
}

func TestMailboxRoles(t *testing.T) {
	a := start(t, Config{Slots: 2, SlotMemory: 1 << 20})
	ctx := context.Background()
	c := leaseSlot(t, a, 0, "sha256")
	in := bytes.Repeat([]byte("rialto"), 1000)
	if err := c.WriteMem(ctx, 0, in); err != nil {
		t.Fatal(err)
	}
	task, err := c.Start(ctx, accel.TaskSpec{Entry: "sum", In: 0, InLen: uint32(len(in)), Out: 1 << 19, OutCap: 32})
	if err != nil {
		t.Fatal(err)
	}
	n, err := task.Wait(ctx)
	if err != nil || n != 32 {
		t.Fatalf("wait %d %v", n, err)
	}
	sum, _ := c.ReadMem(ctx, 1<<19, 32)
	if want := sha256.Sum256(in); !bytes.Equal(sum, want[:]) {
		t.Fatal("sha mismatch")
	}
	st, _ := a.Slot(0)
	if st.Tasks != 1 || st.Role != "sha256" || !st.Leased || st.BytesIn != uint64(len(in))+32 {
		t.Fatalf("status %+v", st)
	}
}

func TestLeaseAndBadInputs(t *testing.T) {
	a := start(t, Config{Slots: 2, SlotMemory: 4096, MaxPayload: 1 << 16})
	ctx := context.Background()
	addr, _ := a.Addr(1)
	if _, err := accel.Dial(ctx, addr, []byte("x")); !errors.Is(err, accel.ErrAuth) {
		t.Fatalf("unleased slot: %v", err)
	}
	c := leaseSlot(t, a, 1, "")
	if _, err := accel.Dial(ctx, addr, []byte("wrong")); !errors.Is(err, accel.ErrAuth) {
		t.Fatalf("wrong credential: %v", err)
	}
	if _, err := c.Call(ctx, "echo", []byte("x")); !errors.Is(err, accel.ErrNoRole) {
		t.Fatalf("no role: %v", err)
	}
	if err := a.Load(ctx, 1, roles.Spec{Name: "tpu"}); !errors.Is(err, roles.ErrUnknownRole) {
		t.Fatalf("unknown role: %v", err)
	}
	if err := a.Load(ctx, 1, roles.Spec{Name: "wasm", Module: []byte("\x00asm garbage")}); !errors.Is(err, roles.ErrBadModule) {
		t.Fatalf("corrupt wasm: %v", err)
	}
	if err := a.Load(ctx, 7, roles.Spec{Name: "echo"}); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("no slot: %v", err)
	}
	if err := a.Load(ctx, 1, roles.Spec{Name: "echo"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, "echo", make([]byte, 1<<17)); !errors.Is(err, accel.ErrTooLarge) {
		t.Fatalf("oversized inline input: %v", err)
	}
	if _, err := c.Call(ctx, "reverse", nil); !errors.Is(err, roles.ErrUnknownEntry) {
		t.Fatalf("unknown entry: %v", err)
	}
	if err := c.WriteMem(ctx, 0, []byte("secret")); err != nil {
		t.Fatal(err)
	}
	// Ending the lease closes the connection and wipes the memory.
	if err := a.SetCredential(1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, "echo", nil); !errors.Is(err, accel.ErrClosed) {
		t.Fatalf("call after lease end: %v", err)
	}
	c2 := leaseSlot(t, a, 1, "")
	if got, _ := c2.ReadMem(ctx, 0, 6); !bytes.Equal(got, make([]byte, 6)) {
		t.Fatalf("next lease sees %q", got)
	}
}

// TestReloadUnderLoad reloads slot 0 over and over while clients hammer
// all three slots: no request fails anywhere.
func TestReloadUnderLoad(t *testing.T) {
	a := start(t, Config{Slots: 3, SlotMemory: 1 << 16, Workers: 2})
	ctx := context.Background()
	wasm := roles.Spec{Name: "wasm", Module: wasmtest.EchoModule()}
	var conns []*accel.Conn
	for i := 0; i < 3; i++ {
		conns = append(conns, leaseSlot(t, a, i, "echo"))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls [3]atomic.Int64
	errs := make(chan error, 16)
	for i, c := range conns {
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					msg := []byte(fmt.Sprintf("slot%d-g%d-%d", i, g, n))
					out, err := c.Call(ctx, "echo", msg)
					if err != nil || !bytes.Equal(out, msg) {
						errs <- fmt.Errorf("slot %d: %q %v", i, out, err)
						return
					}
					calls[i].Add(1)
				}
			}()
		}
	}
	for r := 0; r < 40; r++ {
		spec := roles.Spec{Name: "echo"}
		if r%2 == 0 {
			spec = wasm
		}
		if err := a.Load(ctx, 0, spec); err != nil {
			t.Fatal(err)
		}
		if r%10 == 9 {
			if err := a.Reset(ctx, 0); err != nil {
				t.Fatal(err)
			}
		}
		// Let traffic flow on the new role before the next reload.
		for start := calls[0].Load(); calls[0].Load() < start+5; {
			select {
			case err := <-errs:
				t.Fatal(err)
			default:
			}
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range calls {
		st, _ := a.Slot(i)
		if st.Failed != 0 || calls[i].Load() == 0 {
			t.Errorf("slot %d: %d calls, %d failed", i, calls[i].Load(), st.Failed)
		}
	}
	if st, _ := a.Slot(0); st.Generation < 44 {
		t.Errorf("slot 0 generation %d", st.Generation)
	}
}

func TestManagementAPI(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := start(t, Config{Slots: 2, SlotMemory: 4096, ManagementToken: "tok", Metrics: reg})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	do := func(method, path, body string, token bool) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if token {
			req.Header.Set("Authorization", "Bearer tok")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	wasmSpec, _ := json.Marshal(roles.Spec{Name: "wasm", Module: wasmtest.EchoModule()})
	badWasm, _ := json.Marshal(roles.Spec{Name: "wasm", Module: []byte("corrupt")})
	for _, tc := range []struct {
		method, path, body string
		token              bool
		status             int
		contains           string
	}{
		{"GET", "/v1/slots", "", false, 401, "unauthorized"},
		{"GET", "/v1/slots", "", true, 200, `"addr"`},
		{"GET", "/v1/slots/9", "", true, 404, "no_such_slot"},
		{"GET", "/v1/nonsense", "", true, 404, `"code":"not_found"`},
		{"GET", "/v1/nonsense", "", false, 401, "unauthorized"},
		{"GET", "/v1/slots/x", "", true, 404, "no_such_slot"},
		{"PUT", "/v1/slots/0/role", `{"name":"gpu"}`, true, 400, "unknown_role"},
		{"PUT", "/v1/slots/0/role", string(badWasm), true, 400, "bad_module"},
		{"PUT", "/v1/slots/0/role", `{`, true, 400, "bad_request"},
		{"PUT", "/v1/slots/0/role", string(wasmSpec), true, 200, `"upper"`},
		{"PUT", "/v1/slots/0/credential", `{"credential":"c0"}`, true, 204, ""},
		{"PUT", "/v1/slots/0/credential", `{}`, true, 400, "bad_request"},
		{"GET", "/v1/slots/0", "", true, 200, `"leased":true`},
		{"POST", "/v1/slots/0/reset", "", true, 204, ""},
		{"GET", "/v1/health", "", true, 200, `"healthy":true`},
		{"GET", "/v1/appliance", "", true, 200, `"mct"`},
	} {
		status, body := do(tc.method, tc.path, tc.body, tc.token)
		if status != tc.status || !strings.Contains(body, tc.contains) {
			t.Errorf("%s %s: %d %s, want %d containing %q", tc.method, tc.path, status, body, tc.status, tc.contains)
		}
	}
	addr, _ := a.Addr(0)
	c, err := accel.Dial(context.Background(), addr, []byte("c0"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if out, err := c.Call(context.Background(), "upper", []byte("wasm via http")); err != nil || string(out) != "WASM VIA HTTP" {
		t.Fatalf("upper: %q %v", out, err)
	}
	if status, body := do("DELETE", "/v1/slots/0/role", "", true); status != 204 {
		t.Fatalf("unload: %d %s", status, body)
	}
	if _, err := c.Call(context.Background(), "upper", nil); !errors.Is(err, accel.ErrNoRole) {
		t.Fatalf("after unload: %v", err)
	}
	if _, body := do("GET", "/metrics", "", true); !strings.Contains(body, `rialto_accel_slot_tasks_total{outcome="ok",slot="0"} 1`) {
		t.Fatalf("metrics:\n%s", body)
	}
}

type fakeRegistrar struct {
	fails      atomic.Int32
	registered chan Info
	beats      chan Health
}

func (f *fakeRegistrar) Register(_ context.Context, info Info) error {
	if f.fails.Add(-1) >= 0 {
		return errors.New("control plane unavailable")
	}
	f.registered <- info
	return nil
}

func (f *fakeRegistrar) Heartbeat(ctx context.Context, h Health) error {
	select {
	case f.beats <- h:
	case <-ctx.Done():
	}
	return nil
}

// The appliance registers (retrying a failure after a backoff of its
// clock) and then heartbeats every HeartbeatInterval of its clock, its
// health stamped by that clock.
func TestRegisterAndHeartbeat(t *testing.T) {
	fr := &fakeRegistrar{registered: make(chan Info, 1), beats: make(chan Health)}
	fr.fails.Store(1)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	a := start(t, Config{ID: "app-1", Slots: 2, SlotMemory: 1024, Registrar: fr, HeartbeatInterval: time.Minute,
		ManagementAddr: "127.0.0.1:0", Clock: clk})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// The failed registration waits for its retry on the clock.
	if err := clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fr.registered:
		t.Fatal("registered again before the retry's time")
	default:
	}
	next, _ := clk.Next()
	clk.Advance(next.Sub(clk.Now()))
	var info Info
	select {
	case info = <-fr.registered:
	case <-ctx.Done():
		t.Fatal("no registration")
	}
	if info.ID != "app-1" || len(info.Slots) != 2 || info.Management != a.ManagementAddr() {
		t.Fatalf("registered %+v", info)
	}
	registered := clk.Now()
	for i := range 3 {
		if i > 0 {
			clk.Advance(time.Minute)
		}
		select {
		case h := <-fr.beats:
			if !h.Healthy || len(h.Slots) != 2 || !h.Time.Equal(registered.Add(time.Duration(i)*time.Minute)) ||
				h.Uptime != clk.Since(t0).Seconds() {
				t.Fatalf("heartbeat %d: %+v (clock %v)", i, h, clk.Now())
			}
		case <-ctx.Done():
			t.Fatalf("no heartbeat %d", i)
		}
	}
	resp, err := http.Get("http://" + a.ManagementAddr() + "/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("management listener: %d", resp.StatusCode)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{{}, {Slots: 1}, {Slots: 300, SlotMemory: 1}, {Slots: 1, SlotMemory: 5 << 30}, {Slots: 32, SlotMemory: 4 << 30}} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	a, err := New(Config{Slots: 1, SlotMemory: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Run(context.Background()); !errors.Is(err, ErrNotReady) {
		t.Fatalf("run after close: %v", err)
	}
}

func TestHTTPCall(t *testing.T) {
	a := start(t, Config{Slots: 2, SlotMemory: 4096, ManagementToken: "tok"})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	ctx := context.Background()
	if err := a.Load(ctx, 0, roles.Spec{Name: "sha256"}); err != nil {
		t.Fatal(err)
	}
	_ = a.SetCredential(0, []byte("lease-0"))
	_ = a.SetCredential(1, []byte("lease-1"))
	call := func(slot, entry, cred, body string) (int, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/slots/"+slot+"/call/"+entry, strings.NewReader(body))
		if cred != "" {
			req.Header.Set("Rialto-Lease-Credential", cred)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	sum := sha256.Sum256([]byte("hello"))
	if status, body := call("0", "sum", "lease-0", "hello"); status != 200 || body != string(sum[:]) {
		t.Fatalf("call: %d %q", status, body)
	}
	for _, tc := range []struct {
		slot, entry, cred string
		status            int
		code              string
	}{
		{"0", "sum", "", 403, "lease_credential_rejected"},
		{"0", "sum", "lease-1", 403, "lease_credential_rejected"},
		{"0", "nope", "lease-0", 404, "unknown_entry"},
		{"1", "sum", "lease-1", 409, "no_role"},
		{"7", "sum", "lease-1", 404, "no_such_slot"},
	} {
		if status, body := call(tc.slot, tc.entry, tc.cred, "x"); status != tc.status || !strings.Contains(body, tc.code) {
			t.Errorf("%+v: %d %s", tc, status, body)
		}
	}
}

// TestLeaseEndStopsTasks: ending a lease interrupts its running tasks and
// waits for them before wiping the memory.
func TestLeaseEndStopsTasks(t *testing.T) {
	a := start(t, Config{Slots: 1, SlotMemory: 1 << 16})
	ctx := context.Background()
	if err := a.Load(ctx, 0, roles.Spec{Name: "wasm", Module: wasmtest.EchoModule()}); err != nil {
		t.Fatal(err)
	}
	c := leaseSlot(t, a, 0, "")
	if err := c.WriteMem(ctx, 0, []byte("tenant data")); err != nil {
		t.Fatal(err)
	}
	task, err := c.Start(ctx, accel.TaskSpec{Entry: "spin", In: 0, InLen: 11, Out: 100, OutCap: 100})
	if err != nil {
		t.Fatal(err)
	}
	waitFor := func(cond func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatal("condition not reached")
			}
			runtime.Gosched()
		}
	}
	waitFor(func() bool { st, _ := a.Slot(0); return st.InFlight == 1 })
	if err := a.SetCredential(0, nil); err != nil {
		t.Fatal(err)
	}
	if st, err := a.Slot(0); err != nil || st.InFlight != 0 {
		t.Fatalf("%d tasks still running after the lease ended (%v)", st.InFlight, err)
	}
	if _, err := task.Wait(ctx); err == nil {
		t.Fatal("spinning task reported success")
	}
	if !bytes.Equal(a.mem, make([]byte, len(a.mem))) {
		t.Fatal("memory not wiped")
	}
}

func TestRegistrarFuncs(t *testing.T) {
	var got []string
	r := RegistrarFuncs{RegisterFunc: func(_ context.Context, i Info) error { got = append(got, i.ID); return nil }}
	if err := r.Register(context.Background(), Info{ID: "x"}); err != nil || len(got) != 1 {
		t.Fatalf("register: %v %v", got, err)
	}
	if err := r.Heartbeat(context.Background(), Health{}); err != nil {
		t.Fatalf("nil heartbeat func: %v", err)
	}
}

// TestRebind: a running slot moves to a chosen address; a connection made
// before keeps working, the old address stops answering, a busy address
// leaves the slot where it was, and a stopped appliance refuses.
func TestRebind(t *testing.T) {
	a, err := New(Config{Slots: 2, SlotMemory: 4096})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	before := leaseSlot(t, a, 0, "echo")
	old, _ := a.Addr(0)

	// A free address to move to: bind one, note it, let it go.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	want := probe.Addr().String()
	probe.Close()
	if err := a.Rebind(0, want); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Addr(0); got != want {
		t.Fatalf("slot 0 at %s after rebinding to %s", got, want)
	}
	if got := a.Info().Slots[0].Addr; got != want {
		t.Fatalf("info says slot 0 is at %s", got)
	}
	if out, err := before.Call(ctx, "echo", []byte("kept")); err != nil || string(out) != "kept" {
		t.Fatalf("connection from before the rebind: %q %v", out, err)
	}
	// The new listener is bound when Rebind returns: a dial queues there
	// until the slot's accept loop, woken by the old listener's close,
	// takes it.
	after, err := accel.Dial(ctx, want, []byte("cred-0"))
	if err != nil {
		t.Fatalf("dial the new address: %v", err)
	}
	if out, err := after.Call(ctx, "echo", []byte("moved")); err != nil || string(out) != "moved" {
		t.Fatalf("call at the new address: %q %v", out, err)
	}
	after.Close()
	if c, err := accel.Dial(ctx, old, []byte("cred-0")); err == nil {
		c.Close()
		t.Fatalf("old address %s still answers", old)
	}

	// A busy address: the slot stays.
	other, _ := a.Addr(1)
	if err := a.Rebind(0, other); err == nil {
		t.Fatal("rebinding onto slot 1's address succeeded")
	}
	if got, _ := a.Addr(0); got != want {
		t.Fatalf("a failed rebind moved slot 0 to %s", got)
	}
	if err := a.Rebind(5, "127.0.0.1:0"); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("rebind of a missing slot: %v", err)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	done <- nil
	if err := a.Rebind(1, "127.0.0.1:0"); !errors.Is(err, ErrNotReady) {
		t.Fatalf("rebind after Run: %v", err)
	}
}
