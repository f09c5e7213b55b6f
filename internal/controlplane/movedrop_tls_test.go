package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestRemovedMoveDestinationTornDownTLS: two replicas on one PostgreSQL
// database, each with its own copy of the cluster CA's directory (as on
// two hosts), and two real agents with node certificates, joined through
// the first replica (which issued their certificates: they are in its
// issued.txt, not in the second's). The second replica moves a lease's
// part; the first removes the destination's node (--force: its agent
// still runs, cut off from the control plane) once the destination holds
// the copy, the commit not sent yet (moveOntoRemovedTLS). By then the
// second replica has no connection open to the destination (closed here,
// as the lender's idle ones are after 90 s of a long copy), and every new
// one meets the certificate the removal revoked: the commit is refused in
// the handshake. The failed move's teardown of the destination still
// reaches it, accepting the certificates that removal revoked (recorded
// with the removal in the store), so the destination gives the transfer
// up and wipes the copy. Before, the teardown was refused too, and the
// removed node's agent kept the tenant's bytes, ready to serve them,
// until the transfer's expiry (6 h) or until it joined again.
func TestRemovedMoveDestinationTornDownTLS(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dst, m, helloAt := moveOntoRemovedTLS(ctx, t)
	// The move ends after its destination's teardown answered (runMove).
	for _, x := range dst.agent.Transfers() {
		if x.ID == m.ID && !x.Done() {
			t.Errorf("the removed destination still holds the move's transfer, %s", x.State)
		}
	}
	if helloAt() {
		t.Error("the removed destination's range still holds the tenant's bytes")
	}
}

// TestRemovedMoveDestinationAbortedTLS: the same move onto a node removed
// before its commit (moveOntoRemovedTLS). The move's abort reaches the
// removed destination as its teardown does, on a connection of its own
// that accepts the certificates the removal revoked (as the store
// recorded them: the removal was the other replica's): the destination
// gives the transfer up as the control plane's abort (not later, as the
// lease's teardown), and wipes the copy. Before, the abort was refused in
// the handshake, and only the teardown that follows it reached the agent.
func TestRemovedMoveDestinationAbortedTLS(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dst, m, helloAt := moveOntoRemovedTLS(ctx, t)
	found := false
	for _, x := range dst.agent.Transfers() {
		if x.ID != m.ID {
			continue
		}
		found = true
		// The agent's words for a transfer its abort ended (a teardown's
		// are "the lease is being torn down").
		if x.State != api.TransferAborted || x.Error != "aborted by the control plane" {
			t.Errorf("the removed destination's transfer: %s (%q), not aborted by the move's abort", x.State, x.Error)
		}
	}
	if !found {
		t.Errorf("the removed destination does not know the move's transfer %s", m.ID)
	}
	if helloAt() {
		t.Error("the removed destination's range still holds the tenant's bytes")
	}
}

