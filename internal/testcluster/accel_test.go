package testcluster

import (
	"bytes"
	"net/url"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
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
