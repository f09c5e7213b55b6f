package testcluster

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// sentExports records the export names the control plane sent each node
// in its prepare requests: what that node's agent learned.
type sentExports struct {
	controlplane.Lender
	mu sync.Mutex
	m  map[string][]string // node ID → export names
	// Once armed, the first node sent a prepare is made to refuse it
	// (refuse is called with its ID before the prepare is forwarded):
	// whichever lender placement tries first is the skipped one, so the
	// test does not depend on placement's order (which weighs measured
	// latencies).
	armed   bool
	skipped string
	refuse  func(nodeID string)
}

func (s *sentExports) Prepare(ctx context.Context, node api.Node, key string, req api.PrepareRequest) (api.PrepareResponse, error) {
	s.mu.Lock()
	s.m[node.ID] = append(s.m[node.ID], req.Export)
	if s.armed && s.skipped == "" {
		s.skipped = node.ID
		s.refuse(node.ID)
	}
	s.mu.Unlock()
	return s.Lender.Prepare(ctx, node, key, req)
}

// arm makes the next node sent a prepare refuse it, through refuse.
func (s *sentExports) arm(refuse func(nodeID string)) {
	s.mu.Lock()
	s.armed, s.refuse = true, refuse
	s.mu.Unlock()
}

// skippedNode is the node armed made refuse ("" if none yet).
func (s *sentExports) skippedNode() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.skipped
}

func (s *sentExports) of(nodeID string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.m[nodeID]...)
}

// withExport is uri with its export name (the path) replaced by name.
func withExport(t *testing.T, uri, name string) string {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// TestSkippedLenderLearnsNoLiveSecret: a lender that does not confirm a
// prepare has still been sent the part's export name (the data-plane
// secret). The lease is placed again elsewhere; the name that lender
// learned must not open the lease where it is served now. (It did: a
// part's name depended only on the lease credential and the part's index,
// so the skipped lender — or, for a composed lease, the lender of another
// part that took the index over — could read and write the tenant's bytes
// at the new lender.)
func TestSkippedLenderLearnsNoLiveSecret(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		mode  api.Mode
		count int
	}{
		{"shared", api.ModeShared, 0},
		{"composed", api.ModeComposed, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var rec *sentExports
			c := Start(t, Options{Nodes: 3, Tenants: []string{"alice"},
				Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20}},
				Lender: func(l controlplane.Lender) controlplane.Lender {
					rec = &sentExports{Lender: l, m: map[string][]string{}}
					return rec
				}})
			ctx := ctxT(t)
			alice := c.ClientWithToken(TenantToken("alice"))
			byID := map[string]*Node{}
			for _, n := range c.Nodes {
				byID[n.ID()] = n
			}
			// The first lender placement tries refuses the prepare (the
			// name has been sent to it all the same).
			rec.arm(func(id string) { byID[id].Faults().RefusePrepare.Store(true) })
			l, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: tc.mode, Size: 8 << 20, Count: tc.count,
				Strategy: "binpack"})
			if err != nil {
				t.Fatal(err)
			}
			skipped := byID[rec.skippedNode()]
			if skipped == nil {
				t.Fatalf("no prepare was sent for the lease (parts %v)", partRanges(l))
			}
			learned := rec.of(skipped.ID())
			for _, p := range l.Parts {
				if p.NodeID == skipped.ID() {
					t.Fatalf("lease placed on the refusing lender %s", skipped.Name)
				}
			}
			// The tenant writes its bytes.
			fillParts(ctx, t, l, "alice")
			// The skipped lender tries every name it was sent at every
			// part's lender.
			for _, name := range learned {
				for i, uri := range partURIs(l) {
					stolen := withExport(t, uri, name)
					nc, err := nbd.DialURI(ctx, stolen)
					if err != nil {
						continue // refused: the name opens nothing there
					}
					b := make([]byte, 4096)
					_, rerr := nc.ReadAtContext(ctx, b, 0)
					nc.Close()
					t.Errorf("the name sent to the skipped lender %s opens part %d of the lease at its new lender (read: %v, alice's bytes: %v)",
						skipped.Name, i, rerr, bytes.Contains(b, []byte("alice secret")))
				}
			}
			// The names the final lenders serve are ones only they were sent.
			for i, uri := range partURIs(l) {
				u, _ := url.Parse(uri)
				name := strings.TrimPrefix(u.Path, "/")
				for _, n := range c.Nodes {
					if n.ID() == l.Parts[i].NodeID {
						continue
					}
					for _, e := range rec.of(n.ID()) {
						if e == name {
							t.Errorf("part %d's export name (served by %s) was also sent to %s", i, l.Parts[i].NodeID, n.Name)
						}
					}
				}
			}
		})
	}
}