// moveOntoRemovedTLS runs a move onto a node removed before its commit:
// two replicas on one PostgreSQL database, each with its own copy of the
// cluster CA's directory (as on two hosts), and two real agents with node
// certificates, joined through the first replica (which issued their
// certificates: they are in its issued.txt, not in the second's). The
// second replica moves a lease's part; the first removes the
// destination's node (--force: its agent still runs, cut off from the
// control plane) once the destination holds the copy, the commit not sent
// yet, and the second replica's idle connections to the agents are closed
// (as the lender's are after 90 s of a long copy): every call to the
// destination from then on opens a connection that meets the certificate
// the removal revoked. It returns once the move ended, failed (checked):
// the destination's agent, the move, and whether the destination's range
// still holds the bytes the tenant wrote.
func moveOntoRemovedTLS(ctx context.Context, t *testing.T) (dst *testAgent, m api.Move, helloAt func() bool) {
	t.Helper()
	url := pgtest.DB(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	caA, caB := caCopies(t)
	tlsB, err := NewTLSLender(caB)
	if err != nil {
		t.Fatal(err)
	}
	hold := &commitHoldTLS{TLSLender: tlsB, entered: make(chan struct{}), release: make(chan struct{})}
	defer hold.let()
	replica := func(ca *pki.CA, lender Lender) (*Server, string) {
		s := runServer(ctx, t, Config{Store: openPG(ctx, t, url, 8), Logger: log, CA: ca, Lender: lender, BootstrapToken: bootTok,
			Tokens:         []Token{{Token: aliceTok, Tenant: "alice"}, {Token: adminTok, Tenant: "admin", Admin: true}},
			PrepareTimeout: 30 * time.Second, HeartbeatInterval: 100 * time.Millisecond, SuspectAfter: 10 * time.Minute, DownAfter: 20 * time.Minute})
		return s, serveTLS(t, s, ca)
	}
	a, aURL := replica(caA, nil)
	b, bURL := replica(caB, hold)
	awaitReplicasMeet(ctx, t, a, b)

	agents := map[string]*testAgent{}
	for _, name := range []string{"n1", "n2"} {
		cfg := diskAgentConfig(t, aURL, log)
		cfg.Name, cfg.StateDir, cfg.CAFile = name, filepath.Join(t.TempDir(), name), caA.CertFile()
		ag := newTestAgent(t, cfg)
		ag.launch(nil)
		ag.waitReady()
		agents[ag.agent.NodeID()] = ag
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: caA.Pool()}}, Timeout: time.Minute}
	alice := api.NewClient(bURL, aliceTok, hc)
	l, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	dataTLS, err := pki.LoadClientTLS(caA.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	u, err := nbd.ParseURI(l.URI)
	if err != nil {
		t.Fatal(err)
	}
	vol, err := u.Dial(ctx, dataTLS)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vol.WriteAt([]byte("hello"), 4096); err != nil {
		t.Fatal(err)
	}
	if err := vol.Flush(); err != nil {
		t.Fatal(err)
	}
	vol.Close()

	ms, err := alice.MoveLease(ctx, l.ID, api.MoveRequest{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-hold.entered:
	case <-ctx.Done():
		t.Fatal("the move did not reach the destination's commit")
	}
	dst = agents[ms[0].To.NodeID]
	if dst == nil {
		t.Fatalf("the move's destination %s is not one of the agents", ms[0].To.NodeID)
	}
	helloAt = func() bool {
		f, err := os.Open(filepath.Join(dst.cfg.StateDir, "disk0.img"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		got := make([]byte, 5)
		if _, err := f.ReadAt(got, ms[0].To.Offset+4096); err != nil {
			t.Fatal(err)
		}
		return bytes.Equal(got, []byte("hello"))
	}
	if !helloAt() {
		t.Fatal("the destination does not hold the copy before its commit")
	}
	dst.agent.PauseHeartbeats(true) // it does not join again
	r, err := api.NewClient(aURL, adminTok, hc).RemoveNode(ctx, ms[0].To.NodeID, true)
	if err != nil {
		t.Fatal(err)
	}
	if r.Revoked == 0 {
		t.Fatalf("the removal revoked no certificate: %+v", r)
	}
	tlsB.clients.closeIdle()
	hold.let()
	pollUntil(ctx, t, "the move to end", func() bool {
		m, err = alice.Move(ctx, ms[0].ID)
		return err == nil && m.Done()
	})
	if m.State != api.MoveFailed {
		t.Fatalf("the move onto the removed node: %+v", m)
	}
	return dst, m, helloAt
}

// commitHoldTLS is a TLSLender whose first transfer commit (a move's
// destination's) waits until let is called.
type commitHoldTLS struct {
	*TLSLender
	entered, release chan struct{}
	once, done       sync.Once
}

func (h *commitHoldTLS) TransferCommit(ctx context.Context, node api.Node, agentKey, id string, req api.TransferCommitRequest) (api.TransferCommitResponse, error) {
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.entered)
		select {
		case <-h.release:
		case <-ctx.Done():
			return api.TransferCommitResponse{}, ctx.Err()
		}
	}
	return h.TLSLender.TransferCommit(ctx, node, agentKey, id, req)
}

// let lets the held commit go on (again: a no-op).
func (h *commitHoldTLS) let() { h.done.Do(func() { close(h.release) }) }

// closeIdle closes the idle connections of every node's client, as the
// lender's transport does once they are idle for IdleConnTimeout.
func (c *clientCache) closeIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, hc := range c.m {
		if rt, ok := hc.Transport.(handshakeRetry); ok {
			if tr, ok := rt.rt.(*http.Transport); ok {
				tr.CloseIdleConnections()
			}
		}
	}
}

// caCopies makes a new CA directory and a copy of it, each opened: the
// copies two replicas on one store hold.
func caCopies(t *testing.T) (a, b *pki.CA) {
	t.Helper()
	dirA := filepath.Join(t.TempDir(), "tls")
	a, err := pki.Open(dirA, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dirB := filepath.Join(t.TempDir(), "tls")
	copyDir(t, dirA, dirB)
	b, err = pki.Open(dirB, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// copyDir copies the files of directory from into a new directory to,
// with their modes.
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}
