package agent

import (
	"bytes"
	"context"
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
		Offset: 0, Length: 2, Export: "rlc_accel.0", Role: "echo"})
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
		Offset: 1, Length: 1, Export: "x", Role: "no-such-role"}); err == nil {
		t.Fatal("unknown role accepted")
	}
	if len(r.a.Leases()) != 0 {
		t.Fatalf("failed prepare left %v", r.a.Leases())
	}
}
