package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestAttachStateFileIgnoresLeftoverTmp: a temporary file another write
// left beside the state file, with mode 0644, does not make the state
// file (which names the export's URI) readable by other users, nor is its
// content kept.
func TestAttachStateFileIgnoresLeftoverTmp(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "lease-x.json")
	if err := os.WriteFile(file+".tmp", []byte("leftover, longer than the state that follows it: ......................................................................................................................................................................................................................"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file+".tmp", 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if err := recordAttachment(file, attachState{ID: "lease-x", State: "attached", PID: os.Getpid()}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("state file has mode %04o, want 0600", fi.Mode().Perm())
	}
	if st, err := readAttachState(file); err != nil || st.ID != "lease-x" {
		t.Errorf("state file reads back as %+v, %v", st, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if n := e.Name(); n != "lease-x.json" && n != "lease-x.json.tmp" {
			t.Errorf("temporary file %s left behind", n)
		}
	}
}
