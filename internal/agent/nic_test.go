package agent

import (
	"context"
	"crypto/tls"
	"log/slog"
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

// TestNICDriver: the driver lends host 1's uplink under TLS with a node
// certificate (UseTLS, as an agent enrolled with the cluster CA does); a
// borrower on host 0 attaches the lease's rialto-nics:// URI with the
// cluster CA and reaches the outside through it until the lease is torn
// down.
func TestNICDriver(t *testing.T) {
	lab, out := nicLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ping := func() bool {
		return lab.Command(ctx, 0, "busybox", "ping", "-c", "1", "-W", "1", out.Server.String()).Run() == nil
	}
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.ServerConfig("node1", []string{lab.Host(1).Addr.String()}, tls.NoClientCert, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := NewNICDriver(slog.New(slog.DiscardHandler))
	d.UseTLS(srv, func() *tls.Config { return ca.ClientConfig(nil) }, nil)
	defer d.Close()
	var dev DeviceConfig
	var resp api.PrepareResponse
	e := Export{Request: api.PrepareRequest{LeaseID: "lease-1", Kind: api.KindNIC, DeviceName: "wan", Length: 2_000_000,
		Export: "secret-export-name-0123456789"}}
	// The lender's kernel work happens on a thread inside host 1.
	ln, err := lab.Listen(ctx, 1, "tcp", net.JoinHostPort(lab.Host(1).Addr.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	e.Endpoint = ln.Addr().String()
	if err := lab.Do(1, func() error {
		var err error
		if dev, err = d.Open(ctx, DeviceConfig{Name: "wan", Kind: api.KindNIC, Path: "wan0", Size: 125_000_000}); err != nil {
			return err
		}
		e.Device = dev
		resp, err = d.Prepare(ctx, e)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if dev.Attributes["iface"] != "wan0" || dev.Attributes["routes"] == "" {
		t.Errorf("attributes %v", dev.Attributes)
	}
	sctx, scancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- d.Serve(sctx, ln) }()
	defer func() { scancel(); <-served }()

	u, err := nic.ParseURI(resp.URI)
	if err != nil || !u.TLS || !strings.HasPrefix(resp.URI, "rialto-nics://") {
		t.Fatalf("URI %s (%v), want rialto-nics://", u.Redacted(), err)
	}
	if ping() {
		t.Fatal("the outside answers before the attach")
	}
	var ifc *nic.Interface
	if err := lab.Do(0, func() error {
		var err error
		ifc, err = nic.Attach(ctx, nic.Config{Members: []nic.Member{u.Member()}, TLS: func() *tls.Config { return ca.ClientConfig(nil) }})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ifc.Close()
	if m := ifc.Members(); m[0].Rate != 16_000_000 {
		t.Errorf("lease rate %d bit/s, want the 2 MB/s placement gave it", m[0].Rate)
	}
	if !ping() {
		t.Fatal("no ping through the lent NIC")
	}
	if err := lab.Do(1, func() error { return d.Teardown(ctx, e) }); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ifc.Members()[0].Up {
		if time.Now().After(deadline) {
			t.Fatal("the borrower is still connected after the teardown")
		}
		<-tick.C
	}
	if ping() {
		t.Error("the outside still answers after the teardown")
	}
}

// nsNICDriver is the NIC driver with its kernel work (the lender's
// nftables and policy routing, the leases' TUN interfaces) in lab host
// host's namespace, where the lent interface is, for an agent that runs
// in the test's: it serves the tunnels on the agent's NIC endpoint there.
type nsNICDriver struct {
	*NICDriver
	lab  *netns.Lab
	host int
}

func (d nsNICDriver) Open(ctx context.Context, dev DeviceConfig) (out DeviceConfig, err error) {
	err = d.lab.Do(d.host, func() error {
		var err error
		out, err = d.NICDriver.Open(ctx, dev)
		return err
	})
	return out, err
}

func (d nsNICDriver) Prepare(ctx context.Context, e Export) (resp api.PrepareResponse, err error) {
	err = d.lab.Do(d.host, func() error {
		var err error
		resp, err = d.NICDriver.Prepare(ctx, e)
		return err
	})
	return resp, err
}

func (d nsNICDriver) Teardown(ctx context.Context, e Export) error {
	return d.lab.Do(d.host, func() error { return d.NICDriver.Teardown(ctx, e) })
}

func (d nsNICDriver) Close() error {
	return d.lab.Do(d.host, d.NICDriver.Close)
}

// nicLab is a lab of a borrower (host 0) and a lender (host 1) whose wan0
// leads to the outside, removed when the test ends (after the agents it
// ran, which t.Cleanup stops); it skips the test if the machine cannot
// build one or lacks busybox.
func nicLab(t *testing.T) (*netns.Lab, *netns.Outside) {
	t.Helper()
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	if err := nic.Available(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lab, err := netns.New(ctx, netns.Config{Hosts: 2, Prefix: "rialto-agnic"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lab.Close() })
	out, err := lab.AddOutside(ctx, netns.OutsideConfig{Hosts: []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	return lab, out
}
