package testcluster

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
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
