package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// The database holds lease credentials and agent keys: it and its WAL
// files must be readable by the owner only, whatever the umask, and a
// database an older binary left readable by others is tightened.
func TestDatabaseFilesOwnerOnly(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	for _, tc := range []struct {
		name string
		pre  os.FileMode // mode of a file already there; 0: none
	}{
		{"new", 0},
		{"existing world-readable", 0o644},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "rialto.db")
			if tc.pre != 0 {
				if err := os.WriteFile(path, nil, tc.pre); err != nil {
					t.Fatal(err)
				}
			}
			s, err := Open(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			// A write makes sure the WAL and its index exist.
			if _, err := s.w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS mode_probe (x)`); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{path, path + "-wal", path + "-shm"} {
				st, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if m := st.Mode().Perm(); m&0o077 != 0 {
					t.Errorf("%s has mode %#o; want no group or other access", filepath.Base(p), m)
				}
			}
		})
	}
}
