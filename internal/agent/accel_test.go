package agent

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

func TestAccelLease(t *testing.T) {
	_, srv := newFakeCP(t)
	r := start(t, testConfig(srv.URL, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "acc-1", Kind: api.KindAccel, DeviceName: "gpu",
		Offset: 0, Length: 2 * api.SlotUnits, Export: "rlc_accel.0", Role: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(resp.URI)
	if err != nil || u.Scheme != "rialto-accel" || u.Query().Get("slots") == "" {
		t.Fatalf("URI %q: %v", resp.URI, err)
	}
	cred := strings.TrimPrefix(u.Path, "/")
	for _, addr := range []string{u.Host, u.Query().Get("slots")} {
		c, err := accel.Dial(ctx, addr, []byte(cred))
		if err != nil {
			t.Fatalf("slot %s: %v", addr, err)
		}
		out, err := c.Call(ctx, "echo", []byte("ping"))
		if err != nil || !bytes.Equal(out, []byte("ping")) {
			t.Fatalf("echo on %s: %q %v", addr, out, err)
		}
		c.Close()
	}
	if c, err := accel.Dial(ctx, u.Host, []byte("wrong")); err == nil {
		c.Close()
		t.Fatal("a wrong credential reached a slot")
	}
	if err := r.a.Teardown(ctx, "acc-1"); err != nil {
		t.Fatal(err)
	}
	if c, err := accel.Dial(ctx, u.Host, []byte(cred)); err == nil {
		c.Close()
		t.Fatal("slot still leased after teardown")
	}
	if _, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "acc-2", Kind: api.KindAccel, DeviceName: "gpu",
		Offset: api.SlotUnits, Length: api.SlotUnits, Export: "x", Role: "no-such-role"}); err == nil {
		t.Fatal("unknown role accepted")
	}
	if len(r.a.Leases()) != 0 {
		t.Fatalf("failed prepare left %v", r.a.Leases())
	}
}

// accelURI splits a rialto-accel URI into address and credential.
func accelURI(t *testing.T, uri string) (*url.URL, string) {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "rialto-accel" {
		t.Fatalf("URI %q: %v", uri, err)
	}
	return u, strings.TrimPrefix(u.Path, "/")
}

// dialAccel dials the accelerator lease at uri, a rialto-accel URI, and
// returns the connection (closed when the test ends), the lease's address
// and its credential.
func dialAccel(ctx context.Context, t *testing.T, uri string) (c *accel.Conn, addr, cred string) {
	t.Helper()
	u, cred := accelURI(t, uri)
	c, err := accel.Dial(ctx, u.Host, []byte(cred))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, u.Host, cred
}

