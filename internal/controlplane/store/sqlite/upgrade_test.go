package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestNewerSchemaRefused: a database a newer binary migrated is refused by
// an older one (a downgrade), naming both versions, and left as it was;
// the rollback is the newer binary or a backup (docs/operations.md).
func TestNewerSchemaRefused(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "cp.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := migrations()
	newer := len(ms) + 1
	if _, err := s.w.ExecContext(ctx, `INSERT INTO schema_version (version, name) VALUES (?, 'from_a_newer_binary.sql')`, newer); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err = Open(ctx, path)
	if err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("opening a newer database: %v", err)
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_version`).Scan(&v); err != nil || v != newer {
		t.Fatalf("schema version %d (%v) after the refusal, want %d", v, err, newer)
	}
}

// TestConcurrentMigrations: processes opening one database at once (a
// server and `rialto` store commands, or a second server started by
// mistake) each see the migrations the others applied while they waited
// for the write lock: every open succeeds, on a fresh database and on one
// an older binary left at version 5, and each migration is recorded once.
func TestConcurrentMigrations(t *testing.T) {
	ctx := context.Background()
	ms, _ := migrations()
	for round := range 8 {
		path := filepath.Join(t.TempDir(), "cp.db")
		if round%2 == 1 {
			old, err := open(ctx, path, 5)
			if err != nil {
				t.Fatal(err)
			}
			old.Close()
		}
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := Open(ctx, path)
				if err == nil {
					err = s.Close()
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, opener %d: %v", round, i, err)
			}
		}
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		var rows, v int
		err = s.w.QueryRowContext(ctx, `SELECT COUNT(*), MAX(version) FROM schema_version`).Scan(&rows, &v)
		s.Close()
		if err != nil || rows != len(ms) || v != len(ms) {
			t.Fatalf("round %d: schema_version has %d rows up to %d (%v), want %d", round, rows, v, err, len(ms))
		}
	}
}
