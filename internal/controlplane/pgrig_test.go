package controlplane

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
)

// openPG opens a store on the PostgreSQL database at url (pgtest.DB: the
// test's own, or one its replicas share) with at most maxConns
// connections, closed when the test ends.
func openPG(ctx context.Context, t *testing.T, url string, maxConns int) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(ctx, url, postgres.Options{MaxConns: maxConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// runServer makes the Server of cfg and runs it (Run: its sweeps, its
// replica bus) until the test ends, when it is stopped and waited for,
// then closed.
func runServer(ctx context.Context, t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // stopped and waited for at cleanup
		defer close(done)
		s.Run(rctx)
	}()
	t.Cleanup(func() { stop(); <-done; s.Close() })
	return s
}

// diskAgentConfig is the configuration of a real agent, n1, with its
// state in a directory of the test's, that joins the control plane at
// url and lends a block device of 64 MiB, heartbeating every 100 ms.
func diskAgentConfig(t *testing.T, url string, log *slog.Logger) agent.Config {
	return agent.Config{ControlPlane: url, BootstrapToken: bootTok, Name: "n1", StateDir: filepath.Join(t.TempDir(), "n1"),
		Listen: "127.0.0.1", HeartbeatInterval: 100 * time.Millisecond, Logger: log,
		Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 64 << 20}}}
}

// testAgent is a real agent of a test, run on cfg, which can be killed
// and launched again on its state directory; it is killed when the test
// ends.
type testAgent struct {
	t     *testing.T
	cfg   agent.Config
	stop  context.CancelFunc
	done  chan error
	agent *agent.Agent
}

// newTestAgent is the testAgent of cfg, not launched yet; it runs until
// killed or the test ends.
func newTestAgent(t *testing.T, cfg agent.Config) *testAgent {
	a := &testAgent{t: t, cfg: cfg}
	t.Cleanup(a.kill)
	return a
}

// launch starts the agent with setup applied to it first, and returns at
// once.
func (a *testAgent) launch(setup func(*agent.Agent)) {
	a.t.Helper()
	ag, err := agent.New(a.cfg)
	if err != nil {
		a.t.Fatal(err)
	}
	if setup != nil {
		setup(ag)
	}
	actx, stop := context.WithCancel(a.t.Context())
	done := make(chan error, 1)
	go func() { done <- ag.Run(actx) }() // stopped and waited for by kill
	a.agent, a.stop, a.done = ag, stop, done
}

// waitReady waits until the launched agent has joined.
func (a *testAgent) waitReady() {
	a.t.Helper()
	select {
	case <-a.agent.Ready():
	case err := <-a.done:
		a.done <- err
		a.t.Fatalf("the agent stopped: %v", err)
	case <-a.t.Context().Done():
		a.t.Fatal("the agent did not join")
	case <-time.After(2 * time.Minute): // fail with words, not at go test's timeout
		a.t.Fatal("the agent did not join in 2 minutes")
	}
}

// kill stops the agent, as a crash would look to the control plane.
func (a *testAgent) kill() {
	if a.stop == nil {
		return
	}
	a.stop()
	<-a.done
	a.stop = nil
}