func TestAccelSharedGateway(t *testing.T) {
	_, srv := newFakeCP(t)
	r := start(t, testConfig(srv.URL, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prep := func(lease string, slot int64, export string) (*url.URL, string) {
		resp, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: lease, Kind: api.KindAccel, Mode: api.ModeShared, DeviceName: "gpu",
			Offset: slot * api.SlotUnits, Length: api.SlotUnits, Export: export, Role: "sha256", Gateway: true})
		if err != nil {
			t.Fatal(err)
		}
		return accelURI(t, resp.URI)
	}
	u1, c1 := prep("sh-1", 0, "rlc_one.0")
	u2, c2 := prep("sh-2", 1, "rlc_two.0")
	if u1.Host != u2.Host || u1.Query().Get("gateway") != "sha256" {
		t.Fatalf("two shared leases of one role got %s and %s", u1, u2)
	}
	// Prepare is idempotent.
	if again, _ := prep("sh-1", 0, "rlc_one.0"); again.String() != u1.String() {
		t.Fatalf("re-prepare: %s, was %s", again, u1)
	}
	drv := r.a.drivers[api.KindAccel].(*AccelDriver)
	if gs := drv.Gateways(); len(gs) != 1 || gs[0].Leases != 2 || gs[0].Slots != 2 || gs[0].Role != "sha256" {
		t.Fatalf("gateways: %+v", gs)
	}
	// The slots themselves refuse the borrowers: only the gateway reaches them.
	slot0, _ := drv.Appliance("gpu").Addr(0)
	if c, err := accel.Dial(ctx, slot0, []byte(c1)); err == nil {
		c.Close()
		t.Fatal("a borrower's credential opened a gateway slot")
	}
	if c, err := accel.Dial(ctx, u1.Host, []byte("rlc_wrong.0")); err == nil {
		c.Close()
		t.Fatal("the gateway accepted an unknown credential")
	}
	conn1, err := accel.Dial(ctx, u1.Host, []byte(c1))
	if err != nil {
		t.Fatal(err)
	}
	defer conn1.Close()
	conn2, err := accel.Dial(ctx, u2.Host, []byte(c2))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if info := conn1.Info(); info.Role != "sha256" || len(info.Entries) == 0 || info.Entries[0] != "sum" {
		t.Fatalf("gateway info %+v", info)
	}
	want := sha256.Sum256([]byte("abc"))
	for _, c := range []*accel.Conn{conn1, conn2} {
		out, err := c.Call(ctx, "sum", []byte("abc"))
		if err != nil || !bytes.Equal(out, want[:]) {
			t.Fatalf("sum through the gateway: %x %v", out, err)
		}
	}
	// Each lease's counters at the gateway, by lease ID, never by credential.
	gs := drv.Gateways()
	if len(gs) != 1 || len(gs[0].LeaseStats) != 2 {
		t.Fatalf("gateways: %+v", gs)
	}
	for i, id := range []string{"sh-1", "sh-2"} {
		if ls := gs[0].LeaseStats[i]; ls.Lease != id || ls.Served != 1 || ls.Executions != 1 || ls.Weight < 1 || ls.Queued != 0 {
			t.Errorf("lease %s at the gateway: %+v", id, ls)
		}
	}
	if b, _ := json.Marshal(gs); bytes.Contains(b, []byte("rlc_one")) || bytes.Contains(b, []byte("rlc_two")) {
		t.Errorf("the gateway listing shows a credential: %s", b)
	}
	// Lease 2 keeps calling while lease 1 ends: none of its calls fails.
	stop, started := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				close(errc)
				return
			default:
			}
			out, err := conn2.Call(ctx, "sum", []byte("abc"))
			if err == nil && !bytes.Equal(out, want[:]) {
				err = fmt.Errorf("wrong digest %x", out)
			}
			if err != nil {
				errc <- err
				close(errc)
				if n == 0 {
					close(started)
				}
				return
			}
			if n++; n == 1 {
				close(started)
			}
		}
	}()
	<-started
	if err := r.a.Teardown(ctx, "sh-1"); err != nil {
		t.Fatal(err)
	}
	// The ended lease's connection is closed and its credential refused.
	if _, err := conn1.Call(ctx, "sum", []byte("abc")); err == nil {
		t.Fatal("an ended lease's connection still calls the gateway")
	}
	if c, err := accel.Dial(ctx, u1.Host, []byte(c1)); err == nil {
		c.Close()
		t.Fatal("the gateway accepts an ended lease's credential")
	}
	if gs := drv.Gateways(); len(gs) != 1 || gs[0].Leases != 1 || gs[0].Slots != 1 {
		t.Fatalf("gateways after one teardown: %+v", gs)
	}
	close(stop)
	if err := <-errc; err != nil {
		t.Fatalf("the other lease's call failed: %v", err)
	}
	if err := r.a.Teardown(ctx, "sh-2"); err != nil {
		t.Fatal(err)
	}
	if gs := drv.Gateways(); len(gs) != 0 {
		t.Fatalf("gateway outlived its leases: %+v", gs)
	}
	if c, err := accel.Dial(ctx, u2.Host, []byte(c2)); err == nil {
		c.Close()
		t.Fatal("gateway still listening after its last lease")
	}
	// A shared lease needs a role.
	if _, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "sh-3", Kind: api.KindAccel, DeviceName: "gpu",
		Offset: 0, Length: api.SlotUnits, Export: "rlc_three.0", Gateway: true}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("shared lease without a role: %v", err)
	}
}

