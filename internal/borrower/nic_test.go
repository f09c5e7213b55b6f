package borrower

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/nic"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestAttachNICNeedsCA: a NIC lease whose lender serves rialto-nics:// is
// refused without a cluster CA, saying how to give one, before anything
// is dialled; the credential stays out of the error.
func TestAttachNICNeedsCA(t *testing.T) {
	const cred = "rlc_nic-needs-ca.0"
	uri := nic.URI{Address: "192.0.2.7:7300", Credential: cred, TLS: true}.String()
	l := api.Lease{ID: "lease-nic", Kind: api.KindNIC, State: api.LeaseActive, URI: uri, Parts: []api.Part{{URI: uri}}}
	_, err := AttachNIC(context.Background(), l, NICConfig{})
	if !errors.Is(err, nic.ErrNoCA) {
		t.Fatalf("AttachNIC without a CA: %v, want nic.ErrNoCA", err)
	}
	for _, want := range []string{"lease-nic", "192.0.2.7:7300", "rialto-nics://", "--cacert"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), cred) {
		t.Errorf("error quotes the credential: %v", err)
	}
}

// TestAttachNIC: a NIC lease record with its lender's rialto-nics:// URI
// attaches, verified with the cluster CA, as an interface through which
// the borrower's namespace reaches the outside.
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
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.ServerConfig("node1", []string{lab.Host(1).Addr.String()}, tls.NoClientCert, 0)
	if err != nil {
		t.Fatal(err)
	}
	var lender *nic.Lender
	if err := lab.Do(1, func() error {
		var err error
		if lender, err = nic.NewLender(ctx, nic.LenderConfig{Iface: "wan0", TLS: srv}); err != nil {
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

	uri := nic.URI{Address: ln.Addr().String(), Credential: cred, TLS: true}.String()
	l := api.Lease{ID: "lease-nic", Kind: api.KindNIC, State: api.LeaseActive, URI: uri, Parts: []api.Part{{URI: uri}}}
	var ifc *NICAttachment
	if err := lab.Do(0, func() error {
		var err error
		ifc, err = AttachNIC(ctx, l, NICConfig{Name: "rnic7", TLS: StaticTLS(ca.ClientConfig(nil))})
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
