package fusefile_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/block/fusefile"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// needFUSE skips unless this process can mount FUSE file systems.
func needFUSE(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting FUSE needs root here")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
}

// flushCounter is a real file backend that counts its flushes.
type flushCounter struct {
	*nbd.FileBackend
	flushes atomic.Int64
}

func (f *flushCounter) Flush() error {
	f.flushes.Add(1)
	return f.FileBackend.Flush()
}

// served is the time of serve's clock: the times its files carry.
var served = time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.UTC)

// serve mounts a size-byte file-backed device, with a clock at served, and
// returns it, the backing file's path and the mount.
func serve(t *testing.T, size int64) (*flushCounter, string, *fusefile.Mount) {
	t.Helper()
	needFUSE(t)
	img := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	fb, err := nbd.OpenFile(img, nbd.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fb.Close() })
	dev := &flushCounter{FileBackend: fb}
	m, err := fusefile.Serve(dev, fusefile.Config{Dir: t.TempDir(), FsName: "rialto:test", Clock: clock.NewFake(served)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return dev, img, m
}

func TestFileIO(t *testing.T) {
	const size = 8 << 20
	dev, img, m := serve(t, size)
	if filepath.Base(m.Path()) != fusefile.FileName {
		t.Fatalf("path %s", m.Path())
	}
	st, err := os.Stat(m.Path())
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != size || st.Mode().Perm() != 0o600 || !st.Mode().IsRegular() {
		t.Errorf("stat: size %d mode %v", st.Size(), st.Mode())
	}
	// The file and the mount point carry the time of Serve, by its clock
	// (they were the epoch: 1970 in ls -l).
	if !m.Started().Equal(served) {
		t.Errorf("Started %v, want the clock's %v", m.Started(), served)
	}
	for _, p := range []string{m.Path(), filepath.Dir(m.Path())} {
		var sst syscall.Stat_t
		if err := syscall.Stat(p, &sst); err != nil {
			t.Fatal(err)
		}
		for name, ts := range map[string]syscall.Timespec{"atime": sst.Atim, "mtime": sst.Mtim, "ctime": sst.Ctim} {
			if got := time.Unix(ts.Unix()); !got.Equal(served) {
				t.Errorf("%s: %s %v, want the time of Serve %v", p, name, got.UTC(), served)
			}
		}
	}
	f, err := os.OpenFile(m.Path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	// Writes reach the device at their offsets; reads see them.
	want := bytes.Repeat([]byte("rialto fuse "), 100000)[:1<<20+4096]
	if _, err := f.WriteAt(want, 12345); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 12345); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back: %v", err)
	}
	raw, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw[12345:12345+len(want)], want) {
		t.Error("the backing file does not hold what was written")
	}
	// fsync is the device's Flush.
	before := dev.flushes.Load()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if dev.flushes.Load() == before {
		t.Error("fsync did not flush the device")
	}

	// The end of the device: a straddling write is short, one past it
	// fails with ENOSPC, a read there sees EOF.
	if n, err := syscall.Pwrite(int(f.Fd()), []byte("0123456789"), size-4); n != 4 || err != nil {
		t.Errorf("write across the end: %d %v", n, err)
	}
	if _, err := f.WriteAt([]byte("x"), size); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("write past the end: %v", err)
	}
	if n, err := f.ReadAt(make([]byte, 10), size-4); n != 4 {
		t.Errorf("read across the end: %d %v", n, err)
	}
	// The file cannot be resized.
	if err := f.Truncate(size / 2); !errors.Is(err, syscall.EPERM) {
		t.Errorf("truncate: %v", err)
	}
	if _, err := os.OpenFile(m.Path(), os.O_RDWR|os.O_TRUNC, 0); !errors.Is(err, syscall.EPERM) {
		t.Errorf("open with O_TRUNC: %v", err)
	}

	// Punching a hole (a loop device's discard) zeroes the range and
	// deallocates it in the backing file; zeroing a range zeroes it.
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 1<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, 12345, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(got, 12345); err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		inZero := i < 100 || (int64(12345+i) >= 1<<20 && int64(12345+i) < 2<<20)
		if inZero && b != 0 || !inZero && b != want[i] {
			t.Fatalf("byte %d (offset %d) is %d after punching and zeroing", i, 12345+i, b)
		}
	}
	bf, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer bf.Close()
	if hole, err := unix.Seek(int(bf.Fd()), 1<<20, unix.SEEK_HOLE); err != nil || hole != 1<<20 {
		t.Errorf("no hole in the backing file where one was punched: %d %v", hole, err)
	}
	if data, err := unix.Seek(int(bf.Fd()), 12345, unix.SEEK_DATA); err != nil || data != 12345 {
		t.Errorf("ZERO_RANGE deallocated the range: next data at %d (%v)", data, err)
	}
	// Growing the file is refused.
	if err := unix.Fallocate(int(f.Fd()), 0, size-10, 100); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("fallocate beyond the end: %v", err)
	}
}

