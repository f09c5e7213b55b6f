package nbd

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shmFile creates a size-byte file on a tmpfs (/dev/shm), where FileBackend
// maps the file and serves small reads from the mapping.
func shmFile(t testing.TB, size int64) string {
	t.Helper()
	var sfs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &sfs); err != nil || sfs.Type != unix.TMPFS_MAGIC {
		t.Skip("no tmpfs at /dev/shm")
	}
	dir, err := os.MkdirTemp("/dev/shm", "rialto-nbd-test-")
	if err != nil {
		t.Skip("cannot create a file on /dev/shm:", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "disk.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return p
}

func blocksOf(t testing.TB, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks
}

// TestFileMappedReads serves a partition (not page-aligned) of a tmpfs file:
// concurrent small reads come from the mapping and must see the partition's
// bytes, writes made through the export, and zeroes in holes, without
// faulting pages into the holes.
func TestFileMappedReads(t *testing.T) {
	const (
		size = 8 << 20
		off  = 3<<20 + 1536 // not a multiple of the page size
		plen = 4 << 20
	)
	p := shmFile(t, size)
	whole := make([]byte, size)
	rand.Read(whole[:off+plen/2]) // second half of the partition stays a hole
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(whole[:off+plen/2], 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	b, err := OpenFile(p, FileOptions{Offset: off, Length: plen})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.mm == nil {
		t.Fatal("tmpfs file not mapped")
	}
	blocks := blocksOf(t, p)
	_, addr := startServer(t, Export{Name: testName, Backend: b})
	part := whole[off : off+plen]

	check := func(c *Client, what string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan string, 64)
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := 0; i < 64; i++ {
					o := int64((g*64+i)*4096*2) % plen
					n := int64(512 * (1 + (g+i)%16))
					got := make([]byte, n)
					if _, err := c.ReadAt(got, o); err != nil {
						errs <- err.Error()
						return
					}
					if !bytes.Equal(got, part[o:o+n]) {
						errs <- "wrong bytes"
						return
					}
				}
			}(g)
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatalf("%s: %s", what, e)
		}
	}
	for _, structured := range []bool{true, false} {
		var opts []DialOption
		if !structured {
			opts = append(opts, WithoutStructuredReplies())
		}
		check(dial(t, addr, testName, opts...), "initial data")
	}
	if got := blocksOf(t, p); got != blocks {
		t.Fatalf("reading holes allocated tmpfs pages: %d blocks, was %d", got, blocks)
	}

	// Writes, zeroing and trimming are seen by later mapped reads.
	c := dial(t, addr, testName)
	w := make([]byte, 64<<10)
	rand.Read(w)
	for _, o := range []int64{4096, plen/2 + 8192} {
		if _, err := c.WriteAt(w, o); err != nil {
			t.Fatal(err)
		}
		copy(part[o:], w)
	}
	if err := c.WriteZeroes(1<<20, 128<<10, true); err != nil {
		t.Fatal(err)
	}
	clear(part[1<<20 : 1<<20+128<<10])
	if err := c.Trim(2<<20, 64<<10); err != nil {
		t.Fatal(err)
	}
	clear(part[2<<20 : 2<<20+64<<10])
	check(c, "after writes")
}

// TestFileMapRefs checks that closing the backend while a mapped range is
// still being sent leaves the mapping in place until it is released.
func TestFileMapRefs(t *testing.T) {
	p := shmFile(t, 1<<20)
	b, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteAt(bytes.Repeat([]byte{7}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	m, ok := b.mapRange(0, 4096)
	if !ok {
		t.Fatal("written range not mapped")
	}
	if _, ok := b.mapRange(8192, 4096); ok {
		t.Fatal("a never-written range was served from the mapping")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.mapRange(0, 4096); ok {
		t.Fatal("mapRange succeeded after Close")
	}
	// Still mapped: the kernel can copy from it.
	var pr [2]int
	if err := unix.Pipe(pr[:]); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pr[0])
	defer unix.Close(pr[1])
	if n, err := unix.Write(pr[1], m); err != nil || n != len(m) {
		t.Fatalf("write from the mapping after Close: %d, %v", n, err)
	}
	got := make([]byte, 4096)
	if _, err := unix.Read(pr[0], got); err != nil || got[0] != 7 || got[4095] != 7 {
		t.Fatalf("mapped bytes wrong: %v", err)
	}
	b.unmapRange()
	vec := make([]byte, 1)
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(b.mm.mem))), 4096, uintptr(unsafe.Pointer(&vec[0])))
	if errno != unix.ENOMEM {
		t.Fatalf("mapping still present after the last release: %v", errno)
	}
}

// TestFileMappedTruncated shrinks a served tmpfs file behind the server's
// back: a mapped read of the vanished range must not crash the server (the
// kernel refuses the copy; the connection ends), and other connections
// keep working.
func TestFileMappedTruncated(t *testing.T) {
	p := shmFile(t, 1<<20)
	b, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.WriteAt(bytes.Repeat([]byte{9}, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	_, addr := startServer(t, Export{Name: testName, Backend: b})
	other := dial(t, addr, testName)
	if err := os.Truncate(p, 64<<10); err != nil {
		t.Fatal(err)
	}
	rc := rawDial(t, addr, 3)
	rc.goTransmission(testName, true, false)
	rc.request(Request{Type: CmdRead, Handle: 1, Offset: 512 << 10, Length: 4096}, nil)
	if rr, err := rc.reply(0); err == nil && rr.errno == 0 {
		t.Fatalf("read of a truncated range succeeded with %d bytes", len(rr.data))
	}
	got := make([]byte, 4096)
	if _, err := other.ReadAt(got, 0); err != nil || got[0] != 9 {
		t.Fatalf("other connection affected: %v", err)
	}
}
