package testcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/pki"
)

// dataTLS is a borrower's configuration: it trusts the cluster CA.
func dataTLS(t *testing.T, c *Cluster) *tls.Config {
	t.Helper()
	cfg, err := pki.LoadClientTLS(c.CA.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func tlsDevices() []agent.DeviceConfig {
	return []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20},
		{Name: "mem0", Kind: api.KindMemory, Size: 8 << 20},
		{Name: "accel0", Kind: api.KindAccel, Size: 3, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}
}

// TestTLSDataPlanes: in a cluster with a CA, every data plane requires TLS
// with the lender's node certificate: leases carry nbds://,
// rialto-mems:// and rialto-accels:// URIs, a borrower trusting the
// cluster CA reads and writes them (a composed volume's parts, a memory
// region, a dedicated slot and a shared gateway, which dials its slots
// over TLS too), and plaintext clients and clients trusting another CA are
// refused before any credential is looked at.
func TestTLSDataPlanes(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 2, Devices: tlsDevices()})
	ctx := ctxT(t)
	cfg := dataTLS(t, c)
	other, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	otherCfg, err := pki.LoadClientTLS(other.CertFile())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("block", func(t *testing.T) {
		l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20, Mode: api.ModeComposed, Count: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Client().ReleaseLease(ctx, l.ID)
		uris, err := borrower.BlockURIs(l)
		if err != nil || len(uris) != 2 {
			t.Fatalf("URIs %v, %v", uris, err)
		}
		for _, s := range uris {
			if !strings.HasPrefix(s, "nbds://") {
				t.Fatalf("part URI %s is not nbds://", strings.SplitN(s, "/", 4)[2])
			}
			u, _ := nbd.ParseURI(s)
			if _, err := nbd.Dial(ctx, u.Network, u.Address, u.Export); !errors.Is(err, nbd.ErrTLSRequired) {
				t.Errorf("plaintext client: %v, want ErrTLSRequired", err)
			}
			if _, err := u.Dial(ctx, otherCfg); err == nil || !strings.Contains(err.Error(), "unknown authority") {
				t.Errorf("client trusting another CA: %v", err)
			}
		}
		att, err := borrower.Attach(ctx, c.Client(), l, borrower.AttachConfig{TLS: borrower.StaticTLS(cfg)})
		if err != nil {
			t.Fatal(err)
		}
		defer att.Close()
		nc, err := nbd.DialURI(ctx, att.URI())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		want := bytes.Repeat([]byte("tls-composed-"), 40000)
		if _, err := nc.WriteAt(want, 12345); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		if _, err := nc.ReadAt(got, 12345); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read back through the TLS parts: %v", err)
		}
	})

	t.Run("memory", func(t *testing.T) {
		l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Client().ReleaseLease(ctx, l.ID)
		if !strings.HasPrefix(l.URI, "rialto-mems://") {
			t.Fatalf("memory URI scheme: %s", strings.SplitN(l.URI, ":", 2)[0])
		}
		u, _ := protocol.ParseURI(l.URI)
		if _, err := client.Dial(ctx, u.Address, u.Credential, client.Options{}); !errors.Is(err, protocol.ErrTLSRequired) {
			t.Errorf("plaintext client: %v, want ErrTLSRequired", err)
		}
		if _, err := client.Dial(ctx, u.Address, u.Credential, client.Options{TLS: otherCfg}); err == nil || !strings.Contains(err.Error(), "unknown authority") {
			t.Errorf("client trusting another CA: %v", err)
		}
		mc, err := borrower.DialMemory(ctx, l, 0, client.Options{TLS: cfg})
		if err != nil {
			t.Fatal(err)
		}
		defer mc.Close()
		want := bytes.Repeat([]byte{0x5a}, 300000)
		for _, ch := range []client.Channel{client.ChannelSync, client.ChannelBulk, client.ChannelQueue} {
			if err := mc.Write(ctx, ch, want, 4096); err != nil {
				t.Fatalf("%v: %v", ch, err)
			}
			got := make([]byte, len(want))
			if err := mc.Read(ctx, ch, got, 4096); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%v: read back: %v", ch, err)
			}
		}
	})

	t.Run("accel", func(t *testing.T) {
		for _, mode := range []api.Mode{api.ModeDedicated, api.ModeShared} {
			l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256", Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			slots, err := borrower.AccelSlots(l)
			if err != nil || !slots[0].TLS || !strings.HasPrefix(l.URI, "rialto-accels://") {
				t.Fatalf("%s lease: slots %+v, %v", mode, slots, err)
			}
			if _, err := accel.Dial(ctx, slots[0].Address, []byte(slots[0].Credential)); !errors.Is(err, accel.ErrTLSRequired) {
				t.Errorf("%s: plaintext client: %v, want ErrTLSRequired", mode, err)
			}
			if _, err := borrower.DialAccel(ctx, slots[0], otherCfg); err == nil || !strings.Contains(err.Error(), "unknown authority") {
				t.Errorf("%s: client trusting another CA: %v", mode, err)
			}
			conn, err := borrower.DialAccel(ctx, slots[0], cfg)
			if err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			sum, err := conn.Call(ctx, "sum", []byte("abc"))
			conn.Close()
			if err != nil || len(sum) != 32 || !bytes.HasPrefix(sum, []byte{0xba, 0x78, 0x16, 0xbf}) {
				t.Fatalf("%s: sha256 over TLS: %x %v", mode, sum, err)
			}
			if _, err := c.Client().ReleaseLease(ctx, l.ID); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestTLSDataPlaneThirdParty: third-party NBD clients reach a lease with
// the cluster CA's certificate (libnbd's tls-certificates directory, the
// same files qemu reads), and refuse a server that presents a node
// certificate for another address, as an impostor holding another node's
// certificate would.
func TestTLSDataPlaneThirdParty(t *testing.T) {
	nbdinfo, err := exec.LookPath("nbdinfo")
	if err != nil {
		t.Skip("nbdinfo not installed")
	}
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1})
	ctx := ctxT(t)
	l := createBlock(t, c.Client(), 4<<20, api.ModeShared)
	dir := c.CA.Dir() // ca-cert.pem and ca-crl.pem, libnbd's names
	if out, err := exec.CommandContext(ctx, nbdinfo, "--size", l.URI+"?tls-certificates="+dir).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "4194304" {
		t.Fatalf("nbdinfo over TLS: %v: %s", err, out)
	}
	plain := "nbd://" + strings.TrimPrefix(l.URI, "nbds://")
	if out, err := exec.CommandContext(ctx, nbdinfo, "--size", plain).CombinedOutput(); err == nil {
		t.Fatalf("plaintext nbdinfo was served: %s", out)
	}

	// An impostor at another address with the node's certificate, which
	// names the node's own address only: refused by libnbd and the Go
	// client.
	n := c.Nodes[0]
	cert := nodeCert(t, n)
	srv := &nbd.Server{TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	u, _ := nbd.ParseURI(l.URI)
	if err := srv.AddExport(nbd.Export{Name: u.Export, Backend: nbd.NewMemBackend(4 << 20)}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no 127.0.0.2: %v", err)
	}
	if strings.HasPrefix(u.Address, "127.0.0.2:") {
		t.Fatal("the node listens on 127.0.0.2: pick another impostor address")
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx, ln) }()
	defer func() { cancel(); <-done }()
	fake := "nbds://" + ln.Addr().String() + "/" + u.Export
	if out, err := exec.CommandContext(ctx, nbdinfo, "--size", fake+"?tls-certificates="+dir).CombinedOutput(); err == nil {
		t.Fatalf("nbdinfo accepted a certificate for another address: %s", out)
	}
	fu, _ := nbd.ParseURI(fake)
	if _, err := fu.Dial(ctx, dataTLS(t, c)); err == nil || !strings.Contains(err.Error(), "127.0.0.2") {
		t.Fatalf("Go client and a certificate for another address: %v", err)
	}
	// Revoked: a server presenting the node's certificate once it is on
	// the CRL beside ca-cert.pem is refused by libnbd and by a borrower
	// watching that file. (The agent itself joins again when the control
	// plane refuses its revoked certificate, and serves a new one: the
	// server here keeps presenting the revoked one.)
	if err := c.CA.Revoke(cert.Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	rsrv := &nbd.Server{TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	if err := rsrv.AddExport(nbd.Export{Name: u.Export, Backend: nbd.NewMemBackend(4 << 20)}); err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(u.Address)
	rln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	rdone := make(chan error, 1)
	go func() { rdone <- rsrv.Serve(sctx, rln) }()
	defer func() { cancel(); <-rdone }()
	revoked := "nbds://" + rln.Addr().String() + "/" + u.Export
	if out, err := exec.CommandContext(ctx, nbdinfo, "--size", revoked+"?tls-certificates="+dir).CombinedOutput(); err == nil {
		t.Fatalf("nbdinfo accepted a revoked node certificate: %s", out)
	}
	ru, _ := nbd.ParseURI(revoked)
	if _, err := ru.Dial(ctx, dataTLS(t, c)); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("Go client and a revoked node certificate: %v", err)
	}
}

// TestInsecureDataplane: an agent with Config.InsecureDataplane (rialto
// agent --insecure-dataplane) serves its data planes in plaintext beside
// enrolled, TLS peers: its leases carry plaintext URIs, their credentials
// are still checked, and the same borrower configuration reaches both.
func TestInsecureDataplane(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1, Devices: tlsDevices(), Configure: func(i int, cfg *agent.Config) {
		cfg.InsecureDataplane = true
	}})
	ctx := ctxT(t)
	l := createBlock(t, c.Client(), 4<<20, api.ModeShared)
	if !strings.HasPrefix(l.URI, "nbd://") {
		t.Fatalf("block URI of an insecure data plane: %s", strings.SplitN(l.URI, "/", 4)[2])
	}
	att, err := borrower.Attach(ctx, c.Client(), l, borrower.AttachConfig{TLS: borrower.StaticTLS(dataTLS(t, c))})
	if err != nil {
		t.Fatal(err)
	}
	att.Close()
	u, _ := nbd.ParseURI(l.URI)
	if _, err := nbd.Dial(ctx, u.Network, u.Address, u.Export+"x"); err == nil {
		t.Fatal("a wrong export name was served")
	}
	m, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.URI, "rialto-mem://") {
		t.Fatalf("memory URI of an insecure data plane: %s", strings.SplitN(m.URI, ":", 2)[0])
	}
	mc, err := borrower.DialMemory(ctx, m, 0, client.Options{TLS: dataTLS(t, c)})
	if err != nil {
		t.Fatal(err)
	}
	mc.Close()
	a, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	slots, _ := borrower.AccelSlots(a)
	if slots[0].TLS {
		t.Fatal("accel URI of an insecure data plane is rialto-accels://")
	}
	conn, err := borrower.DialAccel(ctx, slots[0], dataTLS(t, c))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if _, err := accel.Dial(ctx, slots[0].Address, []byte("wrong")); !errors.Is(err, accel.ErrAuth) {
		t.Fatalf("wrong accel credential: %v", err)
	}
}
