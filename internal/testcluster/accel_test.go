package testcluster

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/mct"
)

func TestAccelLease(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: []agent.DeviceConfig{
		{Name: "accel0", Kind: api.KindAccel, Size: 2, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}})
	ctx := ctxT(t)
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(l.URI)
	if l.State != api.LeaseActive || err != nil || u.Scheme != "rialto-accel" {
		t.Fatalf("accel lease %+v (%v)", l, err)
	}
	conn, err := accel.Dial(ctx, u.Host, []byte(strings.TrimPrefix(u.Path, "/")))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := conn.Call(ctx, "sum", []byte("abc"))
	conn.Close()
	if err != nil || len(sum) != 32 || !bytes.HasPrefix(sum, []byte{0xba, 0x78, 0x16, 0xbf}) {
		t.Fatalf("sha256 role: %x %v", sum, err)
	}
	if _, err := c.Client().ReleaseLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	lender := c.NodeByID(l.NodeID)
	c.Eventually("slot released", func() bool { return !lender.Serves(l.ID) })
}

// TestAccelUnknownRole: a role no lender's device offers (each agent
// registers its devices' roles) is infeasible before any lender is asked:
// 422 naming the role and the roles the cluster offers, and no lease left
// behind (it used to be placed, refused by every lender in turn and left
// failed, with a 503).
func TestAccelUnknownRole(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: []agent.DeviceConfig{
		{Name: "accel0", Kind: api.KindAccel, Size: 2, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}})
	ctx := ctxT(t)
	offered := "roles offered: " + strings.Join(roles.Names(), ", ")
	for _, req := range []api.LeaseRequest{
		{Kind: api.KindAccel, Role: "nosuch"},
		{Kind: api.KindAccel, Mode: api.ModeShared, Role: "nosuch"},
	} {
		_, err := c.Client().CreateLease(ctx, req)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeInfeasible || ae.Status != 422 ||
			!strings.Contains(ae.Message, "role nosuch") || !strings.Contains(ae.Message, offered) {
			t.Fatalf("%+v: %v, want 422 infeasible naming role nosuch and %s", req, err, offered)
		}
	}
	if ls, err := c.Client().AllLeases(ctx); err != nil || len(ls) != 0 {
		t.Fatalf("leases left: %v %+v", err, ls)
	}
	// A role the devices offer is lent.
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "echo"})
	if err != nil || l.State != api.LeaseActive {
		t.Fatalf("%v %+v", err, l)
	}
}

