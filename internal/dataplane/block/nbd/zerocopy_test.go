package nbd

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/internal/loopdevtest"
)

// serveUnix serves s on a Unix socket until the test ends and returns its
// path.
func serveUnix(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "nbd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	return serveLn(t, s, ln)
}

// needZeroCopy skips a test of the zero-copy (sendfile) read path where
// b's reads are all copied: a file on a filesystem not known to punch holes
// (FileBackend.ZeroCopyRange). It closes b before skipping.
func needZeroCopy(t *testing.T, b *FileBackend) {
	t.Helper()
	if _, n := b.ZeroCopyRange(); n == 0 {
		var sfs unix.Statfs_t
		unix.Fstatfs(b.fd, &sfs)
		b.Close()
		t.Skipf("reads are copied on this file's filesystem (%#x, not known to punch holes): no sendfile to test", sfs.Type)
	}
}

// stalledRead sends a read of [off, off+n) and waits, without reading,
// until its whole reply (simple, n bytes of data) is queued in this side's
// socket; then it calls rewrite, and returns the reply's data as read
// afterwards. Bytes a server sent zero-copy still reference its page cache
// in the socket (this side's receive queue), so they show what rewrite
// wrote in place; bytes it copied show what the backend held.
func (rc *rawConn) stalledRead(off, n int64, rewrite func()) []byte {
	rc.t.Helper()
	rc.request(Request{Type: CmdRead, Handle: uint64(off), Offset: uint64(off), Length: uint32(n)}, nil)
	want := simpleReplyLen + int(n)
	sc, err := rc.c.(syscall.Conn).SyscallConn()
	if err != nil {
		rc.t.Fatal(err)
	}
	var qerr error
	// Each wake-up is the arrival of more of the reply (or the deadline).
	err = sc.Read(func(fd uintptr) bool {
		q, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		if err != nil {
			qerr = err
			return true
		}
		return q >= want
	})
	if err == nil {
		err = qerr
	}
	if err != nil {
		rc.t.Fatalf("waiting for the reply: %v", err)
	}
	if rc.r.Buffered() != 0 {
		rc.t.Fatal("reply read before the rewrite")
	}
	rewrite()
	rr, err := rc.reply(int(n))
	if err != nil || rr.errno != 0 || rr.handle != uint64(off) {
		rc.t.Fatalf("read [%d,+%d): %v (errno %d, handle %d)", off, n, err, rr.errno, rr.handle)
	}
	return rr.data
}

// pwriteAt writes p at off of the file or device at path, in place (the
// page-cache pages already holding those bytes are overwritten).
func pwriteAt(t *testing.T, path string, p []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(p, off); err != nil {
		t.Fatal(err)
	}
}

// TestZeroCopyReadsOnlyOfWholeWipeSafePages: a client on the same host
// that stops reading its socket keeps a zero-copy (sendfile) reply as
// references to the page cache. When the lease ends, the wipe drops the
// range's whole pages from the page cache on a file whose holes can be
// punched or on a block device, so the stalled socket keeps the old
// tenant's own bytes. But a page only partly inside the partition (its
// last, where its length ends mid-page; its first, where its offset is not
// page aligned) is zeroed in place by a punched hole and written in place
// by the next tenant, and so is every page where the wipe writes zeroes (a
// filesystem without hole punching: forced here with CopyReads). Reads of
// those pages must be copied: the bytes the client later reads are the
// ones the backend held when it answered, however the pages are rewritten
// in place meanwhile. The first case shows that a rewrite in place does
// reach a stalled zero-copy reply (the hazard, and the fast path kept).
func TestZeroCopyReadsOnlyOfWholeWipeSafePages(t *testing.T) {
	const (
		pg      = 4096
		readLen = 64 << 10 // sendfileMin: the smallest read sent zero-copy
	)
	if unix.Getpagesize() != pg {
		t.Skipf("page size %d, the cases assume %d", unix.Getpagesize(), pg)
	}
	u := ZeroCopyAlign() // the largest folio: a partition's edges cut none
	fileSize := 4 * u
	type tc struct {
		name     string
		opts     FileOptions
		readOff  int64 // in the partition
		rewrite  int64 // file offset of the bytes rewritten in place
		rlen     int64
		zeroCopy bool // whether the reply is expected to be sent zero-copy
	}
	cases := []tc{
		{"whole spans", FileOptions{Offset: u, Length: u},
			64 << 10, u + 128<<10, 8192, true},
		{"partial last page", FileOptions{Offset: u, Length: u + 1024},
			u + 1024 - readLen, 2 * u, 1024, false},
		{"partial first page", FileOptions{Offset: u + 3072, Length: u},
			0, u + 3072, 1024, false},
		// Whole pages, but of the large folio the partition's start may
		// cut: a punched hole over the partition zeroes and keeps it.
		{"whole pages of a cut folio", FileOptions{Offset: u + 64<<10, Length: 2 * u},
			0, u + 64<<10, 8192, u == pg},
		{"copy forced (no hole punching)", FileOptions{Offset: u, Length: u, CopyReads: true},
			64 << 10, u + 128<<10, 8192, false},
	}
	targets := []struct {
		name string
		path func(t *testing.T) string
		// zeroCopy: whether whole pages are sent zero-copy. A block
		// device's reads are copied (sendfile serves regular files).
		zeroCopy bool
	}{
		{"tmpfs file", func(t *testing.T) string { return shmFile(t, fileSize) }, true},
		{"block device", func(t *testing.T) string {
			return loopdevtest.Attach(t, filledFile(t, int(fileSize), 0))
		}, false},
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			path := tg.path(t)
			old := bytes.Repeat([]byte("old tenant "), int(fileSize)/11+1)[:fileSize]
			pwriteAt(t, path, old, 0)
			for _, c := range cases {
				c.zeroCopy = c.zeroCopy && tg.zeroCopy
				t.Run(c.name, func(t *testing.T) {
					b, err := OpenFile(path, c.opts)
					if err != nil {
						t.Fatal(err)
					}
					defer b.Close()
					s := &Server{}
					if err := s.AddExport(Export{Name: testName, Backend: b}); err != nil {
						t.Fatal(err)
					}
					rc := rawDialNet(t, "unix", serveUnix(t, s), clientFlagFixedNewstyle|clientFlagNoZeroes)
					rc.goTransmission(testName, false, false)

					next := bytes.Repeat([]byte("NEXT-TENANT!"), int(c.rlen)/12+1)[:c.rlen]
					got := rc.stalledRead(c.readOff, readLen, func() { pwriteAt(t, path, next, c.rewrite) })
					// Restore the old bytes for the next case.
					defer pwriteAt(t, path, old[c.rewrite:c.rewrite+c.rlen], c.rewrite)

					at := c.rewrite - c.opts.Offset - c.readOff
					want := old[c.opts.Offset+c.readOff:][:readLen]
					if c.zeroCopy {
						want = bytes.Clone(want)
						copy(want[at:], next)
					}
					if !bytes.Equal(got, want) {
						switch {
						case c.zeroCopy && bytes.Equal(got[at:at+c.rlen], old[c.rewrite:c.rewrite+c.rlen]):
							t.Fatal("a read of whole pages was not sent zero-copy (its bytes were copied)")
						case !c.zeroCopy && bytes.Equal(got[at:at+c.rlen], next):
							t.Fatal("the stalled reply carries the bytes written in place after it was sent: sent zero-copy")
						default:
							t.Fatal("the reply differs from the partition's bytes")
						}
					}
				})
			}
		})
	}
}

