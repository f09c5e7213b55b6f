package nbd

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// smallTmpfsFile creates a sparse size-byte file on a tmpfs of fsSize
// bytes and opens it. The tmpfs is mounted in a mount namespace of a
// thread of its own, which ends with it (never unlocked), so that nothing
// is left mounted on the host even if the test dies; the open file keeps
// the tmpfs. It needs root (or CAP_SYS_ADMIN).
func smallTmpfsFile(t *testing.T, fsSize, size int64) *os.File {
	t.Helper()
	dir := t.TempDir() // the mount point, in the thread's namespace only
	type opened struct {
		f   *os.File
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		runtime.LockOSThread()
		f, err := func() (*os.File, error) {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return nil, fmt.Errorf("unshare: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return nil, fmt.Errorf("make the mounts private: %w", err)
			}
			if err := unix.Mount("rialto-nbd-test", dir, "tmpfs", 0, fmt.Sprintf("size=%d", fsSize)); err != nil {
				return nil, fmt.Errorf("mount a tmpfs: %w", err)
			}
			f, err := os.OpenFile(filepath.Join(dir, "disk.img"), os.O_RDWR|os.O_CREATE, 0o600)
			if err != nil {
				return nil, err
			}
			if err := f.Truncate(size); err != nil {
				f.Close()
				return nil, err
			}
			return f, nil
		}()
		ch <- opened{f, err}
	}()
	o := <-ch
	if o.err != nil {
		t.Skipf("no tmpfs of the test's own: %v", o.err)
	}
	return o.f
}

// TestMappedWriteFullTmpfs: a large write to a sparse file on a tmpfs that
// runs out of space while the payload is read into the file's mapping
// (the store into a page the tmpfs cannot allocate faults: EFAULT from
// read(2), a fault in crypto/tls's copy) is answered ENOSPC, as a pwrite
// or splice of it is, and the connection serves on. It was closed, with
// no reply: a client retrying the write on a new connection had it closed
// again.
func TestMappedWriteFullTmpfs(t *testing.T) {
	for _, tr := range mappedTransports {
		t.Run(tr.name, func(t *testing.T) {
			f := smallTmpfsFile(t, 1<<20, 8<<20)
			b, err := NewFileBackend(f, FileOptions{})
			if err != nil {
				f.Close()
				t.Fatal(err)
			}
			defer b.Close()
			if b.mm == nil || !b.mm.writable {
				t.Skip("the tmpfs file is not mapped writable")
			}
			addr, opts := serveExport(t, tr.tls, Export{Name: testName, Backend: b})
			c := dial(t, addr, testName, opts...)
			small := make([]byte, 256<<10)
			rand.Read(small)
			m0 := mappedWrites.Load()
			if _, err := c.WriteAt(small, 4<<20); err != nil {
				t.Fatal(err)
			}
			if mappedWrites.Load() == m0 {
				t.Fatal("the write was not read into the mapping")
			}
			var ne *Error
			if _, err := c.WriteAt(make([]byte, 2<<20), 0); !errors.As(err, &ne) || ne.Errno != ENOSPC {
				t.Fatalf("a write beyond the tmpfs's space: %v, want ENOSPC", err)
			}
			got := make([]byte, len(small))
			if _, err := c.ReadAt(got, 4<<20); err != nil || !bytes.Equal(got, small) {
				t.Fatalf("the connection after the refused write: %v", err)
			}
			// Space freed, the next write lands (through the mapping).
			if err := c.Trim(0, 2<<20); err != nil {
				t.Fatal(err)
			}
			rand.Read(small)
			if _, err := c.WriteAt(small, 1<<20); err != nil {
				t.Fatal(err)
			}
			if _, err := c.ReadAt(got, 1<<20); err != nil || !bytes.Equal(got, small) {
				t.Fatalf("read back: %v", err)
			}
		})
	}
}