func TestAccelRoleConfig(t *testing.T) {
	_, srv := newFakeCP(t)
	r := start(t, testConfig(srv.URL, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := []byte("0123456789abcdef0123456789abcdef")
	for _, shared := range []bool{false, true} {
		lease := fmt.Sprintf("aes-%v", shared)
		resp, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: lease, Kind: api.KindAccel, DeviceName: "gpu",
			Offset: 0, Length: api.SlotUnits, Export: "rlc_" + lease + ".0", Role: "aesgcm", RoleConfig: &api.RoleConfig{Config: key}, Gateway: shared})
		if err != nil {
			t.Fatal(err)
		}
		u, cred := accelURI(t, resp.URI)
		c, err := accel.Dial(ctx, u.Host, []byte(cred))
		if err != nil {
			t.Fatal(err)
		}
		nonce := []byte("twelve bytes")
		out, err := c.Call(ctx, "seal", append(append([]byte(nil), nonce...), "secret"...))
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := aes.NewCipher(key)
		g, _ := cipher.NewGCM(b)
		if pt, err := g.Open(nil, nonce, out, nil); err != nil || string(pt) != "secret" {
			t.Fatalf("shared=%v: the slot did not seal with the lease's key: %q %v", shared, pt, err)
		}
		if err := r.a.Teardown(ctx, lease); err != nil {
			t.Fatal(err)
		}
	}
	// A bad config is the borrower's error, and its key is not quoted.
	_, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "aes-bad", Kind: api.KindAccel, DeviceName: "gpu",
		Offset: 0, Length: api.SlotUnits, Export: "rlc_bad.0", Role: "aesgcm", RoleConfig: &api.RoleConfig{Config: []byte("short-key")}})
	if !errors.Is(err, ErrBadRequest) || strings.Contains(err.Error(), "short-key") {
		t.Fatalf("bad AES key: %v", err)
	}
	_, err = r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "big", Kind: api.KindAccel, DeviceName: "gpu",
		Offset: 0, Length: api.SlotUnits, Export: "rlc_big.0", Role: "mct", RoleConfig: &api.RoleConfig{Config: make([]byte, api.MaxRoleConfig+1)}})
	if !errors.Is(err, ErrBadRequest) {
		t.Fatalf("oversized role config: %v", err)
	}
	if len(r.a.Leases()) != 0 {
		t.Fatalf("failed prepares left %v", r.a.Leases())
	}
}

// TestPreviousAddresses: the ports a restored accel export's previous URI
// names, for its slots (dedicated) or its gateway (shared).
func TestPreviousAddresses(t *testing.T) {
	for _, tc := range []struct {
		uri     string
		slots   []string
		gateway string
	}{
		{"", nil, ""},
		{"rialto-accel://10.0.0.1:4100/x", []string{"4100"}, ""},
		{"rialto-accel://10.0.0.1:4100/x?slots=10.0.0.1:4101,10.0.0.1:4105", []string{"4100", "4101", "4105"}, ""},
		{"rialto-accel://[::1]:4100/x?slots=[::1]:4101", []string{"4100", "4101"}, ""},
		{"rialto-accel://10.0.0.1:4200/x?gateway=mct", nil, "4200"},
		{"rialto-accel://10.0.0.1/x", nil, ""},
		{"rialto-accel://10.0.0.1:4100/x?slots=nohost", nil, ""},
		{"://bad", nil, ""},
	} {
		e := Export{URI: tc.uri}
		if got := previousPorts(e); strings.Join(got, ",") != strings.Join(tc.slots, ",") {
			t.Errorf("previousPorts(%q) = %v, want %v", tc.uri, got, tc.slots)
		}
		if got := gatewayPort(e); got != tc.gateway {
			t.Errorf("gatewayPort(%q) = %q, want %q", tc.uri, got, tc.gateway)
		}
	}
}

