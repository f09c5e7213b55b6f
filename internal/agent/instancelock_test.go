package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDeviceSharedLockRefused: a block device another program holds a
// shared flock on (systemd-udevd probing a whole disk, a partitioning
// tool) is not the agent's to wipe or serve either: a start on a fresh
// state directory, which would wipe the existing file, is refused saying
// who holds it and that it is not another agent, and the file keeps its
// bytes. The refused start leaves no lock behind: once the other program
// lets go, the agent starts, holding its state directory's lock with its
// PID written in.
func TestDeviceSharedLockRefused(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	cfg := testConfig(srv.URL, dir)
	disk := filepath.Join(dir, "disk0.img")
	secret := bytes.Repeat([]byte{0x5a}, 1<<20)
	if err := os.WriteFile(disk, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		t.Fatal(err)
	}

	err = refusedStart(t, cfg)
	if !errors.Is(err, unix.EWOULDBLOCK) || errors.Is(err, ErrInUse) {
		t.Fatalf("a start on a device another program locks: %v, want EWOULDBLOCK, not ErrInUse", err)
	}
	want := fmt.Sprintf("block device disk0 (%s) is locked by another program (pid %d, this process), with a shared lock", disk, os.Getpid())
	if !strings.Contains(err.Error(), want) {
		t.Errorf("the refusal %q does not say %q", err, want)
	}
	if b, err := os.ReadFile(disk); err != nil || !bytes.Equal(b, secret) {
		t.Fatalf("the device's bytes changed by the refused start (%v)", err)
	}

	f.Close()
	start(t, cfg)
	b, err := os.ReadFile(filepath.Join(dir, lockFile))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("%s: %q (%v), want this process's PID", lockFile, b, err)
	}
}
