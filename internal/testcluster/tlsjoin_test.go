package testcluster

import (
	"context"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
)

// logRecorder is a slog handler that keeps the messages logged.
type logRecorder struct {
	mu   *sync.Mutex
	msgs *[]string
}

func newLogRecorder() logRecorder { return logRecorder{mu: new(sync.Mutex), msgs: new([]string)} }

func (l logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l logRecorder) WithGroup(string) slog.Handler            { return l }
func (l logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	*l.msgs = append(*l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}

// logged reports whether a message containing s was logged.
func (l logRecorder) logged(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range *l.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// TestTLSLeaseRightAfterJoin: the control plane registers a node when it
// answers its join, and may place a lease on it (and call its agent) at
// once, before the agent has taken the answer's node certificate. The
// agent's handshake waits for the certificate instead of failing with a
// TLS internal_error alert, and the lease is created. (bench/pgbench hit
// this: it creates leases as soon as the node is listed ready.)
func TestTLSLeaseRightAfterJoin(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1})
	ctx := ctxT(t)
	u, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogRecorder()
	a, err := agent.New(agent.Config{
		ControlPlane: c.URL, BootstrapToken: BootstrapToken, Name: "late", StateDir: filepath.Join(t.TempDir(), "late"),
		Listen: u.Hostname(), HeartbeatInterval: c.opts.HeartbeatInterval, Clock: c.Clock, CAFile: c.CA.CertFile(),
		Labels:  map[string]string{"joined": "late"},
		Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20}},
		Logger:  slog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	a.Faults.HoldJoinAnswer.Store(&hold)
	released := false
	release := func() {
		if !released {
			released = true
			close(hold)
		}
	}
	actx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	defer func() {
		release()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("the agent did not stop")
		}
	}()

	// The control plane has registered the node (as bench/pgbench waits
	// for): the agent has not taken the answer yet.
	var nodeID string
	c.Eventually("the late node listed ready", func() bool {
		nodes, err := c.Client().Nodes(ctx)
		if err != nil {
			return false
		}
		for _, n := range nodes {
			if n.Name == "late" && n.State == api.NodeReady {
				nodeID = n.ID
				return true
			}
		}
		return false
	})
	type result struct {
		l   api.Lease
		err error
	}
	created := make(chan result, 1)
	go func() {
		l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20, Labels: map[string]string{"joined": "late"}})
		created <- result{l, err}
	}()
	// The control plane's call reaches the agent's handshake, which waits
	// for the certificate (a lease created or refused before the agent
	// took its answer is the failure this test is about).
	deadline := time.Now().Add(20 * time.Second)
	for !logs.logged("waits for the node certificate") {
		if time.Now().After(deadline) {
			t.Fatal("no handshake waited for the node certificate")
		}
		select {
		case r := <-created:
			t.Fatalf("before the agent took its join answer, the lease was %+v, %v", r.l, r.err)
		case <-time.After(5 * time.Millisecond): // poll
		}
	}
	release()
	select {
	case r := <-created:
		if r.err != nil {
			t.Fatalf("lease on a node that just joined: %v", r.err)
		}
		if r.l.State != api.LeaseActive || r.l.NodeID != nodeID {
			t.Fatalf("lease %+v, want active on %s", r.l, nodeID)
		}
		if _, err := c.Client().ReleaseLease(ctx, r.l.ID); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the lease was not created")
	}
}

// TestJoinOverHTTPToHTTPS: an agent given the control plane's address
// with http:// where it serves HTTPS gets Go's plain 400 ("Client sent an
// HTTP request to an HTTPS server.") to every join. It was retried for
// ever, the agent never ready and never saying why; the agent stops at
// once with an error naming the cause and the fix.
func TestJoinOverHTTPToHTTPS(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Nodes: 1})
	plain := strings.Replace(c.URL, "https://", "http://", 1)
	u, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{
		ControlPlane: plain, BootstrapToken: BootstrapToken, Name: "plain", StateDir: filepath.Join(t.TempDir(), "plain"),
		Listen: u.Hostname(), HeartbeatInterval: c.opts.HeartbeatInterval, Clock: c.Clock, CAFile: c.CA.CertFile(),
		Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Retried for ever, the join would keep Run until the context ends
	// (and Run then returns nil).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = a.Run(ctx)
	if ctx.Err() != nil || err == nil {
		t.Fatalf("Run = %v after %v: the join over http:// to an HTTPS control plane was retried", err, ctx.Err())
	}
	for _, want := range []string{"serves HTTPS", "https://", plain, "Client sent an HTTP request to an HTTPS server"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run = %v, want it to say %q", err, want)
		}
	}
}
