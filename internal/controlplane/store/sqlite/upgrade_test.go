package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
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