// TestAccelSharedLeases: two borrowers' shared MCT leases (with the rule
// set as role config) are served by one batching gateway on the lender;
// both get brute-force-correct answers while calling at once; releasing one
// cuts its connection and credential, and the other goes on unharmed.
func TestAccelSharedLeases(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "accel0", Kind: api.KindAccel, Size: 3, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}})
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(7, 8))
	rs := mct.Generate(rng, 200)
	cfg, _ := json.Marshal(rs)
	eng, err := mct.Compile(rs)
	if err != nil {
		t.Fatal(err)
	}
	qs, _ := eng.EncodeAll(mct.GenerateQueries(rng, 64))
	req := api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "mct", RoleConfig: &api.RoleConfig{Config: cfg}}
	var leases []api.Lease
	var conns []*accel.Conn
	for _, who := range []string{"alice", "bob"} {
		req.Borrower = who
		l, err := c.Client().CreateLease(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(l.URI)
		if err != nil || l.Mode != api.ModeShared || u.Query().Get("gateway") != "mct" {
			t.Fatalf("shared lease %+v", l)
		}
		conn, err := accel.Dial(ctx, u.Host, []byte(strings.TrimPrefix(u.Path, "/")))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		leases, conns = append(leases, l), append(conns, conn)
	}
	if a, b := leases[0].URI, leases[1].URI; a[:strings.LastIndex(a, "/")] != b[:strings.LastIndex(b, "/")] {
		t.Fatalf("two shared leases of one role and config, two gateways: %s %s", a, b)
	}
	check := func(conn *accel.Conn) error {
		outs, err := conn.CallBatch(ctx, "match", [][]byte{qs[:8*mct.QuerySize], qs[8*mct.QuerySize : 16*mct.QuerySize]})
		if err != nil {
			return err
		}
		for i, out := range outs {
			for j := 0; j < 8; j++ {
				want, _, _ := eng.BruteForce(qs[(8*i+j)*mct.QuerySize:])
				if got := binary.LittleEndian.Uint32(out[4*j:]); got != want {
					return fmt.Errorf("query %d: %d, brute force %d", 8*i+j, got, want)
				}
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				if err := check(conn); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// The rule set is not in the lease, nor in its listing.
	all, err := c.Client().Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(all); bytes.Contains(b, []byte("role_config")) || bytes.Contains(b, []byte(base64.StdEncoding.EncodeToString(cfg[:48]))) {
		t.Fatal("lease listing shows the role config")
	}
	// Bob keeps calling while Alice's lease is released.
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 200; i++ {
			if err := check(conns[1]); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	if _, err := c.Client().ReleaseLease(ctx, leases[0].ID); err != nil {
		t.Fatal(err)
	}
	lender := c.NodeByID(leases[0].NodeID)
	c.Eventually("alice's lease torn down", func() bool { return !lender.Serves(leases[0].ID) })
	if err := check(conns[0]); err == nil {
		t.Fatal("a released lease's connection still reaches the gateway")
	}
	u, _ := url.Parse(leases[0].URI)
	if conn, err := accel.Dial(ctx, u.Host, []byte(strings.TrimPrefix(u.Path, "/"))); err == nil {
		conn.Close()
		t.Fatal("the gateway accepts a released lease's credential")
	}
	if err := <-done; err != nil {
		t.Fatalf("bob's calls during alice's release: %v", err)
	}
}

// TestAccelShares: shares, not slots. Eight shared leases of a quarter
// slot each fit on a two-slot device, through the control plane and a
// lender agent: one gateway serves them all and answers every lease's
// calls; the device's allocation counts the shares (two slots); a ninth
// share and a dedicated slot are refused while the shares fill both
// slots, and once the four shares of one slot are released the slot is
// whole again and a dedicated lease takes it.
func TestAccelShares(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "accel0", Kind: api.KindAccel, Size: 2, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}})
	ctx := ctxT(t)
	req := api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "sha256", Share: 0.25}
	var leases []api.Lease
	var conns []*accel.Conn
	for i := range 8 {
		l, err := c.Client().CreateLease(ctx, req)
		if err != nil {
			t.Fatalf("shared lease %d: %v", i, err)
		}
		u, err := url.Parse(l.URI)
		if err != nil || l.Mode != api.ModeShared || l.Size != api.SlotUnits/4 || len(l.Parts) != 1 || u.Query().Get("gateway") != "sha256" {
			t.Fatalf("shared lease %d: %+v (%v)", i, l, err)
		}
		if len(leases) > 0 && u.Host != mustHost(t, leases[0].URI) {
			t.Fatalf("lease %d is served at %s, lease 0 at %s: not one gateway", i, u.Host, mustHost(t, leases[0].URI))
		}
		conn, err := accel.Dial(ctx, u.Host, []byte(strings.TrimPrefix(u.Path, "/")))
		if err != nil {
			t.Fatalf("lease %d: %v", i, err)
		}
		defer conn.Close()
		leases, conns = append(leases, l), append(conns, conn)
	}
	devs, err := c.Client().Devices(ctx)
	if err != nil || len(devs) != 1 || devs[0].Capacity != 2*api.SlotUnits || devs[0].Allocated != 2*api.SlotUnits {
		t.Fatalf("devices: %+v %v", devs, err)
	}
	// Every lease's calls are answered, all at once.
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 20 {
				in := []byte(fmt.Sprintf("lease %d call %d", i, k))
				want := sha256.Sum256(in)
				out, err := conn.Call(ctx, "sum", in)
				if err != nil || !bytes.Equal(out, want[:]) {
					t.Errorf("lease %d call %d: %x %v", i, k, out, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if _, err := c.Client().CreateLease(ctx, req); err == nil || !strings.Contains(err.Error(), "infeasible") {
		t.Fatalf("a ninth share on a full device: %v", err)
	}
	if _, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"}); err == nil {
		t.Fatal("a dedicated slot beside eight quarter shares of two slots")
	}
	// Release the four shares of the first lease's slot.
	slot := leases[0].Parts[0].Offset / api.SlotUnits
	var kept []int
	for i, l := range leases {
		if l.Parts[0].Offset/api.SlotUnits != slot {
			kept = append(kept, i)
			continue
		}
		if _, err := c.Client().ReleaseLease(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
		c.Eventually("share torn down", func() bool { return !c.NodeByID(l.NodeID).Serves(l.ID) })
	}
	if len(kept) != 4 {
		t.Fatalf("%d shares outside slot %d, want 4", len(kept), slot)
	}
	d, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"})
	if err != nil || d.Mode != api.ModeDedicated || d.Parts[0].Offset != slot*api.SlotUnits || d.Parts[0].Length != api.SlotUnits {
		t.Fatalf("dedicated slot after the shares of slot %d left: %+v %v", slot, d, err)
	}
	u, _ := url.Parse(d.URI)
	dconn, err := accel.Dial(ctx, u.Host, []byte(strings.TrimPrefix(u.Path, "/")))
	if err != nil {
		t.Fatal(err)
	}
	defer dconn.Close()
	want := sha256.Sum256([]byte("abc"))
	for _, conn := range append([]*accel.Conn{dconn}, conns[kept[0]], conns[kept[3]]) {
		if out, err := conn.Call(ctx, "sum", []byte("abc")); err != nil || !bytes.Equal(out, want[:]) {
			t.Fatalf("after the release: %x %v", out, err)
		}
	}
}

func mustHost(t *testing.T, uri string) string {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestDrainAccelShares: a drain places shared leases again as shares of
// their gateway: the two shares on the drained node join the slot the
// same role already shares on the other node (0.25 + 0.25 + 0.5 of it),
// and every lease's calls are answered at its new URI.
func TestDrainAccelShares(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2, Devices: []agent.DeviceConfig{
		{Name: "accel0", Kind: api.KindAccel, Size: 1, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}})
	ctx := ctxT(t)
	cl := c.Client()
	target, other := c.Nodes[0], c.Nodes[1]
	share := func(f float64, node string) api.Lease {
		t.Helper()
		l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "sha256", Share: f, Affinity: []string{node}})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	stay := share(0.25, other.Name)
	moving := []api.Lease{share(0.25, target.Name), share(0.5, target.Name)}
	if _, err := cl.DrainNode(ctx, target.Name, api.DrainRequest{DeadlineSeconds: 600}); err != nil {
		t.Fatal(err)
	}
	var d api.Drain
	Eventually(t, 90*time.Second, "the drain's end", func() bool {
		var err error
		d, err = cl.NodeDrain(ctx, target.ID())
		return err == nil && d.State != api.DrainRunning
	})
	if d.State != api.DrainDone {
		t.Fatalf("drain: %+v", d)
	}
	want := sha256.Sum256([]byte("abc"))
	units := int64(0)
	for _, l := range append(moving, stay) {
		got, err := cl.Lease(ctx, l.ID)
		if err != nil || got.NodeID != other.ID() || len(got.Parts) != 1 || got.Parts[0].Length != l.Parts[0].Length {
			t.Fatalf("lease %s after the drain: %+v %v", l.ID, got, err)
		}
		units += got.Parts[0].Length
		u, _ := url.Parse(got.URI)
		conn, err := accel.Dial(ctx, u.Host, []byte(strings.TrimPrefix(u.Path, "/")))
		if err != nil {
			t.Fatal(err)
		}
		out, err := conn.Call(ctx, "sum", []byte("abc"))
		conn.Close()
		if err != nil || !bytes.Equal(out, want[:]) {
			t.Fatalf("lease %s after the drain: %x %v", l.ID, out, err)
		}
	}
	if units != api.SlotUnits {
		t.Fatalf("the shares hold %d units of the other node's slot, want %d", units, api.SlotUnits)
	}
}
