package sqlite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite/sqlitetest"
)

// fillLeases writes a database at path holding n leases, each with a plan,
// and closes it (which checkpoints its WAL into the file).
func fillLeases(t testing.TB, path string, n int) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1700000000, 0).UTC()
	nd := joinNode(t.(*testing.T), s, now, []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 50}})
	devs, err := s.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 100 {
		var ops []store.LeaseOp
		for j := i; j < i+100 && j < n; j++ {
			id := fmt.Sprintf("lease-%06d", j)
			parts := []api.Part{{NodeID: nd.ID, DeviceID: devs[0].ID, Offset: int64(j) << 30, Length: 1 << 30}}
			plan := &api.Plan{ID: id, At: now, State: "feasible", Mode: api.ModeShared, Parts: parts,
				Explanation: []string{"request: block 1GiB, strategy binpack", "chose shared " + nd.ID + "/" + devs[0].ID}}
			ops = append(ops, store.LeaseOp{Create: &store.NewLease{Lease: api.Lease{ID: id, State: api.LeaseReserved, Kind: api.KindBlock,
				Mode: api.ModeShared, Tenant: "t", Count: 1, Size: 1 << 30, Credential: "rlc_x", TTLSeconds: 3600, ExpiresAt: now.Add(time.Hour),
				CreatedAt: now, UpdatedAt: now, Parts: parts, Plan: plan}, Event: api.Event{At: now, Type: "lease.reserved", Subject: id}}})
		}
		if _, errs, err := s.LeaseOps(ctx, ops); err != nil || errors.Join(errs...) != nil {
			t.Fatalf("create leases: %v %v", err, errors.Join(errs...))
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedDatabaseRefused: a database file damaged while the server
// was stopped is refused at Open with store.ErrCorrupt, naming the file,
// what SQLite found and the restore procedure, and the failed Open writes
// nothing to the file. (Damaged middle pages used to be opened and served,
// every sweep then failing with "database disk image is malformed".)
func TestDamagedDatabaseRefused(t *testing.T) {
	ctx := context.Background()
	good := filepath.Join(t.TempDir(), "good.db")
	fillLeases(t, good, 300)
	orig, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	const page = 4096
	if len(orig) < 8*page {
		t.Fatalf("database of %d bytes: too small to damage its middle", len(orig))
	}
	rnd := func(n int) []byte {
		b := make([]byte, n)
		rand.New(rand.NewSource(int64(n))).Read(b)
		return b
	}
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
	}{
		// dd if=/dev/urandom of=rialto.db bs=4096 seek=3 count=2 conv=notrunc
		{"middle pages", func(b []byte) []byte { copy(b[3*page:5*page], rnd(2*page)); return b }},
		{"truncated", func(b []byte) []byte { return b[:len(b)/2] }},
		{"garbage header", func(b []byte) []byte { copy(b, rnd(100)); return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rialto.db")
			bad := tc.damage(bytes.Clone(orig))
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(ctx, path)
			if err == nil {
				s.Close()
				t.Fatal("damaged database opened")
			}
			if !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("error %q is not store.ErrCorrupt", err)
			}
			for _, want := range []string{path, "Backups and restore", "docs/operations.md"} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("error %q does not say %q", err, want)
				}
			}
			if tc.name == "middle pages" && !strings.Contains(err.Error(), "quick_check found: ") {
				t.Fatalf("error %q does not quote SQLite's report", err)
			}
			t.Logf("%s", err)
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(after, bad) {
				t.Fatalf("the failed open changed the file (%d bytes, was %d)", len(after), len(bad))
			}
		})
	}
	// The undamaged file still opens, and keeps its leases.
	s, err := Open(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Lease(ctx, "lease-000299"); err != nil {
		t.Fatal(err)
	}
}

// TestDamageFoundWhileRunning: a statement that finds the database damaged
// fails with store.ErrCorrupt, on the writer and on the readers, saying
// what to do (the sweep's log line leaves that to the error).
func TestDamageFoundWhileRunning(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "rialto.db")
	fillLeases(t, path, 10)
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Lease(ctx, "lease-000001"); err != nil {
		t.Fatal(err)
	}
	sqlitetest.DamageTable(t, path, "nodes")
	if _, err := s.Nodes(ctx); !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), restoreAdvice) {
		t.Fatalf("read: %v, want store.ErrCorrupt, saying %q", err, restoreAdvice)
	}
	if err := s.SetNodeState(ctx, "node-1", api.NodeReady, api.NodeSuspect, api.Event{}); !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), restoreAdvice) {
		t.Fatalf("write: %v, want store.ErrCorrupt, saying %q", err, restoreAdvice)
	}
}
