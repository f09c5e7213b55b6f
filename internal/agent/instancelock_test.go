package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/loopdevtest"
	"github.com/rialto-project/rialto/internal/sharertest"
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

// TestLocksLetGoWhileAChildSharesThem: an agent's locks (its state
// directory's, its block device file's) are let go when it stops, though
// a child process shares their open file descriptions: an agent started
// right after on the same state directory and device starts. Closing the
// descriptors left the locks with the child until its exec, and the next
// agent of the process (a restart in the test cluster) was refused as if
// another agent ran.
func TestLocksLetGoWhileAChildSharesThem(t *testing.T) {
	_, srv := newFakeCP(t)
	cfg := testConfig(srv.URL, t.TempDir())
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var held instanceLocks
	if err := first.lockStateDir(&held); err != nil {
		t.Fatal(err)
	}
	if _, err := first.lockBlockDevices(ctxFor(t), &held); err != nil {
		held.release()
		t.Fatal(err)
	}
	sharertest.Share(t, held.files...)
	held.release()
	start(t, cfg)
}

// recorder is a slog handler that sends each record's message on msgs
// while there is room.
type recorder struct{ msgs chan string }

func (r recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r recorder) WithGroup(string) slog.Handler            { return r }
func (r recorder) Handle(_ context.Context, rec slog.Record) error {
	select {
	case r.msgs <- rec.Message:
	default:
	}
	return nil
}

// TestClaimWaitsForAChildsCopy: a block device whose O_EXCL claim the
// agent that held it before let go, but a child process of that agent's
// process still shares until its exec, is claimed once the child lets
// go, within claimSettle: the claim is tried again while nothing (no
// mount, no holder in sysfs) explains it. The agent was refused at once,
// the device "in use by another process".
func TestClaimWaitsForAChildsCopy(t *testing.T) {
	backing := filepath.Join(t.TempDir(), "backing.img")
	if err := os.WriteFile(backing, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	dev := loopdevtest.Attach(t, backing)
	x, err := claimOnce(dev)
	if err != nil {
		t.Fatal(err)
	}
	end := sharertest.Share(t, x)
	x.Close()

	_, srv := newFakeCP(t)
	cfg := testConfig(srv.URL, t.TempDir())
	cfg.Devices = []DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: dev}}
	log := recorder{msgs: make(chan string, 16)}
	cfg.Logger = slog.New(log)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var l instanceLocks
	defer l.release()
	done := make(chan error, 1)
	go func() {
		_, err := a.lockBlockDevices(ctxFor(t), &l)
		done <- err
	}()
	for tried := false; !tried; {
		select {
		case m := <-log.msgs:
			tried = strings.HasPrefix(m, "block device claimed by another, for now")
		case err := <-done:
			t.Fatalf("the claim a child shares for now: %v, want it tried again", err)
		}
	}
	end()
	if err := within(t, done, "the claim not taken once the child let go"); err != nil {
		t.Fatalf("the claim once the child let go: %v", err)
	}
}
