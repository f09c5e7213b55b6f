package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestMoveTablesGolden pins the tables of moves and drains, and the
// progress lines of a move.
func TestMoveTablesGolden(t *testing.T) {
	var b bytes.Buffer
	at := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	names := map[string]string{"node-a": "node1", "node-b": "node2"}
	moves := []api.Move{
		{ID: "mv-2", LeaseID: "lease-1", Part: 1, Kind: api.KindBlock, State: api.MoveCopying, Size: 1 << 30, Copied: 300 << 20, Skipped: 212 << 20,
			Dirty: 4 << 20, Pass: 2, From: api.Part{NodeID: "node-a"}, To: api.Part{NodeID: "node-b"}, Reason: "drain of node node1", StartedAt: at.Add(time.Second)},
		{ID: "mv-1", LeaseID: "lease-1", Part: 0, Kind: api.KindBlock, State: api.MoveDone, Size: 1 << 30, Copied: 1 << 30, Pass: 3,
			HeldMillis: 12.5, From: api.Part{NodeID: "node-a"}, To: api.Part{NodeID: "node-b"}, Reason: "drain of node node1", StartedAt: at},
		{ID: "mv-3", LeaseID: "lease-2", Kind: api.KindMemory, State: api.MoveFailed, Size: 64 << 20, From: api.Part{NodeID: "node-b"},
			To: api.Part{NodeID: "node-gone"}, Error: "the destination did not answer", StartedAt: at.Add(2 * time.Second)},
	}
	b.WriteString("== moves\n")
	printMoves(&b, moves, names)
	b.WriteString("== progress\n")
	for _, m := range moves {
		b.WriteString(moveProgress(m) + "\n")
	}
	b.WriteString("== drain\n")
	printDrain(&b, api.Drain{NodeID: "node-a", NodeName: "node1", State: api.DrainIncomplete, StartedAt: at, FinishedAt: at.Add(90 * time.Second),
		Leases: []api.DrainLease{
			{LeaseID: "lease-1", Kind: api.KindBlock, Tenant: "alice", Action: api.DrainMove, State: api.DrainLeaseDone},
			{LeaseID: "lease-3", Kind: api.KindAccel, Tenant: "bob", Action: api.DrainReplace, State: api.DrainLeaseDone},
			{LeaseID: "lease-4", Kind: api.KindAccel, Tenant: "bob", Action: api.DrainLeave, State: api.DrainLeaseLeft,
				Reason: "role wasm keeps state in its slot; it cannot be re-placed"},
		}})
	printDrain(&b, api.Drain{NodeID: "node-b", NodeName: "node2", State: api.DrainDone, StartedAt: at, FinishedAt: at.Add(time.Second)})
	b.WriteString("== nodes\n")
	printNodes(&b, []api.Node{{ID: "node-a", Name: "node1", State: api.NodeReady, Cordoned: true}})

	path := filepath.Join("testdata", "move.golden")
	if *rewrite {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run MoveTablesGolden -rewrite)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("tables changed (go test -run MoveTablesGolden -rewrite to accept):\n%s", b.String())
	}
}
