package testcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// writingLender forwards prepares to the lenders and, once a lender has
// prepared (and serves) a part, writes a pattern over the whole part
// through its URI: bytes a writer who reached the export in the window
// before the control plane gave the prepare up could have left (the
// lender itself, which has the name). With stall set, it then holds the
// answer until the control plane's bound passes, as a slow network
// would: the control plane counts the prepare timed out though the
// lender did prepare.
type writingLender struct {
	controlplane.Lender
	t *testing.T

	mu      sync.Mutex
	stall   bool
	off     bool     // forward only
	written []string // the parts written, as partRanges has them
	entries map[string][]journalEntry
}

// journalEntry is a part written, as a wipe journal entry names it.
type journalEntry struct {
	DeviceName string `json:"device_name"`
	Offset     int64  `json:"offset"`
	Length     int64  `json:"length"`
}

func (w *writingLender) Prepare(ctx context.Context, node api.Node, key string, req api.PrepareRequest) (api.PrepareResponse, error) {
	resp, err := w.Lender.Prepare(ctx, node, key, req)
	w.mu.Lock()
	off, stall := w.off, w.stall
	w.mu.Unlock()
	if err != nil || off {
		return resp, err
	}
	nc, derr := nbd.DialURI(ctx, resp.URI)
	if derr != nil {
		w.t.Errorf("a prepared part is not served: %v", derr)
		return resp, err
	}
	pat := bytes.Repeat([]byte("failed prepare "), int(nc.Size())/15+1)[:nc.Size()]
	if _, werr := nc.WriteAtContext(ctx, pat, 0, true); werr != nil {
		w.t.Errorf("writing a prepared part: %v", werr)
	}
	nc.Close()
	w.mu.Lock()
	w.written = append(w.written, fmt.Sprintf("%s/%s@%d+%d", node.ID, req.DeviceID, req.Offset, req.Length))
	if w.entries == nil {
		w.entries = map[string][]journalEntry{}
	}
	w.entries[node.ID] = append(w.entries[node.ID], journalEntry{req.DeviceName, req.Offset, req.Length})
	w.mu.Unlock()
	if stall {
		<-ctx.Done()
		return api.PrepareResponse{}, ctx.Err()
	}
	return resp, err
}

// journal is the node's wipe journal (wipes.json), as entries.
func journal(t *testing.T, n *Node) []journalEntry {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.StateDir, "wipes.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no wipe was ever journalled
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []journalEntry
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFailedPrepareWipedBeforeLentAgain: a prepare that fails part-way
// leaves the ranges that were prepared wiped before they are lent again.
// Each part a lender prepared is written over while it is served, then
// the lease fails: one lender of a composed lease refuses its part, or
// the lender of a dedicated lease prepares but its answer comes after the
// control plane's bound. Bob's next lease lands on the same ranges and
// reads zeroes in every 4 KiB block, reported hole and zero. With a
// crash in the middle of the wipe the failed prepare's range is in the
// lender's wipe journal, refused to bob, until the restarted lender has
// wiped it.
func TestFailedPrepareWipedBeforeLentAgain(t *testing.T) {
	t.Parallel()
	const dev = 4 << 20
	for _, tc := range []struct {
		name  string
		mode  api.Mode
		nodes int
		stall bool // the prepare times out at the control plane
		crash bool // the wipe of the prepared ranges stops half-way
	}{
		{name: "composed part refused", mode: api.ModeComposed, nodes: 3},
		{name: "dedicated timed out", mode: api.ModeDedicated, nodes: 1, stall: true},
		{name: "composed part refused wipe crashed", mode: api.ModeComposed, nodes: 3, crash: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wl := &writingLender{t: t, stall: tc.stall}
			opts := Options{Nodes: tc.nodes, Tenants: []string{"alice", "bob"},
				Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: dev}},
				Lender:  func(l controlplane.Lender) controlplane.Lender { wl.Lender = l; return wl }}
			if tc.stall {
				opts.PrepareTimeout = 2 * time.Second // waited out once
			}
			c := Start(t, opts)
			ctx := ctxT(t)
			req := api.LeaseRequest{Kind: api.KindBlock, Mode: tc.mode, Size: int64(tc.nodes) * dev}
			if tc.nodes > 1 {
				req.Count = tc.nodes
			}
			var refuser *Node
			if tc.nodes > 1 {
				refuser = c.Nodes[tc.nodes-1]
				refuser.Faults().RefusePrepare.Store(true)
			}
			if tc.crash {
				for _, n := range c.Nodes {
					n.Faults().CrashMidWipe.Store(true)
				}
			}
			if _, err := c.ClientWithToken(TenantToken("alice")).CreateLease(ctx, req); err == nil {
				t.Fatal("alice's lease was made although a lender did not confirm")
			}
			wl.mu.Lock()
			written, entries := slices.Clone(wl.written), wl.entries
			// From here on, prepares are forwarded only: bob's parts are
			// his own.
			wl.off = true
			wl.mu.Unlock()
			want := tc.nodes - 1 // all but the refusing lender
			if tc.stall {
				want = 1
			}
			if len(written) != want {
				t.Fatalf("parts prepared and written before the lease failed: %v", written)
			}
			if refuser != nil {
				refuser.Faults().RefusePrepare.Store(false)
			}

			bob := c.ClientWithToken(TenantToken("bob"))
			bobReq := req
			if tc.crash {
				for _, n := range c.Nodes {
					j := journal(t, n)
					for _, e := range entries[n.ID()] {
						if !slices.Contains(j, e) {
							t.Fatalf("%s: the failed prepare's range %+v is not in the wipe journal %+v", n.Name, e, j)
						}
					}
				}
				if _, err := bob.CreateLease(ctx, bobReq); err == nil {
					t.Fatal("a range whose wipe did not finish was lent")
				} else if !strings.Contains(err.Error(), "is still being wiped after an earlier lease") {
					t.Fatalf("bob's lease failed for another reason than the unfinished wipe: %v", err)
				}
				// Bob's lease waited for the wipes (Options.WipeWait) and
				// failed; an attempt that prepared a part would have left
				// its own unfinished wipe (the fault is still set): every
				// lender restarts.
				for _, n := range c.Nodes {
					n.Restart() // a new agent, without the fault
				}
			}
			lb, err := bob.CreateLease(ctx, bobReq)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range written {
				if !slices.Contains(partRanges(lb), r) {
					t.Fatalf("bob's lease %v is not on the written range %s", partRanges(lb), r)
				}
			}
			if n := leakedBlocks(ctx, t, lb); n != 0 {
				t.Fatalf("bob reads %d blocks written while the failed prepare was served", n)
			}
			if d := dataExtents(ctx, t, lb); len(d) != 0 {
				t.Fatalf("bob's lease is not reported hole and zero: %v", d)
			}
		})
	}
}