// TestWipeDropsPages classifies real files: tmpfs and block devices are
// zero-copy safe, a device that is neither a regular file nor a block
// device and a regular file on a filesystem not known to punch holes
// (procfs) are not; a file on the test's temporary directory is reported.
func TestWipeDropsPages(t *testing.T) {
	classify := func(t *testing.T, path string) bool {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		return wipeDropsPages(int(f.Fd()), &st)
	}
	t.Run("tmpfs", func(t *testing.T) {
		if !classify(t, shmFile(t, 1<<20)) {
			t.Error("a tmpfs file classified as not dropping wiped pages")
		}
	})
	t.Run("block device", func(t *testing.T) {
		if !classify(t, loopdevtest.Attach(t, filledFile(t, 1<<20, 0))) {
			t.Error("a block device classified as not dropping wiped pages")
		}
	})
	t.Run("character device", func(t *testing.T) {
		if classify(t, os.DevNull) {
			t.Error("/dev/null classified as dropping wiped pages")
		}
	})
	t.Run("procfs", func(t *testing.T) {
		if classify(t, "/proc/self/status") {
			t.Error("a procfs file classified as dropping wiped pages")
		}
	})
	t.Run("temporary directory", func(t *testing.T) {
		p := filledFile(t, 1<<20, 1)
		var sfs unix.Statfs_t
		if err := unix.Statfs(p, &sfs); err != nil {
			t.Fatal(err)
		}
		t.Logf("filesystem %#x: zero-copy reads %v", sfs.Type, classify(t, p))
	})
}

// TestZeroCopyRange: the zero-copy range is the partition's whole spans of
// ZeroCopyAlign on tmpfs, and empty with CopyReads, with no whole page, or on a block device
// (whose reads are all copied).
func TestZeroCopyRange(t *testing.T) {
	pg, u := int64(unix.Getpagesize()), ZeroCopyAlign()
	type rangeCase struct {
		o              FileOptions
		wantOff, wantN int64
	}
	cases := []rangeCase{
		{FileOptions{Offset: 0, Length: 4 * u}, 0, 4 * u},
		{FileOptions{Offset: u, Length: 2*u + 512}, 0, 2 * u},
		{FileOptions{Offset: u + 512, Length: 2 * u}, u - 512, u},
		{FileOptions{Offset: u + 512, Length: 2*u - 512}, u - 512, u},
		{FileOptions{Offset: 512, Length: u}, 0, 0},
		{FileOptions{Offset: u, Length: u, CopyReads: true}, 0, 0},
	}
	if u > pg {
		// Whole pages inside one folio span: none of it.
		cases = append(cases, rangeCase{FileOptions{Offset: pg, Length: 8 * pg}, 0, 0})
	}
	for _, tg := range []struct {
		name   string
		path   func(t *testing.T) string
		copies bool // every read copied
	}{
		{"tmpfs file", func(t *testing.T) string { return shmFile(t, 4*u) }, false},
		{"block device", func(t *testing.T) string { return loopdevtest.Attach(t, filledFile(t, int(4*u), 0)) }, true},
	} {
		t.Run(tg.name, func(t *testing.T) {
			path := tg.path(t)
			for _, c := range cases {
				b, err := OpenFile(path, c.o)
				if err != nil {
					t.Fatal(err)
				}
				if tg.copies {
					c.wantOff, c.wantN = 0, 0
				}
				if off, n := b.ZeroCopyRange(); off != c.wantOff || n != c.wantN {
					t.Errorf("%+v: zero-copy range [%d,+%d), want [%d,+%d)", c.o, off, n, c.wantOff, c.wantN)
				}
				b.Close()
			}
		})
	}
}
