package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestAttachFUSE serves a composed lease as a file with `rialto attach
// --fuse`: bytes written to the file are on the lease's parts in the
// lease's layout, ext4 on it through a loop device keeps its files across
// a remount, and detach unmounts.
func TestAttachFUSE(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting FUSE and loop devices needs root here")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	c := testcluster.Start(t, testcluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 3, Size: 48 << 20, StripeUnit: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	runtime, dir := t.TempDir(), t.TempDir()

	// Refused: flags that belong to the NBD export, and a missing mount point.
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"attach", l.ID, "--fuse", dir, "--write-back"}, 2, "--write-back"},
		{[]string{"attach", l.ID, "--fuse", dir, "--socket", filepath.Join(dir, "s")}, 2, "--socket"},
		{[]string{"attach", l.ID, "--fuse", filepath.Join(dir, "missing")}, 1, "mount point"},
	} {
		if _, errs, code := runIn(t, c, runtime, tc.args...); code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}

	path, done := attached(t, c, runtime, l.ID, "--fuse", dir)
	if path != filepath.Join(dir, "disk") {
		t.Fatalf("attach printed %q", path)
	}
	st, err := os.Stat(path)
	if err != nil || st.Size() != l.Size {
		t.Fatalf("stat %s: %v %v", path, st, err)
	}
	// The file's times are the attach's start (they were the epoch).
	as, err := readAttachState(filepath.Join(runtime, "rialto", l.ID+".json"))
	if err != nil {
		t.Fatal(err)
	}
	sst := st.Sys().(*syscall.Stat_t)
	for name, ts := range map[string]syscall.Timespec{"atime": sst.Atim, "mtime": sst.Mtim, "ctime": sst.Ctim} {
		if got := time.Unix(ts.Unix()); !got.Equal(as.Started) || time.Since(got) > time.Minute {
			t.Errorf("%s: %s %v, want the attach's start %v", path, name, got.UTC(), as.Started)
		}
	}
	// A second attach of the same lease is refused while the first runs.
	if _, errs, code := runIn(t, c, runtime, "attach", l.ID); code != 1 || !strings.Contains(errs, "already attached at "+path) {
		t.Errorf("second attach: exit %d, %s", code, errs)
	}

	// Bytes written to the file are the lease's, in its layout.
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(want, 3<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var uris []string
	for _, p := range l.Parts {
		uris = append(uris, p.URI)
	}
	vol, err := stripe.Open(ctx, stripe.OpenConfig{URIs: uris, StripeUnit: l.StripeUnit})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	_, err = vol.ReadAt(got, 3<<20)
	vol.Close()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the lease's parts do not hold what the file was given: %v", err)
	}

	// ext4 on the file through a loop device.
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", path).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	mnt := t.TempDir()
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() }) // after a failure midway
	sh := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	sh("mount", "-o", "loop", path, mnt)
	content := bytes.Repeat([]byte("a file on a composed lease\n"), 40000)
	err = os.WriteFile(filepath.Join(mnt, "f"), content, 0o600)
	sh("umount", mnt)
	if err != nil {
		t.Fatal(err)
	}
	sh("mount", "-o", "loop", path, mnt)
	back, err := os.ReadFile(filepath.Join(mnt, "f"))
	sh("umount", mnt)
	if err != nil || !bytes.Equal(back, content) {
		t.Fatalf("file after remount: %d bytes, %v", len(back), err)
	}

	// Detach refuses while the loop device is on the file, and the
	// attachment serves on.
	sh("mount", "-o", "loop", path, mnt)
	if _, errs, code := runIn(t, c, runtime, "detach", l.ID); code != 1 || !strings.Contains(errs, "in use") {
		t.Errorf("detach while loop-mounted: exit %d: %s", code, errs)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || !bytes.Equal(b, content) {
		t.Errorf("file after a refused detach: %v", err)
	}
	sh("umount", mnt)
	if _, errs, code := runIn(t, c, runtime, "detach", l.ID); code != 0 {
		t.Fatalf("detach: exit %d: %s", code, errs)
	}
	if code := awaitExit(t, done, "detach returned"); code != 0 {
		t.Errorf("attach exited %d", code)
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	if strings.Contains(string(mounts), " "+dir+" ") {
		t.Errorf("%s still mounted after detach", dir)
	}

	// Unmounted from outside: attach ends and says why.
	var out, errb logtest.Buffer
	done2 := make(chan int, 1)
	go func() {
		done2 <- run(ctx, []string{"attach", l.ID, "--fuse", dir}, clusterEnv(c, runtime, &out, &errb))
	}()
	testcluster.Eventually(t, 30*time.Second, "attach prints its file", func() bool {
		return strings.Contains(out.String(), "\n")
	})
	sh("umount", dir)
	if code := awaitExit(t, done2, "its mount was unmounted"); code != 1 || !strings.Contains(errb.String(), "was unmounted") {
		t.Errorf("attach after an outside unmount: exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(runtime, "rialto", l.ID+".json")); !os.IsNotExist(err) {
		t.Errorf("attach state left behind: %v", err)
	}
}
