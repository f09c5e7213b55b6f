package borrower

import (
	"context"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/nic"
	"github.com/rialto-project/rialto/internal/netns"
)

// TestAttachNIC: a NIC lease record with its lender's URI attaches as an
// interface through which the borrower's namespace reaches the outside.
func TestAttachNIC(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	if err := nic.Available(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lab, err := netns.New(ctx, netns.Config{Hosts: 2, Prefix: "rialto-bnic"})
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	out, err := lab.AddOutside(ctx, netns.OutsideConfig{Hosts: []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	const cred = "rlc_nic-test-credential.0"
	var lender *nic.Lender
	if err := lab.Do(1, func() error {
		var err error
		if lender, err = nic.NewLender(ctx, nic.LenderConfig{Iface: "wan0"}); err != nil {
			return err
		}
		return lender.AddLease(ctx, nic.LeaseSpec{ID: "lease-nic", Credential: cred})
	}); err != nil {
		t.Fatal(err)
	}
	defer lender.Close()
	ln, err := lab.Listen(ctx, 1, "tcp", net.JoinHostPort(lab.Host(1).Addr.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- lender.Serve(sctx, ln) }()
	defer func() { scancel(); <-served }()

	uri := nic.URI{Address: ln.Addr().String(), Credential: cred}.String()
	l := api.Lease{ID: "lease-nic", Kind: api.KindNIC, State: api.LeaseActive, URI: uri, Parts: []api.Part{{URI: uri}}}
	var ifc *NICAttachment
	if err := lab.Do(0, func() error {
		var err error
		ifc, err = AttachNIC(ctx, l, NICConfig{Name: "rnic7"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ifc.Close()
	if ifc.Name() != "rnic7" || !ifc.Addr().IsValid() {
		t.Errorf("interface %s, address %v", ifc.Name(), ifc.Addr())
	}
	if err := lab.Command(ctx, 0, "busybox", "ping", "-c", "1", "-W", "2", out.Server.String()).Run(); err != nil {
		t.Fatalf("no ping through the attached lease: %v", err)
	}
	// The record says the part is lost: its lender is dropped, for good.
	if got := ifc.DropLost(l); len(got) != 0 {
		t.Fatalf("dropped %v while nothing is lost", got)
	}
	lost := l
	lost.Parts = []api.Part{{URI: uri, State: api.PartLost}}
	if got := ifc.DropLost(lost); len(got) != 1 || got[0] != 0 || !ifc.Members()[0].Dropped || ifc.Lenders() != 0 {
		t.Fatalf("DropLost: %v, members %+v", got, ifc.Members())
	}
	if got := ifc.DropLost(lost); len(got) != 0 {
		t.Fatalf("dropped again: %v", got)
	}
	if err := lab.Command(ctx, 0, "busybox", "ping", "-c", "1", "-W", "1", out.Server.String()).Run(); err == nil {
		t.Fatal("a ping went through a dropped lender")
	}
}
