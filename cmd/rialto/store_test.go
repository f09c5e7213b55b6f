package main

import (
	"path/filepath"
	"testing"

	"github.com/rialto-project/rialto/internal/sharertest"
)

// TestSQLiteLockLetGoWhileAChildSharesIt: the SQLite database's lock a
// stopped server let go is the next server's though a child process
// (cat, given a copy of the descriptor, as a child that any goroutine
// forks has one until its exec) still shares it. Closing the file alone
// left the lock with the child: a server started right after in the same
// process was refused as if another served the database.
func TestSQLiteLockLetGoWhileAChildSharesIt(t *testing.T) {
	db := filepath.Join(t.TempDir(), "cp.db")
	f, err := lockSQLite(db)
	if err != nil {
		t.Fatal(err)
	}
	sharertest.Share(t, f)
	closeLock(f)
	g, err := lockSQLite(db)
	if err != nil {
		t.Fatalf("the lock of a stopped server, a child sharing it: %v", err)
	}
	closeLock(g)
}