// TestLoopMountedExt4 puts ext4 on the file through a loop device, as
// `rialto attach --fuse` users do, and finds its files after a remount.
func TestLoopMountedExt4(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4")
	}
	_, _, m := serve(t, 64<<20)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", m.Path()).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	mnt := t.TempDir()
	mount := func() {
		t.Helper()
		if out, err := exec.Command("mount", "-o", "loop", m.Path(), mnt).CombinedOutput(); err != nil {
			t.Fatalf("mount: %v: %s", err, out)
		}
	}
	umount := func() {
		t.Helper()
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Fatalf("umount: %v: %s", err, out)
		}
	}
	mount()
	want := bytes.Repeat([]byte("on a lease "), 300000)
	if err := os.WriteFile(filepath.Join(mnt, "f"), want, 0o600); err != nil {
		umount()
		t.Fatal(err)
	}
	umount()
	mount()
	got, err := os.ReadFile(filepath.Join(mnt, "f"))
	umount()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("file after remount: %d bytes, %v", len(got), err)
	}
}

// TestCloseBusy unmounts lazily when the file is still open, without
// hanging, and the mount is gone afterwards.
func TestCloseBusy(t *testing.T) {
	_, _, m := serve(t, 1<<20)
	f, err := os.Open(m.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = m.Close()
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("Close with the file open: %v", err)
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	if strings.Contains(string(mounts), filepath.Dir(m.Path())+" ") {
		t.Errorf("still mounted: %s", mounts)
	}
	if _, err := f.ReadAt(make([]byte, 512), 0); err == nil {
		t.Error("a read on the detached mount succeeded")
	}
}

// TestUnmountBusy refuses to unmount while the file is open and serves on;
// once it is closed, Unmount ends the server.
func TestUnmountBusy(t *testing.T) {
	_, _, m := serve(t, 1<<20)
	f, err := os.OpenFile(m.Path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(); !errors.Is(err, fusefile.ErrBusy) {
		t.Errorf("Unmount with the file open: %v", err)
	}
	if _, err := f.WriteAt([]byte("still served"), 0); err != nil {
		t.Errorf("write after a refused unmount: %v", err)
	}
	f.Close()
	if err := m.Unmount(); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	select {
	case <-m.Done():
	default:
		t.Error("server still running after Unmount")
	}
	if err := m.Close(); err != nil {
		t.Errorf("Close after Unmount: %v", err)
	}
}

// TestUnmountWaitsForALateRelease: a user of the file that lets go just
// after the unmount was first refused (a loop device releases its file
// asynchronously, a moment after `umount MNT` returned) does not make
// Unmount fail: it tries again for a moment.
func TestUnmountWaitsForALateRelease(t *testing.T) {
	_, _, m := serve(t, 1<<20)
	f, err := os.Open(m.Path())
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	fusefile.SetAfterBusy(m, func() {
		if refused++; refused == 1 {
			f.Close()
		}
	})
	if err := m.Unmount(); err != nil {
		t.Fatalf("Unmount once the file was let go: %v", err)
	}
	if refused == 0 {
		t.Fatal("the first unmount was not refused: the test shows nothing")
	}
	<-m.Done()
}

// TestUnmountedOutside closes Done when the mount goes away from outside.
func TestUnmountedOutside(t *testing.T) {
	_, _, m := serve(t, 1<<20)
	if out, err := exec.Command("umount", filepath.Dir(m.Path())).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v: %s", err, out)
	}
	<-m.Done()
	if err := m.Close(); err != nil {
		t.Errorf("Close after an outside unmount: %v", err)
	}
}

func TestServeErrors(t *testing.T) {
	needFUSE(t)
	img := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(img, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	fb, err := nbd.OpenFile(img, nbd.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "precious"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := fusefile.Serve(fb, fusefile.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, tc := range []struct{ dir, want string }{
		{filepath.Join(t.TempDir(), "missing"), "mount point"},
		{img, "not a directory"},
		{full, "not an empty directory"},
		// Another mount's directory: its root holds the file, and it is a
		// mount point.
		{filepath.Dir(m.Path()), "not an empty directory"},
	} {
		if _, err := fusefile.Serve(fb, fusefile.Config{Dir: tc.dir}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Serve at %s: %v; want %q", tc.dir, err, tc.want)
		}
	}
}

// TestUnmountDetachedInUse: a mount detached lazily from outside (`umount
// -l DIR`) while the file is still in use (a loop device on it, an open
// file) is still served; Unmount refuses it as busy rather than report
// that the mount is gone (its caller would close the device under the
// loop device), and Close ends the server.
func TestUnmountDetachedInUse(t *testing.T) {
	_, _, m := serve(t, 1<<20)
	f, err := os.OpenFile(m.Path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Unmount(filepath.Dir(m.Path()), syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(); !errors.Is(err, fusefile.ErrBusy) {
		t.Errorf("Unmount of a detached mount still in use: %v", err)
	}
	if _, err := f.WriteAt([]byte("still served"), 0); err != nil {
		t.Errorf("write after a refused unmount: %v", err)
	}
	if err := m.Close(); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("Close of a detached mount still in use: %v", err)
	}
	if _, err := f.ReadAt(make([]byte, 512), 0); err == nil {
		t.Error("a read after Close succeeded")
	}
}

// TestUnmountWaitsForAClearingLoopDevice: after `umount` of a file system
// loop-mounted on the file, the loop device lets go of the file only once
// its last opener closes it (udev's probe, say), which on a loaded machine
// comes after the busy grace: Unmount waits for a loop device that is going
// away, while a loop device still mounted is refused after the grace.
func TestUnmountWaitsForAClearingLoopDevice(t *testing.T) {
	_, _, m := serve(t, 16<<20)
	const grace = 100 * time.Millisecond
	fusefile.SetBusyGrace(m, grace)
	mnt := loopMounted(t, m)

	// Mounted: refused once the grace is over, not after the loop grace.
	start := time.Now()
	if err := m.Unmount(); !errors.Is(err, fusefile.ErrBusy) {
		t.Fatalf("Unmount with the file loop-mounted: %v, want ErrBusy", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Unmount with the file loop-mounted took %v to refuse (grace %v)", d, grace)
	}

	// Unmounted, the loop device held open by another opener: Unmount
	// waits past the grace until the opener closes it.
	holder := unmountHeld(t, m, mnt)
	var first time.Time
	released := false
	fusefile.SetAfterBusy(m, func() {
		if first.IsZero() {
			first = time.Now()
		}
		if !released && time.Since(first) > 5*grace {
			released = true
			holder.Close()
		}
	})
	if err := m.Unmount(); err != nil {
		t.Fatalf("Unmount with a loop device going away: %v", err)
	}
	if !released {
		t.Fatal("the first unmount was not refused: the test shows nothing")
	}
	<-m.Done()
}

// TestUnmountWaitsForALazilyDetachedMountPastTheGrace: a mount detached
// lazily (`umount -l`) while Unmount waits, past the busy grace, for a
// loop device going away is waited for until its last user lets go, as
// the loop device was. Unmount then waited on the grace already over, and
// refused at once.
func TestUnmountWaitsForALazilyDetachedMountPastTheGrace(t *testing.T) {
	_, _, m := serve(t, 16<<20)
	const grace = 100 * time.Millisecond
	fusefile.SetBusyGrace(m, grace)
	// No wait between tries: the next looks at the mount at once, before
	// the last user's release has ended the server.
	fusefile.SetBusyWait(m, time.Microsecond)
	holder := unmountHeld(t, m, loopMounted(t, m))
	var first time.Time
	detached := false
	fusefile.SetAfterBusy(m, func() {
		if first.IsZero() {
			first = time.Now()
		}
		if !detached && time.Since(first) > 3*grace {
			detached = true
			if out, err := exec.Command("umount", "-l", filepath.Dir(m.Path())).CombinedOutput(); err != nil {
				t.Errorf("umount -l: %v: %s", err, out)
			}
			holder.Close()
		}
	})
	if err := m.Unmount(); err != nil {
		t.Fatalf("Unmount of a mount detached lazily while a loop device went away: %v", err)
	}
	if !detached {
		t.Fatal("the unmount was not refused past the grace: the test shows nothing")
	}
	<-m.Done()
}

// loopMounted puts ext4 on m's file and mounts it through a loop device
// (`mount -o loop`: one that clears itself on its last close) at a new
// directory, which it returns.
func loopMounted(t *testing.T, m *fusefile.Mount) string {
	t.Helper()
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4")
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", m.Path()).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	mnt := t.TempDir()
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() }) // after a failure midway
	if out, err := exec.Command("mount", "-o", "loop", m.Path(), mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -o loop: %v: %s", err, out)
	}
	return mnt
}

// unmountHeld opens the loop device of mnt, a loopMounted directory, and
// unmounts mnt: the loop device is going away, held back by the file
// returned (as by udev's probe) until it is closed.
func unmountHeld(t *testing.T, m *fusefile.Mount, mnt string) *os.File {
	t.Helper()
	holder, err := os.Open(loopOn(t, m.Path()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v: %s", err, out)
	}
	return holder
}

// loopOn is the loop device whose backing file is path.
func loopOn(t *testing.T, path string) string {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == path {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		}
	}
	t.Fatalf("no loop device on %s", path)
	return ""
}

// TestUnmountWaitsForAClearingLoopDevicePastAWait: the busy grace usually
// ends while Unmount waits between two tries, not while it tries (the
// grace is 2s, a try a fraction of a second): a loop device going away is
// waited for then too. Unmount looked for one only when the grace had
// ended during a try, and otherwise refused at the grace's end.
func TestUnmountWaitsForAClearingLoopDevicePastAWait(t *testing.T) {
	_, _, m := serve(t, 16<<20)
	// The grace outlasts the first try (a busy try takes some 0.3s: the
	// FUSE library tries fusermount 5 times), and ends during the wait
	// after it.
	const grace = 1500 * time.Millisecond
	fusefile.SetBusyGrace(m, grace)
	fusefile.SetBusyWait(m, 2*grace)
	holder := unmountHeld(t, m, loopMounted(t, m))
	start := time.Now()
	var firstBusy time.Duration
	tries := 0
	fusefile.SetAfterBusy(m, func() {
		tries++
		if tries == 1 {
			firstBusy = time.Since(start)
		}
		if tries == 2 { // past the grace: the loop device lets go now
			holder.Close()
		}
	})
	err := m.Unmount()
	if firstBusy >= grace {
		t.Skipf("the first try took %v, past the %v grace: the test shows nothing", firstBusy, grace)
	}
	if err != nil {
		t.Fatalf("Unmount with a loop device going away (%d tries refused as busy): %v", tries, err)
	}
	<-m.Done()
}
