package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// TestForcedRemovalHoldsEverywhereBeforeTeardowns: two replicas on one
// PostgreSQL database; a real agent, joined through the first, lends a
// lease, and the second has its node credential cached. A forced removal
// through the first tells the agent to tear the lost lease down, which
// may take up to PrepareTimeout (here the agent's wipe waits): by the
// time the agent is asked, the other replica refuses the node's
// credential already (the removal's revocation broadcast is
// acknowledged). Before, the teardowns ran first, and the other replica
// answered the removed node from its cache until they were done. The
// agent's heartbeats are paused (see below): the agent hears of the lost
// lease from the removal's call alone.
func TestForcedRemovalHoldsEverywhereBeforeTeardowns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := pgtest.DB(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	replica := func() (*Server, string) {
		s := runServer(ctx, t, Config{Store: openPG(ctx, t, url, 8), Logger: log, BootstrapToken: bootTok,
			Tokens:         []Token{{Token: aliceTok, Tenant: "alice"}, {Token: adminTok, Tenant: "admin", Admin: true}},
			PrepareTimeout: time.Minute, HeartbeatInterval: 100 * time.Millisecond, SuspectAfter: 10 * time.Minute, DownAfter: 20 * time.Minute})
		ts := httptest.NewServer(s.Handler())
		t.Cleanup(ts.Close)
		return s, ts.URL
	}
	a, aURL := replica()
	b, bURL := replica()
	awaitReplicasMeet(ctx, t, a, b)

	entered, release := make(chan struct{}, 1), make(chan struct{})
	ag := newTestAgent(t, diskAgentConfig(t, aURL, log))
	ag.launch(func(x *agent.Agent) {
		f := func(ctx context.Context, _ string) {
			select {
			case entered <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		x.Faults.BeforeWipe.Store(&f)
	})
	ag.waitReady()
	l, err := api.NewClient(aURL, aliceTok, nil).CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var id struct {
		NodeID     string `json:"node_id"`
		Credential string `json:"credential"`
	}
	raw, err := os.ReadFile(filepath.Join(ag.cfg.StateDir, "identity.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &id); err != nil || id.NodeID != l.Parts[0].NodeID {
		t.Fatalf("the agent's identity: %v (node %q, the lease's %q)", err, id.NodeID, l.Parts[0].NodeID)
	}
	asNode := api.NewClient(bURL, id.Credential, nil)
	if _, err := asNode.Node(ctx, id.NodeID); err != nil {
		t.Fatalf("the node's credential on the other replica: %v", err)
	}

	// The removal's call is the only teardown the agent gets: a
	// heartbeat answered once the lease is lost (the removal loses it
	// before it revokes anything) would tear it down too, and its wipe
	// enter the hook before the other replica heard of the removal, or
	// wipe the lease before the removal's call found anything to wipe.
	// The node stays ready (SuspectAfter), so the removal is forced.
	ag.agent.PauseHeartbeats(true)
	removed := make(chan error, 1)
	go func() { // waited for below
		r, err := api.NewClient(aURL, adminTok, nil).RemoveNode(ctx, id.NodeID, true)
		if err == nil && !slices.Equal(r.Lost, []string{l.ID}) {
			err = fmt.Errorf("the removal lost %v, want %s", r.Lost, l.ID)
		}
		removed <- err
	}()
	select {
	case <-entered:
	case err := <-removed:
		t.Fatalf("the removal returned (%v) without the agent wiping the lost lease", err)
	case <-ctx.Done():
		t.Fatal("the agent was not asked to tear the lost lease down")
	}
	_, err = asNode.Node(ctx, id.NodeID)
	close(release)
	if !api.IsCode(err, api.CodeUnauthorized) {
		t.Errorf("while the removal's teardowns run, the other replica answers the removed node's credential with %v, want 401", err)
	}
	if err := <-removed; err != nil {
		t.Fatal(err)
	}
	if slices.Contains(ag.agent.Leases(), l.ID) {
		t.Error("the removed node's agent still serves the lease lost with it")
	}
}
