package testcluster

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestAgentRefusesNodeCertificateAsControlPlane: the cluster CA issues
// nodes' certificates for the hosts their joins declare, which may be the
// control plane's address. An agent given the cluster CA sends its
// bootstrap token (and, later, its node credential) only to a control
// plane's certificate: at a server presenting a node's certificate for
// the control plane's address, its join fails at the handshake, and
// nothing reaches the server. Its peer probes, which reach other agents'
// APIs (node certificates), still work: the links between the cluster's
// agents are up over TLS.
func TestAgentRefusesNodeCertificateAsControlPlane(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 2})
	ctx := ctxT(t)

	iss, err := c.CA.Issue(pki.Request{CommonName: "node-x", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth | pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	rogue := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		http.Error(w, `{"error":{"code":"unavailable","message":"try again"}}`, http.StatusServiceUnavailable)
	}))
	rogue.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	rogue.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	rogue.StartTLS()
	defer rogue.Close()

	logs := newLogRecorder()
	a, err := agent.New(agent.Config{
		ControlPlane: rogue.URL, BootstrapToken: BootstrapToken, Name: "victim", StateDir: filepath.Join(t.TempDir(), "victim"),
		Listen: "127.0.0.1", CAFile: c.CA.CertFile(), Logger: slog.New(logs),
		Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 1 << 20}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The second join begins once the first has ended (failed).
	var joins atomic.Int32
	second := make(chan struct{})
	hook := func(ctx context.Context) {
		if joins.Add(1) == 2 {
			close(second)
			<-ctx.Done()
		}
	}
	a.Faults.BeforeJoin.Store(&hook)
	actx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	select {
	case <-second:
	case err := <-done:
		t.Fatalf("the agent stopped: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("the agent did not try to join twice")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("agent: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Error("the agent did not stop")
	}
	mu.Lock()
	got := append([]string(nil), seen...)
	mu.Unlock()
	if len(got) != 0 {
		t.Fatalf("the agent called a node's certificate at the control plane's address: %q", got)
	}
	if !logs.logged("join failed") {
		t.Error("the failed join was not logged")
	}

	// The cluster's agents still probe each other over TLS.
	c.Eventually("peer links up", func() bool {
		c.Heartbeat()
		top, err := c.Client().Topology(ctx)
		if err != nil {
			t.Fatal(err)
		}
		up := 0
		for _, l := range top.Links {
			if l.To != "controlplane" && l.From != l.To && l.Status == "up" {
				up++
			}
		}
		return up >= 2
	})
}
