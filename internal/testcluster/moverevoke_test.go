package testcluster

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// TestMoveEndsAtRevokedBlockDestination: the destination's node
// certificate is revoked while a block part's copy to it is under way
// (held after 4 MiB of 16 MiB, the relay in between forwarding no more).
// Once the source's agent takes the revocation list (its next
// heartbeat), it ends its connection to the destination and the move
// fails at once, saying the destination's certificate is revoked; the
// part stays on its source. Before, the source's connection, verified at
// its handshake, lived on: the copy waited for the destination's answer
// for the request timeout (a minute), and failed saying it did not
// answer.
func TestMoveEndsAtRevokedBlockDestination(t *testing.T) {
	t.Parallel()
	moveEndsAtRevokedDestination(t, api.KindBlock)
}

// TestMoveEndsAtRevokedMemoryDestination is
// TestMoveEndsAtRevokedBlockDestination for a memory part: the source's
// session with the destination's region ends.
func TestMoveEndsAtRevokedMemoryDestination(t *testing.T) {
	t.Parallel()
	moveEndsAtRevokedDestination(t, api.KindMemory)
}

func moveEndsAtRevokedDestination(t *testing.T, kind api.Kind) {
	const size = 16 << 20
	var mu sync.Mutex
	var links []*cutLink
	link := func(target string) *cutLink {
		l := newCutLink(t, target, 4<<20, true)
		mu.Lock()
		links = append(links, l)
		mu.Unlock()
		return l
	}
	c := Start(t, Options{TLS: true, Nodes: 2,
		Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: size}, {Name: "mem0", Kind: api.KindMemory, Size: size}},
		Configure: func(i int, cfg *agent.Config) {
			log := slog.New(slog.DiscardHandler)
			cfg.Drivers = map[api.Kind]agent.Driver{
				api.KindBlock:  cuttingDriver{BlockDriver: agent.NewBlockDriver(log), link: link},
				api.KindMemory: cuttingMemoryDriver{MemoryDriver: agent.NewMemoryDriver(log), link: link},
			}
		}})
	ctx := ctxT(t)
	cl := c.Client()
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: kind, Mode: api.ModeDedicated, Size: size})
	if err != nil {
		t.Fatal(err)
	}
	src := c.NodeByID(l.Parts[0].NodeID)
	var dst *Node
	for _, n := range c.Nodes {
		if n != src {
			dst = n
		}
	}
	// Bytes everywhere: the copy has 16 MiB to send.
	data := bytes.Repeat([]byte("revoked mid-move"), size/16)
	switch kind {
	case api.KindBlock:
		nc, err := nbd.DialURI(ctx, l.URI, nbd.WithTLS(dataTLS(t, c)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.WriteAtContext(ctx, data, 0, true); err != nil {
			t.Fatal(err)
		}
		nc.Close()
	case api.KindMemory:
		u, err := protocol.ParseURI(l.URI)
		if err != nil {
			t.Fatal(err)
		}
		mc, err := client.Dial(ctx, u.Address, u.Credential, client.Options{TLS: dataTLS(t, c)})
		if err != nil {
			t.Fatal(err)
		}
		if err := mc.Write(ctx, client.ChannelBulk, data, 0); err != nil {
			t.Fatal(err)
		}
		mc.Close()
	}

	if _, err := cl.MoveLease(ctx, l.ID, api.MoveRequest{}); err != nil {
		t.Fatal(err)
	}
	var relay *cutLink
	Eventually(t, 60*time.Second, "the transfer to reach its destination", func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(links) > 0 {
			relay = links[0]
		}
		return relay != nil
	})
	select {
	case <-relay.reached: // the copy is stuck there
	case <-ctx.Done():
		t.Fatal("the copy did not send 4 MiB")
	}

	cert := nodeCert(t, dst)
	if err := c.CA.Revoke(cert.Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	c.Sweep() // the control plane takes the list
	if err := src.Agent().Heartbeat(ctx); err != nil {
		t.Fatal(err) // and hands it to the source
	}
	// Well within the copy's request timeout (a minute), which the
	// connection to the revoked destination waited for before.
	var m api.Move
	Eventually(t, 20*time.Second, "the move to fail", func() bool {
		ms, err := cl.Moves(ctx, l.ID)
		if err != nil || len(ms) != 1 {
			return false
		}
		m = ms[0]
		return m.Done()
	})
	if m.State != api.MoveFailed {
		t.Fatalf("move %s is %s (%q), want failed", m.ID, m.State, m.Error)
	}
	t.Logf("the failed move says: %q", m.Error)
	if !strings.Contains(m.Error, "revoked") || !strings.Contains(m.Error, dst.Name) {
		t.Errorf("the move's error %q does not say that %s's certificate is revoked", m.Error, dst.Name)
	}
	got := c.Lease(l.ID)
	if got.State != api.LeaseActive || got.Parts[0].NodeID != src.ID() || got.Parts[0].URI != l.Parts[0].URI {
		t.Fatalf("after the failed move the lease is %s on %s (%v)", got.State, got.Parts[0].NodeID, got.Parts[0].URI == l.Parts[0].URI)
	}
}