// TestAccelSlotShares: shares of one slot (slot units) of one role join
// the gateway on one slot: the role is loaded there once, each lease's
// calls are answered, a share of another role never lands on that slot,
// and the slot is freed (credential cleared, role unloaded) only with its
// last share.
func TestAccelSlotShares(t *testing.T) {
	_, srv := newFakeCP(t)
	r := start(t, testConfig(srv.URL, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const q = api.SlotUnits / 4
	prep := func(lease string, off int64, role string) (api.PrepareResponse, error) {
		return r.a.Prepare(ctx, api.PrepareRequest{LeaseID: lease, Kind: api.KindAccel, Mode: api.ModeShared, DeviceName: "gpu",
			Offset: off, Length: q, Export: "rlc_" + lease + ".0", Role: role, Gateway: true})
	}
	drv := r.a.drivers[api.KindAccel].(*AccelDriver)
	app := drv.Appliance("gpu")
	var conns []*accel.Conn
	for i := range 4 {
		resp, err := prep(fmt.Sprint("q", i), int64(i)*q, "sha256")
		if err != nil {
			t.Fatal(err)
		}
		c, _, _ := dialAccel(ctx, t, resp.URI)
		conns = append(conns, c)
	}
	s0, _ := app.Slot(0)
	if gs := drv.Gateways(); len(gs) != 1 || gs[0].Leases != 4 || gs[0].Slots != 1 {
		t.Fatalf("four shares of one slot: gateways %+v", gs)
	}
	// Each lease's share (slot units) is its weight at the gateway.
	drv.mu.Lock()
	for _, g := range drv.gws.gws {
		for _, ls := range g.g.Leases() {
			if ls.Weight != q {
				t.Errorf("lease %s weighs %d at the gateway, want its share %d", ls.Lease, ls.Weight, q)
			}
		}
	}
	drv.mu.Unlock()
	if s1, _ := app.Slot(1); s0.Role != "sha256" || !s0.Leased || s1.Role != "" || s1.Leased {
		t.Fatalf("slot 0 %q leased %v, slot 1 %q leased %v", s0.Role, s0.Leased, s1.Role, s1.Leased)
	}
	want := sha256.Sum256([]byte("abc"))
	for i, c := range conns {
		if out, err := c.Call(ctx, "sum", []byte("abc")); err != nil || !bytes.Equal(out, want[:]) {
			t.Fatalf("lease q%d: %x %v", i, out, err)
		}
	}
	// Another role's share is refused on the slot sha256 holds (even in
	// free room), and takes the other slot.
	if _, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "o", Kind: api.KindAccel, Mode: api.ModeShared, DeviceName: "gpu",
		Offset: 0, Length: 1, Export: "rlc_o.0", Role: "echo", Gateway: true}); err == nil {
		t.Fatal("a share of another role joined the slot of sha256")
	}
	if _, err := prep("e", api.SlotUnits, "echo"); err != nil {
		t.Fatal(err)
	}
	if gs := drv.Gateways(); len(gs) != 2 {
		t.Fatalf("two roles, two gateways: %+v", gs)
	}
	for i := range 3 {
		if err := r.a.Teardown(ctx, fmt.Sprint("q", i)); err != nil {
			t.Fatal(err)
		}
	}
	if s, _ := app.Slot(0); s.Role != "sha256" || !s.Leased || s.Generation != s0.Generation {
		t.Fatalf("slot 0 with one share left: role %q leased %v generation %d (was %d)", s.Role, s.Leased, s.Generation, s0.Generation)
	}
	if out, err := conns[3].Call(ctx, "sum", []byte("abc")); err != nil || !bytes.Equal(out, want[:]) {
		t.Fatalf("the last share after three left: %x %v", out, err)
	}
	if err := r.a.Teardown(ctx, "q3"); err != nil {
		t.Fatal(err)
	}
	if s, _ := app.Slot(0); s.Role != "" || s.Leased {
		t.Fatalf("slot 0 after its last share: role %q leased %v", s.Role, s.Leased)
	}
	if gs := drv.Gateways(); len(gs) != 1 || gs[0].Role != "echo" {
		t.Fatalf("gateways: %+v", gs)
	}
	if err := r.a.Teardown(ctx, "e"); err != nil {
		t.Fatal(err)
	}
	// A share straddling two slots is refused.
	if _, err := prep("x", api.SlotUnits-1, "sha256"); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a share over two slots: %v", err)
	}
}
